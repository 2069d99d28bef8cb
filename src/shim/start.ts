/**
 * `containerd-shim-kata-ts-v2 ... start`: run by containerd (and by CRI-O's `runtime_type = "vm"`)
 * in a task's bundle, once for every task, the pod's sandbox and each of its containers. It
 * answers with the address of the ttrpc server that serves the task: one server per pod, so
 *
 * - for a pod's **sandbox** (or a task with no pod annotations, a pod of its own) it starts the
 *   pod's `serve` process, detached in a session of its own so that it outlives this one and
 *   containerd's restarts, and waits until it answers on its socket;
 * - for a **container** of a pod it finds the pod's socket (from the sandbox id its annotations
 *   name) and checks that it answers.
 *
 * Either way it writes the plain `unix://` address to `<bundle>/address` (CRI-O and containerd
 * read it when they reconnect after a restart) and prints exactly that on stdout. containerd reads
 * stdout and stderr together as the address, so nothing else is printed on success; the `serve`
 * process gets neither (its stdin and stdout are /dev/null, its stderr the shim's log): containerd
 * waits for the output to close.
 *
 * A repeated `start` for a sandbox whose shim already answers (containerd retrying) answers with
 * the running shim's address.
 */
import { spawn } from 'node:child_process';
import fs, { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { CALLER_ROOT_CHILD_FD, CALLER_ROOT_ENV, openOwnRoot } from '../common/caller-root.js';
import { errorMessage, timedOut, unavailable } from '../common/errors.js';
import { silentLogger } from '../common/logger.js';
import type { KataConfig } from '../config/types.js';
import { ensureMountNamespace, insideCommand, placeInNamespace } from '../runtime/mount-namespace.js';
import { readBundleConfig, taskRole, writeAddressFile } from './bundle.js';
import { openShimLog } from './log.js';
import { nodeRequest } from './node-client.js';
import { defaultRelayBinary, relayArgs } from './node-relay.js';
import {
  NODE_REVIVE_LOCK_FILE,
  nodeServerPaths,
  podStateDir,
  RELAY_PID_FILE,
  shimSocketPath,
  socketAddress,
  upstreamSocketPath,
  validateId,
  validateNamespace,
} from './paths.js';
import './reasons.js';

/** The command line that runs this shim binary again (for the `serve` child). */
export interface ShimCommand {
  command: string;
  args: string[];
}

export interface StartOptions {
  config: KataConfig;
  namespace: string;
  /** The task's id (`-id`). */
  id: string;
  /** The task's bundle (`-bundle`, else the working directory). */
  bundle: string;
  /** containerd's address (`-address`), part of the socket's name. */
  containerdAddress: string;
  publishBinary: string;
  debug: boolean;
  /** How to run this binary again. */
  self: ShimCommand;
  /** The environment the `serve` child gets (TTRPC_ADDRESS, KATA_TS_CONFIG, ...). */
  env: NodeJS.ProcessEnv;
  /** How long the `serve` child may take to answer on its socket (default 60 s). */
  serveTimeoutMs?: number;
  /** Node mode: the relay binary (default: dist/native/kata-ts-shim-relay of this package). */
  relayBinary?: string;
}

const POLL_MS = 50;

/** True when something accepts a connection on the unix socket within `timeoutMs`. */
export function socketAnswers(socketPath: string, timeoutMs = 1_000): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = net.connect(socketPath);
    const timer = setTimeout(() => {
      sock.destroy();
      resolve(false);
    }, timeoutMs);
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.destroy();
      resolve(true);
    });
    sock.once('error', () => {
      clearTimeout(timer);
      resolve(false);
    });
  });
}

/** The `serve` child's arguments: containerd's flags as they came, the pod's socket, the action last. */
export function serveArgs(options: StartOptions, sandboxId: string, socketPath: string): string[] {
  return [
    ...containerdFlags(options),
    '-id',
    sandboxId,
    '-bundle',
    options.bundle,
    '-socket',
    socketPath,
    ...(options.debug ? ['-debug'] : []),
    'serve',
  ];
}

/** Start (or find) the shim serving the task; returns the address written and to be printed. */
export async function startShim(options: StartOptions): Promise<string> {
  validateNamespace(options.namespace);
  validateId(options.id);
  const bundle = await readBundleConfig(options.bundle);
  const { role, sandboxId } = taskRole(options.id, bundle.annotations);
  const stateRoot = options.config.shim.stateRoot;
  const socketPath = shimSocketPath(stateRoot, options.containerdAddress, options.namespace, sandboxId);
  const address = socketAddress(socketPath);
  if (!(await socketAnswers(socketPath))) {
    if (role === 'container') {
      throw unavailable(
        'SHIM_POD_NOT_SERVING',
        `the shim of sandbox ${sandboxId} does not answer at ${socketPath}; the container cannot join its pod.`,
        { details: { sandboxId, socketPath } },
      );
    }
    const stateDir = podStateDir(stateRoot, options.namespace, sandboxId);
    if (options.config.shim.mode === 'node') await startNodePod(options, sandboxId, socketPath, stateDir);
    else await spawnServe(options, sandboxId, socketPath, stateDir);
  }
  await writeAddressFile(options.bundle, address);
  return address;
}

/**
 * The `serve` child's command line and environment: this binary again, started inside the
 * runtime's mount namespace (created when missing) unless it is off or this process is in it.
 */
async function serveCommand(
  options: StartOptions,
  argv: readonly string[],
  cwd: string,
): Promise<{ command: string; args: string[]; env: NodeJS.ProcessEnv; entering: boolean }> {
  const self = { command: options.self.command, args: [...options.self.args, ...argv] };
  const file = options.config.mountNamespacePath;
  if (file === null || (await placeInNamespace(file, options.env)) === 'inside') {
    // No caller's root to hand over: the child reads the paths it gets as they are.
    const { [CALLER_ROOT_ENV]: _stale, ...env } = options.env;
    return { ...self, env, entering: false };
  }
  // Silent: containerd reads start's stdout and stderr together as the address.
  const { id } = await ensureMountNamespace(file, silentLogger());
  // No setpriv: the pod's shim outlives this `start`.
  const inside = insideCommand(file, id, cwd, self, false);
  // containerd's root goes with it: the paths containerd names are read there (src/common/caller-root.ts).
  const env = { ...options.env, ...inside.env, [CALLER_ROOT_ENV]: String(CALLER_ROOT_CHILD_FD) };
  return { command: inside.command, args: inside.args, env, entering: true };
}

/** Start the detached `serve` child and wait until its socket answers (or it dies, or time runs out). */
async function spawnServe(options: StartOptions, sandboxId: string, socketPath: string, stateDir: string): Promise<void> {
  const log = await openShimLog(options.bundle, stateDir);
  await spawnAndWait(options, serveArgs(options, sandboxId, socketPath), log, socketPath, 'the pod shim');
}

/** Start this binary detached with `argv` (stderr: `log`, closed here) and wait until `socketPath` answers. */
async function spawnAndWait(
  options: StartOptions,
  argv: readonly string[],
  log: { fd: number; path: string },
  socketPath: string,
  what: string,
  cwd = options.bundle,
): Promise<void> {
  const cmd = await serveCommand(options, argv, cwd);
  let child: ReturnType<typeof spawn>;
  const root = cmd.entering ? openOwnRoot() : undefined;
  try {
    child = spawn(cmd.command, cmd.args, {
      cwd,
      env: cmd.env,
      detached: true,
      // The caller's root at CALLER_ROOT_CHILD_FD (3), the first index after stdio.
      stdio: root === undefined ? ['ignore', 'ignore', log.fd] : ['ignore', 'ignore', log.fd, root],
    });
  } finally {
    fs.closeSync(log.fd);
    if (root !== undefined) fs.closeSync(root);
  }
  let exited: string | undefined;
  let spawnError: string | undefined;
  child.once('error', (err) => {
    spawnError = errorMessage(err);
  });
  child.once('exit', (code, signal) => {
    exited = signal === null ? `code ${code}` : `signal ${signal}`;
  });
  child.unref();
  const deadline = Date.now() + (options.serveTimeoutMs ?? 60_000);
  for (;;) {
    if (await socketAnswers(socketPath, 500)) return;
    if (spawnError !== undefined) {
      throw unavailable('SHIM_SERVE_FAILED', `${what} could not be started: ${spawnError}.`);
    }
    if (exited !== undefined) {
      // A second start racing this one may have won the pod: its shim is as good as ours.
      if (await socketAnswers(socketPath)) return;
      throw unavailable('SHIM_SERVE_FAILED', `${what} exited (${exited}) before serving; its log is ${log.path}.`, {
        details: { log: log.path },
      });
    }
    if (Date.now() > deadline) {
      if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
      throw timedOut('SHIM_SERVE_FAILED', `${what} did not answer at ${socketPath} in time; its log is ${log.path}.`, {
        details: { log: log.path },
      });
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

/** The node server's arguments (also the relays' revive command): containerd's flags, `node-serve` last. */
export function nodeServeArgs(options: Pick<StartOptions, 'namespace' | 'containerdAddress' | 'publishBinary' | 'debug'>): string[] {
  return [...containerdFlags(options), ...(options.debug ? ['-debug'] : []), 'node-serve'];
}

/** The flags containerd started this shim with that every child of it carries on. */
function containerdFlags(options: Pick<StartOptions, 'namespace' | 'containerdAddress' | 'publishBinary'>): string[] {
  return ['-namespace', options.namespace, '-address', options.containerdAddress, '-publish-binary', options.publishBinary];
}

/** util-linux flock(1), which serialises the relays' revives when it is installed. */
const FLOCK = '/usr/bin/flock';

/** How many times `start` starts the node server again when the one it found was just leaving. */
const NODE_ATTACH_TRIES = 3;

/**
 * Node mode (docs/shim.md "Shim modes"): make sure the node server of this containerd runs, have
 * it host the pod on the pod's upstream socket, then start the pod's relay on the pod's socket
 * and wait until it answers.
 */
async function startNodePod(options: StartOptions, sandboxId: string, socketPath: string, stateDir: string): Promise<void> {
  const paths = nodeServerPaths(options.config.shim.stateRoot, options.containerdAddress);
  const timeoutMs = options.serveTimeoutMs ?? 60_000;
  const attach = { attach: { namespace: options.namespace, sandboxId, bundle: options.bundle, socketPath } };
  for (let tries = 1; ; tries++) {
    if (!(await socketAnswers(paths.control))) {
      await fsp.mkdir(paths.dir, { recursive: true, mode: 0o700 });
      const fd = fs.openSync(paths.log, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600);
      // Its working directory is no pod's bundle: it outlives them all.
      await spawnAndWait(options, nodeServeArgs(options), { fd, path: paths.log }, paths.control, 'the node shim server', '/');
    }
    try {
      await nodeRequest(paths.control, attach, timeoutMs);
      break;
    } catch (err) {
      // The server found may have been on its way out (no pod for a while): start another.
      if (tries >= NODE_ATTACH_TRIES || (await socketAnswers(paths.control))) throw err;
    }
  }
  try {
    await spawnRelay(options, socketPath, stateDir);
  } catch (err) {
    // Nothing serves the pod for containerd: the node server lets it go (containerd's delete cleans up).
    await nodeRequest(paths.control, { detach: { namespace: options.namespace, sandboxId } }, timeoutMs).catch(() => undefined);
    throw err;
  }
}

/** Start the pod's relay detached (a session of its own, stderr the pod's shim log) and wait until the pod's socket answers. */
async function spawnRelay(options: StartOptions, socketPath: string, stateDir: string): Promise<void> {
  const pidFile = path.join(stateDir, RELAY_PID_FILE);
  // The revive command enters the runtime's mount namespace itself (nsenter), as `start` does,
  // so a revived node server is one process; no caller's root goes with it (the relay holds none).
  const cmd = await serveCommand(options, nodeServeArgs(options), '/');
  // Under flock (-o: the node server itself does not hold it): while one revived server is still
  // starting, the relays' further revives end at once instead of each starting Node only to find
  // the node server's lock taken (on a loaded machine a Node start outlasts the 10 s between revives).
  const nodeDir = nodeServerPaths(options.config.shim.stateRoot, options.containerdAddress).dir;
  await fsp.mkdir(nodeDir, { recursive: true, mode: 0o700 });
  const revive = [
    ...(fs.existsSync(FLOCK) ? [FLOCK, '-n', '-o', '-E', '0', path.join(nodeDir, NODE_REVIVE_LOCK_FILE)] : []),
    cmd.command,
    ...cmd.args,
  ];
  const { [CALLER_ROOT_ENV]: _root, ...env } = cmd.env;
  const log = await openShimLog(options.bundle, stateDir);
  await fsp.mkdir(path.dirname(socketPath), { recursive: true, mode: 0o700 });
  let child: ReturnType<typeof spawn>;
  try {
    child = spawn(options.relayBinary ?? defaultRelayBinary(), relayArgs(socketPath, upstreamSocketPath(stateDir), pidFile, revive), {
      cwd: '/',
      env,
      detached: true,
      stdio: ['ignore', 'ignore', log.fd],
    });
  } finally {
    fs.closeSync(log.fd);
  }
  let failed: string | undefined;
  child.once('error', (err) => {
    failed = errorMessage(err);
  });
  child.once('exit', (code, signal) => {
    failed = signal === null ? `it exited with code ${code}` : `it was killed by ${signal}`;
  });
  child.unref();
  const deadline = Date.now() + (options.serveTimeoutMs ?? 60_000);
  for (;;) {
    if (await socketAnswers(socketPath, 500)) return;
    if (failed !== undefined)
      throw unavailable('SHIM_SERVE_FAILED', `the pod's relay could not be started: ${failed}; its log is ${log.path}.`);
    if (Date.now() > deadline) {
      if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
      throw timedOut('SHIM_SERVE_FAILED', `the pod's relay did not answer at ${socketPath} in time; its log is ${log.path}.`);
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}
