/**
 * The entry of `containerd-shim-kata-ts-v2`, the binary containerd execs for the runtime type
 * `io.containerd.kata-ts.v2` (and CRI-O for a `runtime_type = "vm"` handler).
 *
 * Its command line is containerd's shim convention, parsed as Go's `flag` package parses it
 * (containerd's shims are Go programs, and containerd builds the line for them): single-dash
 * flags (`-id x`, `-id=x`, `--id x` alike), boolean flags without a value (`-debug`, or
 * `-debug=false`), flags end at the first argument that is not one (or after `--`), and that
 * argument is the action:
 *
 *     -namespace NS -address ADDR -publish-binary BIN -id ID [-bundle DIR] [-debug] [-socket PATH] ACTION
 *
 * - `start` (containerd 1.6-2.x, CRI-O): start or find the pod's shim, print its address (start.ts);
 * - `delete`: clean up after a shim that is gone, print a DeleteResponse (delete.ts);
 * - `serve` (ours): the per-pod server `start` runs detached (serve.ts);
 * - `node-serve` (ours, shim.mode "node"): the node shim server hosting every pod of this
 *   containerd (node-server.ts), started by `start` or revived by a pod's relay; no `-id`.
 *
 * `serve` and `delete`'s detached `cleanup` work in the runtime's own mount namespace
 * (`mountNamespacePath`; see src/runtime/mount-namespace.ts): `start` starts `serve` inside it, and
 * either run outside it runs itself again inside (`cleanup` only when the namespace exists: without
 * it nothing of a pod can be mounted anywhere).
 *
 * `-v` prints the version; `-info` prints a containerd.types.RuntimeInfo (protobuf) for the
 * runtime options on stdin (info.ts). The environment: TTRPC_ADDRESS (containerd's ttrpc socket, for events;
 * CRI-O sets it empty: no events are sent),
 * GRPC_ADDRESS and NAMESPACE (containerd 2.x; the flags win), MAX_SHIM_VERSION (2.x: the newest
 * bootstrap format it reads; the plain address we print is read by every version), SCHED_CORE
 * (core scheduling for the shim's processes: not supported here, ignored), KATA_TS_CONFIG (the
 * config file, else /etc/kata-ts/config.json when it exists).
 *
 * A bad command line exits 2 with one sentence naming the flag; a failure exits 1 with one
 * sentence on stderr.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { adoptCallerRoot } from '../common/caller-root.js';
import { errorMessage } from '../common/errors.js';
import { createLogger, type LogLevel } from '../common/logger.js';
import { packageVersion } from '../common/paths.js';
import { DEFAULT_CONFIG_PATH } from '../config/defaults.js';
import { loadConfig } from '../config/load.js';
import type { LoadedConfig } from '../config/types.js';
import { runningRelease, selfScript } from '../release/layout.js';
import { boundNamespace, placeInNamespace, runInsideMountNamespace } from '../runtime/mount-namespace.js';
import type { RegisterServices } from './serve.js';
import type { ShimCommand } from './start.js';
import { configIdentity, loadStampedConfig, recordStartStamp } from './start-stamp.js';

/** The binary's name, as containerd derives it from the runtime type. */
export const SHIM_BINARY_NAME = 'containerd-shim-kata-ts-v2';

const USAGE = `Usage of ${SHIM_BINARY_NAME} (run by containerd or CRI-O; see docs/shim.md):
  ${SHIM_BINARY_NAME} -namespace NS -address ADDR -publish-binary BIN -id ID [-bundle DIR] [-debug] [-socket PATH] start|delete|serve
  ${SHIM_BINARY_NAME} -namespace NS -address ADDR -publish-binary BIN [-debug] node-serve
  ${SHIM_BINARY_NAME} -v
  ${SHIM_BINARY_NAME} -info  (reads runtime options on stdin, prints a RuntimeInfo protobuf)
`;

/** A command-line mistake: exit code 2 and the one sentence. */
export class ShimUsageError extends Error {
  override readonly name = 'ShimUsageError';
}

/** The shim's command line, parsed. Strings are '' when not given. */
export interface ShimArgs {
  namespace: string;
  address: string;
  publishBinary: string;
  id: string;
  bundle: string;
  socket: string;
  /** containerd 2.x's debug socket (Go pprof): accepted, unused. */
  debugSocket: string;
  debug: boolean;
  version: boolean;
  /** containerd 2.x's `-info`: options on stdin, a RuntimeInfo on stdout (info.ts). */
  info: boolean;
  /** `-h` / `-help`: the usage, as Go's flag package prints it (stderr, exit 0). */
  help: boolean;
  /** The first non-flag argument; '' when none. */
  action: string;
}

type FlagKind = 'string' | 'bool';
const FLAGS: Record<string, { kind: FlagKind; key: keyof ShimArgs }> = {
  namespace: { kind: 'string', key: 'namespace' },
  address: { kind: 'string', key: 'address' },
  'publish-binary': { kind: 'string', key: 'publishBinary' },
  id: { kind: 'string', key: 'id' },
  bundle: { kind: 'string', key: 'bundle' },
  socket: { kind: 'string', key: 'socket' },
  'debug-socket': { kind: 'string', key: 'debugSocket' },
  debug: { kind: 'bool', key: 'debug' },
  v: { kind: 'bool', key: 'version' },
  info: { kind: 'bool', key: 'info' },
};

/** The boolean spellings Go's strconv.ParseBool accepts. */
const TRUE = new Set(['1', 't', 'T', 'TRUE', 'true', 'True']);
const FALSE = new Set(['0', 'f', 'F', 'FALSE', 'false', 'False']);

/** Parse the command line as Go's flag package would (see the file's comment); throws ShimUsageError. */
export function parseShimArgs(argv: readonly string[]): ShimArgs {
  const out: ShimArgs = {
    namespace: '',
    address: '',
    publishBinary: '',
    id: '',
    bundle: '',
    socket: '',
    debugSocket: '',
    debug: false,
    version: false,
    info: false,
    help: false,
    action: '',
  };
  let i = 0;
  for (; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg.length < 2 || !arg.startsWith('-')) break;
    if (arg === '--') {
      i++;
      break;
    }
    const body = arg.startsWith('--') ? arg.slice(2) : arg.slice(1);
    if (body === '' || body.startsWith('-') || body.startsWith('=')) throw new ShimUsageError(`bad flag syntax: ${arg}`);
    const eq = body.indexOf('=');
    const name = eq < 0 ? body : body.slice(0, eq);
    const flag = Object.hasOwn(FLAGS, name) ? FLAGS[name] : undefined;
    if (flag === undefined) {
      if (name === 'h' || name === 'help') {
        out.help = true;
        return out;
      }
      throw new ShimUsageError(`flag provided but not defined: -${name}`);
    }
    if (flag.kind === 'bool') {
      let value = true;
      if (eq >= 0) {
        const text = body.slice(eq + 1);
        if (TRUE.has(text)) value = true;
        else if (FALSE.has(text)) value = false;
        else throw new ShimUsageError(`invalid boolean value "${text}" for -${name}`);
      }
      (out[flag.key] as boolean) = value;
      continue;
    }
    let value: string;
    if (eq >= 0) value = body.slice(eq + 1);
    else {
      const next = argv[i + 1];
      if (next === undefined) throw new ShimUsageError(`flag needs an argument: -${name}`);
      value = next;
      i++;
    }
    (out[flag.key] as string) = value;
  }
  out.action = argv[i] ?? '';
  return out;
}

/** What the shim reads from its environment. */
export interface ShimEnv {
  ttrpcAddress: string;
  grpcAddress: string;
  namespace: string;
  /** MAX_SHIM_VERSION (containerd 2.x); null when unset or not a number. */
  maxShimVersion: number | null;
  schedCore: boolean;
  /** KATA_TS_CONFIG; undefined: the default path when it exists, else the defaults. */
  configPath: string | undefined;
}

export function readShimEnv(env: NodeJS.ProcessEnv): ShimEnv {
  const max = Number.parseInt(env.MAX_SHIM_VERSION ?? '', 10);
  return {
    ttrpcAddress: env.TTRPC_ADDRESS ?? '',
    grpcAddress: env.GRPC_ADDRESS ?? '',
    namespace: env.NAMESPACE ?? '',
    maxShimVersion: Number.isInteger(max) ? max : null,
    schedCore: env.SCHED_CORE !== undefined && env.SCHED_CORE !== '',
    configPath: env.KATA_TS_CONFIG === undefined || env.KATA_TS_CONFIG === '' ? undefined : env.KATA_TS_CONFIG,
  };
}

/** An action's inputs: flags, environment and working directory together, checked. */
export interface ShimInvocation {
  action: (typeof ACTIONS)[number];
  namespace: string;
  id: string;
  /** Absolute: `-bundle`, else the working directory. */
  bundle: string;
  containerdAddress: string;
  ttrpcAddress: string;
  publishBinary: string;
  socket: string;
  debug: boolean;
  env: ShimEnv;
}

/** The actions containerd and CRI-O call; `serve` and `cleanup` are this binary's own children. */
const PUBLIC_ACTIONS = ['start', 'delete', 'serve', 'node-serve'] as const;
const ACTIONS = [...PUBLIC_ACTIONS, 'cleanup'] as const;

/** Combine flags, environment and working directory; throws ShimUsageError naming what is missing or wrong. */
export function shimInvocation(args: ShimArgs, env: ShimEnv, cwd: string): ShimInvocation {
  if (args.action === '') throw new ShimUsageError(`an action is required: ${PUBLIC_ACTIONS.join(', ')}`);
  const action = ACTIONS.find((a) => a === args.action);
  if (action === undefined) throw new ShimUsageError(`unknown action "${args.action}"; actions: ${PUBLIC_ACTIONS.join(', ')}`);
  const namespace = args.namespace !== '' ? args.namespace : env.namespace;
  if (namespace === '') throw new ShimUsageError('-namespace is required (or NAMESPACE in the environment)');
  if (args.id === '' && action !== 'node-serve') throw new ShimUsageError('-id is required');
  if (action === 'serve' && args.socket === '') throw new ShimUsageError('-socket is required for serve');
  if (args.socket !== '' && !path.isAbsolute(args.socket))
    throw new ShimUsageError(`-socket must be an absolute path, got "${args.socket}"`);
  return {
    action,
    namespace,
    id: args.id,
    bundle: path.resolve(cwd, args.bundle),
    containerdAddress: args.address !== '' ? args.address : env.grpcAddress,
    ttrpcAddress: env.ttrpcAddress,
    publishBinary: args.publishBinary,
    socket: args.socket,
    debug: args.debug,
    env,
  };
}

/** The version lines `-v` prints, in the layout containerd's shims use. */
export function versionText(): string {
  return `${SHIM_BINARY_NAME}:\n  Version:  ${packageVersion()}\n  Revision: (none)\n  Node version: ${process.version}\n\n`;
}

export interface ShimIo {
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
  stdin: NodeJS.ReadableStream & { isTTY?: boolean };
}

export interface ShimMainOptions {
  io?: ShimIo;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** How to run this binary again for `serve` (default: this process's node, flags and script). */
  self?: ShimCommand;
  /** The services `serve` registers (the Task service); none by default. */
  registerServices?: RegisterServices;
}

/** Runtime options containerd writes to `start`'s stdin; read within bounds, never waited on forever. */
const STDIN_MAX_BYTES = 1024 * 1024;
const STDIN_WAIT_MS = 2_000;

/**
 * containerd writes the runtime's options (a protobuf Any: the CRI runtime's `options` table) to
 * `start`'s stdin and closes it; without options stdin is /dev/null. kata-ts takes its settings
 * from its own config file, so they are read (up to 1 MiB, for at most 2 s: a stdin left open by
 * a caller must not hang the shim) and dropped.
 */
export async function drainStdin(stdin: ShimIo['stdin'], maxBytes = STDIN_MAX_BYTES, waitMs = STDIN_WAIT_MS): Promise<Buffer> {
  if (stdin.isTTY === true) return Buffer.alloc(0);
  const chunks: Buffer[] = [];
  let size = 0;
  await new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      stdin.off('data', onData);
      stdin.off('end', done);
      stdin.off('error', done);
      stdin.pause();
      resolve();
    };
    const onData = (chunk: Buffer | string) => {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      chunks.push(buf.subarray(0, Math.max(0, maxBytes - size)));
      size += buf.length;
      if (size >= maxBytes) done();
    };
    const timer = setTimeout(done, waitMs);
    stdin.on('data', onData);
    stdin.once('end', done);
    stdin.once('error', done);
    stdin.resume();
  });
  if ('destroy' in stdin && typeof stdin.destroy === 'function') (stdin as NodeJS.ReadableStream & { destroy(): void }).destroy();
  return Buffer.concat(chunks);
}

function write(stream: NodeJS.WritableStream, data: string | Uint8Array): Promise<void> {
  return new Promise((resolve, reject) => stream.write(data, (err) => (err ? reject(err) : resolve())));
}

/** The command that runs this binary again: node, its flags, and the script it runs. */
/** How long `delete` waits for its cleanup child before answering containerd (under its 5 s default). */
const DELETE_WAIT_MS = 3_500;
/** Where a detached cleanup writes its warnings, under the shim's state root. */
const CLEANUP_LOG_FILE = 'cleanup.log';

/**
 * This binary again with `cleanup` for `delete`'s arguments, in a session of its own with no
 * stdio of ours; true when it finished within `waitMs`.
 */
async function runDetachedCleanup(self: ShimCommand, argv: readonly string[], env: NodeJS.ProcessEnv, waitMs: number): Promise<boolean> {
  const args = argv.map((a) => (a === 'delete' ? 'cleanup' : a));
  const child = spawn(self.command, [...self.args, ...args], { detached: true, stdio: 'ignore', env });
  child.unref();
  return new Promise((resolve) => {
    // Kept referenced: it alone keeps this process up while the (unreferenced) child works.
    const timer = setTimeout(() => resolve(false), waitMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve(true);
    });
    child.once('error', () => {
      clearTimeout(timer);
      resolve(false);
    });
  });
}

/**
 * This binary again, from the real directory of the code that runs now (its release, see
 * src/release/layout.ts), under the name it was started as: a child (`serve`, `cleanup`) runs
 * the code of the `start` or `delete` that spawned it even when an upgrade moved `current`.
 */
function defaultSelf(): ShimCommand {
  const invoked = process.argv[1] ?? '';
  const script = selfScript(invoked, runningRelease().dir, fs.existsSync) ?? invoked;
  return { command: process.execPath, args: [...process.execArgv, script] };
}

/** `-info`: the RuntimeInfo for the options on stdin (info.ts); bad options exit 1 with one sentence. */
async function runInfo(io: ShimIo): Promise<number> {
  try {
    // Loaded here only: protobuf's code is a good part of what a `start` would load for nothing.
    const { shimInfo } = await import('./info.js');
    await write(io.stdout, shimInfo(await drainStdin(io.stdin)));
    return 0;
  } catch (err) {
    io.stderr.write(`${SHIM_BINARY_NAME} -info: ${errorMessage(err)}\n`);
    return 1;
  }
}

/** The config: as this code tree's last accepting `start` stamped it when the file is unchanged (start-stamp.ts), else loaded and validated. */
async function loadShimConfig(env: ShimEnv): Promise<LoadedConfig> {
  return (await loadStampedConfig(env.configPath)) ?? loadConfig(env.configPath);
}

/** Run one invocation of the shim; resolves with the exit code (0 ok, 1 failure, 2 command-line mistake). */
export async function main(argv: readonly string[], options: ShimMainOptions = {}): Promise<number> {
  const io = options.io ?? { stdout: process.stdout, stderr: process.stderr, stdin: process.stdin };
  const processEnv = options.env ?? process.env;
  let inv: ShimInvocation;
  try {
    const args = parseShimArgs(argv);
    if (args.help) {
      io.stderr.write(USAGE);
      return 0;
    }
    if (args.version) {
      await write(io.stdout, versionText());
      return 0;
    }
    if (args.info) return await runInfo(io);
    inv = shimInvocation(args, readShimEnv(processEnv), options.cwd ?? process.cwd());
  } catch (err) {
    if (!(err instanceof ShimUsageError)) throw err;
    io.stderr.write(`${SHIM_BINARY_NAME}: ${err.message}\n`);
    return 2;
  }
  try {
    // The config file as it was before it was read: a `start` stamps it for the native fast path (start-stamp.ts).
    const configBefore = inv.action === 'start' ? configIdentity(inv.env.configPath ?? DEFAULT_CONFIG_PATH) : undefined;
    const loaded = await loadShimConfig(inv.env);
    const nsFile = loaded.config.mountNamespacePath;
    // `delete` itself stays outside: it only starts the detached cleanup, which enters.
    const entering = inv.action === 'serve' || inv.action === 'node-serve' || inv.action === 'cleanup';
    if (entering && nsFile !== null && (await placeInNamespace(nsFile, processEnv)) === 'outside') {
      if (inv.action !== 'cleanup' || (await boundNamespace(nsFile)) !== undefined) {
        const self = options.self ?? defaultSelf();
        const logger = createLogger({ level: 'warn', destination: { write: (line: string) => io.stderr.write(line) } });
        return await runInsideMountNamespace({
          file: nsFile,
          self: { command: self.command, args: [...self.args, ...argv] },
          cwd: options.cwd ?? process.cwd(),
          env: processEnv,
          stdio: { stdout: io.stdout, stderr: io.stderr },
          logger,
          dieWithParent: inv.action !== 'cleanup',
          // The paths containerd named (the pod's netns, FIFOs) are opened in its namespace (src/common/caller-root.ts).
          passCallerRoot: true,
        });
      }
    }
    switch (inv.action) {
      case 'start': {
        await drainStdin(io.stdin);
        // Each action loads only its own code: containerd runs `start` and `delete` once per
        // task, and the pod's core is big.
        const { startShim } = await import('./start.js');
        const address = await startShim({
          config: loaded.config,
          namespace: inv.namespace,
          id: inv.id,
          bundle: inv.bundle,
          containerdAddress: inv.containerdAddress,
          publishBinary: inv.publishBinary,
          debug: inv.debug,
          self: options.self ?? defaultSelf(),
          env: processEnv,
        });
        await write(io.stdout, address);
        await recordStartStamp(loaded.config.shim.stateRoot, loaded.path, configBefore);
        return 0;
      }
      case 'delete': {
        // containerd gives `delete` a few seconds (io.containerd.timeout.shim.cleanup, 5 s by
        // default) and then kills it: the cleanup runs in a detached child that outlives that, and
        // delete answers once it is done or after DELETE_WAIT_MS, whichever comes first.
        const done = await runDetachedCleanup(options.self ?? defaultSelf(), argv, processEnv, DELETE_WAIT_MS);
        if (!done) io.stderr.write(`${SHIM_BINARY_NAME} delete: the cleanup of ${inv.id} goes on in the background\n`);
        const { EXIT_STATUS_KILLED, encodeDeleteResponse } = await import('./delete-response.js');
        await write(io.stdout, encodeDeleteResponse({ pid: 0, exitStatus: EXIT_STATUS_KILLED, exitedAt: new Date() }));
        return 0;
      }
      case 'cleanup': {
        adoptCallerRoot(processEnv);
        // Warnings only, into the shim's state root (created on the first one): nobody reads this
        // child's stderr, and a pipe it held would keep containerd waiting.
        const file = path.join(loaded.config.shim.stateRoot, CLEANUP_LOG_FILE);
        const level: LogLevel = inv.debug ? 'debug' : 'warn';
        const logger = createLogger({
          level,
          destination: {
            write: (line: string) => {
              fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
              fs.appendFileSync(file, line);
            },
          },
        });
        const { deleteTask } = await import('./delete.js');
        await deleteTask({ loaded, namespace: inv.namespace, id: inv.id, bundle: inv.bundle, logger });
        return 0;
      }
      case 'node-serve': {
        adoptCallerRoot(processEnv);
        // It outlives every pod: no pod's bundle may stay its working directory.
        process.chdir('/');
        const [{ nodeServerPaths }, { registerTaskService }, { runNodeServe, nodeServerLogger }] = await Promise.all([
          import('./paths.js'),
          import('./register.js'),
          import('./node-server.js'),
        ]);
        const level: LogLevel = inv.debug ? 'debug' : loaded.config.logLevel;
        const logger = nodeServerLogger(nodeServerPaths(loaded.config.shim.stateRoot, inv.containerdAddress).log, level);
        return await runNodeServe({
          loaded,
          containerdAddress: inv.containerdAddress,
          ttrpcAddress: inv.ttrpcAddress,
          publishBinary: inv.publishBinary,
          debug: inv.debug,
          registerServices: options.registerServices ?? registerTaskService,
          logger,
        });
      }
      case 'serve': {
        adoptCallerRoot(processEnv);
        const [{ shimLogger }, { podStateDir, shimSocketPath }, { registerTaskService }, { runServe }] = await Promise.all([
          import('./log.js'),
          import('./paths.js'),
          import('./register.js'),
          import('./serve.js'),
        ]);
        const stateRoot = loaded.config.shim.stateRoot;
        const level: LogLevel = inv.debug ? 'debug' : loaded.config.logLevel;
        const logger = shimLogger(2, level, { namespace: inv.namespace, sandboxId: inv.id });
        // The socket `start` computed; checked against ours so a mismatch is said, not served.
        const expected = shimSocketPath(stateRoot, inv.containerdAddress, inv.namespace, inv.id);
        if (expected !== inv.socket) logger.warn({ socket: inv.socket, expected }, 'serving on a socket other than the pod name gives');
        return await runServe({
          loaded,
          stateDir: podStateDir(stateRoot, inv.namespace, inv.id),
          registerServices: options.registerServices ?? registerTaskService,
          identity: {
            namespace: inv.namespace,
            sandboxId: inv.id,
            bundle: inv.bundle,
            socketPath: inv.socket,
            containerdAddress: inv.containerdAddress,
            ttrpcAddress: inv.ttrpcAddress,
            publishBinary: inv.publishBinary,
            debug: inv.debug,
            logger,
          },
        });
      }
    }
  } catch (err) {
    io.stderr.write(`${SHIM_BINARY_NAME} ${inv.action}: ${errorMessage(err)}\n`);
    return 1;
  }
}

/**
 * What bin/containerd-shim-kata-ts-v2 runs: main() on this process's arguments, then exit with its
 * code (explicitly: nothing the action leaves behind, a paused stdin or a timer, may keep the
 * process alive once containerd has its answer).
 */
export function runShimProgram(registerServices?: RegisterServices): void {
  for (const stream of [process.stdout, process.stderr]) {
    // containerd closing its end of a pipe ends our output, not the process with a stack trace.
    stream.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code !== 'EPIPE') throw err;
    });
  }
  main(process.argv.slice(2), registerServices === undefined ? {} : { registerServices }).then(
    (code) => process.exit(code),
    (err: unknown) => {
      try {
        fs.writeSync(2, `${SHIM_BINARY_NAME}: ${errorMessage(err)}\n`);
      } finally {
        process.exit(1);
      }
    },
  );
}
