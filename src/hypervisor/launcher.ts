import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, promises as fsp, openSync } from 'node:fs';
import path from 'node:path';
import type { Writable } from 'node:stream';
import { errorMessage, internal, isReason, type KataError, notFound, precondition, timedOut, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { packageRoot } from '../common/paths.js';
import { isSameLiveProcess, readCmdline, readProcStat } from '../common/procfs.js';
import { JAIL_NSENTER_BINARY, type VmmIdentity, vmmLaunchCommand } from './confine.js';
import { tailFile } from './log-tail.js';
import { connectQmp, type QmpClient } from './qmp/client.js';
import { ReadyChannel } from './ready-channel.js';
import { VmHandle, type VmPaths, type VmProcess, vmPaths } from './vm-process.js';

export { type ExitInfo, type ShutdownResult, type VmPaths, type VmProcess, vmPaths } from './vm-process.js';

export interface StartVmOptions {
  qemuBinary: string;
  /** From buildQemuArgv; must name the same sockets as `paths`. */
  argv: string[];
  /** Exists already; QEMU's own log goes to `<workDir>/qemu.log` unless `paths` says otherwise. */
  workDir: string;
  /** Defaults to vmPaths(workDir). */
  paths?: VmPaths;
  logger: Logger;
  /** How long QEMU may take to open its QMP socket; 15 s unless given. */
  startTimeoutMs?: number;
  /** Default deadline of QMP commands; 10 s unless given. */
  qmpTimeoutMs?: number;
  /**
   * Run QEMU in this network namespace (the pod's), where it opens the NIC's TAP by name. Entered
   * with `nsenter --net=`, which execs QEMU in the same process: the pid is QEMU's own. Only the
   * network namespace changes; QEMU's unix sockets are paths and work from any.
   */
  netnsPath?: string;
  /**
   * Start QEMU confined: in a mount namespace of its own rooted at `jailDir` (built beforehand,
   * src/runtime/sandbox/jail.ts) as `identity`, with no capabilities and no_new_privs
   * (vmmLaunchCommand). `jailerBinary` defaults to defaultJailerBinary(). Absent: as root.
   */
  jail?: { jailDir: string; identity: VmmIdentity; memlockBytes?: number; jailerBinary?: string };
  /**
   * Put the process in its cgroup before anything of QEMU runs. Confined, the jailer waits for it
   * (--wait-fd) after its namespaces and limits are set and before it execs setpriv: QEMU, and
   * anything QEMU would fork, start inside the pod's cgroup and its pids.max. Unconfined, it runs
   * right after the spawn (QEMU is paused, -S). A throw ends the process and fails the start.
   */
  place?: (pid: number) => Promise<void>;
}

/** util-linux nsenter, which enters a namespace and execs the command (no fork). */
export const NSENTER_BINARY = JAIL_NSENTER_BINARY;

/** Where setup builds kata-ts-jailer (native/jailer.c, scripts/build-native.sh): beside the compiled code. */
export function defaultJailerBinary(): string {
  return path.join(packageRoot(), 'dist', 'native', 'kata-ts-jailer');
}

const DEFAULT_START_TIMEOUT_MS = 15_000;
const CONNECT_RETRY_MS = 25;
/** After QMP closes, how often an attached VM's pid is checked until it is gone. */
const EXIT_POLL_MS = 100;
/** Background liveness check of an attached VM whose QMP socket stays open. */
const LIVENESS_POLL_MS = 1_000;

/**
 * Start QEMU detached (its own session and process group, so the VM outlives a daemon restart;
 * stdout/stderr to `paths.qemuLog`), have `place` put it in its cgroup before it runs (confined:
 * while the jailer holds the start gate), connect QMP and the ready socket while it is still
 * paused (-S), and return the handle; the caller then calls resume(). If QEMU exits or never
 * opens QMP, or the placement fails, the error carries the tail of its log and no process is left.
 */
export async function startVm(options: StartVmOptions): Promise<VmProcess> {
  const paths = options.paths ?? vmPaths(options.workDir);
  // Only the jailer can hold the start; an unconfined QEMU is placed while paused.
  const gated = options.jail !== undefined && options.place !== undefined;
  const logger = options.logger.child({ component: 'qemu' });
  const startTimeoutMs = options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
  const qmpOptions = { logger, ...(options.qmpTimeoutMs === undefined ? {} : { timeoutMs: options.qmpTimeoutMs }) };
  // A socket file left by an earlier QEMU would accept no connection and mislead the wait below.
  await Promise.all([fsp.rm(paths.qmpSocket, { force: true }), fsp.rm(paths.readySocket, { force: true })]);

  const command = vmmLaunchCommand({
    qemuBinary: options.qemuBinary,
    argv: options.argv,
    ...(options.netnsPath === undefined ? {} : { netnsPath: options.netnsPath }),
    ...(options.jail === undefined ? {} : { jail: { jailerBinary: defaultJailerBinary(), ...options.jail } }),
    ...(gated ? { waitFd: START_GATE_FD } : {}),
  });
  const child = await spawnDetached(command.file, command.args, paths.qemuLog, gated);
  const pid = child.pid!;
  const processExit = new Promise<{ code: number | null; signal: string | null }>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve({ code: child.exitCode, signal: child.signalCode });
    else child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  // Exit races every step of the start: remember it synchronously.
  let exitedEarly: { code: number | null; signal: string | null } | undefined;
  void processExit.then((e) => (exitedEarly = e));

  let qmp: QmpClient | undefined;
  let ready: ReadyChannel | undefined;
  try {
    if (options.place !== undefined) await options.place(pid);
    if (gated) {
      try {
        await openGate(child);
      } catch (err) {
        // The jailer closed its end: it failed a step (its log says which) and exited.
        const exit = await Promise.race([
          processExit,
          new Promise<undefined>((r) => setTimeout(() => r(undefined), GATE_EXIT_WAIT_MS).unref()),
        ]);
        if (exit === undefined) throw err;
        throw await startFailure(pid, paths, exit, startTimeoutMs);
      }
    }
    logger.info({ pid, qemuLog: paths.qemuLog, uid: options.jail?.identity.uid ?? 0 }, 'QEMU started (paused)');
    const deadline = Date.now() + startTimeoutMs;
    qmp = await retryUntil(
      () => connectQmp(paths.qmpSocket, qmpOptions),
      deadline,
      () => exitedEarly !== undefined,
    );
    if (qmp === undefined) throw await startFailure(pid, paths, exitedEarly, startTimeoutMs);
    const stat = readProcStat(pid);
    if (stat === undefined) throw await startFailure(pid, paths, await processExit, startTimeoutMs);
    // QEMU creates every chardev before it serves QMP, so the ready socket exists by now.
    ready = await retryUntil(
      () => ReadyChannel.connect(paths.readySocket, logger),
      deadline,
      () => exitedEarly !== undefined,
    );
    if (ready === undefined) throw await startFailure(pid, paths, exitedEarly, startTimeoutMs);
    child.unref();
    return new VmHandle({
      pid,
      startTimeTicks: stat.startTimeTicks,
      qmp,
      ready,
      paths,
      logger,
      processExit,
      stopWatching: () => child.removeAllListeners('exit'),
    });
  } catch (err) {
    qmp?.close();
    ready?.close();
    if (child.exitCode === null && child.signalCode === null) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
      await processExit;
    }
    throw err;
  }
}

/** The descriptor the jailer reads its go-ahead from (a socket whose other end is ours). */
const START_GATE_FD = 3;
/** How long a jailer whose gate broke may take to be seen exiting. */
const GATE_EXIT_WAIT_MS = 2_000;

/** Let a gated start go on: one byte to the jailer, then our end closed. */
async function openGate(child: ChildProcess): Promise<void> {
  const gate = child.stdio[START_GATE_FD] as Writable | null | undefined;
  if (gate === null || gate === undefined) throw internal('QEMU_SPAWN_FAILED', 'the jailer was started without its start gate.');
  await new Promise<void>((resolve, reject) => {
    gate.once('error', reject);
    gate.end(Buffer.from([1]), () => resolve());
  });
}

async function spawnDetached(binary: string, argv: string[], logFile: string, gated = false): Promise<ChildProcess> {
  let logFd: number;
  try {
    logFd = openSync(logFile, 'w', 0o640);
  } catch (err) {
    throw precondition('QEMU_LOG_UNWRITABLE', `QEMU log file ${logFile} cannot be created.`, { cause: err });
  }
  try {
    const child = spawn(binary, argv, { detached: true, stdio: ['ignore', logFd, logFd, ...(gated ? (['pipe'] as const) : [])] });
    // The gate's errors (a jailer gone before it read) are openGate's to report; none may go unheard.
    child.stdio[START_GATE_FD]?.on('error', () => undefined);
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', (err) => reject(unavailable('QEMU_SPAWN_FAILED', `QEMU binary ${binary} could not be started.`, { cause: err })));
    });
    return child;
  } finally {
    closeSync(logFd);
  }
}

/** Call `attempt` until it succeeds, `giveUp()` turns true, or the deadline passes (undefined then). */
async function retryUntil<T>(attempt: () => Promise<T>, deadline: number, giveUp: () => boolean): Promise<T | undefined> {
  for (;;) {
    if (giveUp()) return undefined;
    try {
      return await attempt();
    } catch (err) {
      if (!isReason(err, 'QMP_CONNECT_FAILED', 'READY_SOCKET_CONNECT_FAILED', 'QMP_CLOSED')) throw err;
    }
    if (Date.now() >= deadline) return undefined;
    await new Promise((r) => setTimeout(r, CONNECT_RETRY_MS));
  }
}

async function startFailure(
  pid: number,
  paths: VmPaths,
  exit: { code: number | null; signal: string | null } | undefined,
  startTimeoutMs: number,
): Promise<KataError> {
  const logTail = await tailLog(paths.qemuLog);
  const log = logTail === '' ? '' : `; its log ends: ${logTail.split('\n').slice(-3).join(' | ')}`;
  if (exit === undefined) {
    return timedOut(
      'QEMU_START_TIMEOUT',
      `QEMU pid ${pid} did not open its QMP socket ${paths.qmpSocket} within ${startTimeoutMs} ms${log}.`,
      {
        details: { pid, logTail },
      },
    );
  }
  const status = exit.signal !== null ? `signal ${exit.signal}` : `code ${exit.code}`;
  return internal('QEMU_EXITED_AT_START', `QEMU pid ${pid} exited with ${status} during start${log}.`, {
    details: { pid, ...exit, logTail },
  });
}

async function tailLog(file: string): Promise<string> {
  return (await tailFile(file, 10).catch(() => '')).trim();
}

export interface AttachVmOptions {
  pid: number;
  startTimeTicks: number;
  qmpSocket: string;
  /**
   * The QMP socket as QEMU's command line names it, when the socket's directory was renamed since
   * QEMU started (a pooled VM's work dir, renamed to its sandbox's at claim); default `qmpSocket`.
   */
  argvQmpSocket?: string;
  /** Reconnect the ready channel too, to keep receiving guest reports. */
  readySocket?: string;
  qemuLog?: string;
  consoleLog?: string;
  logger: Logger;
  qmpTimeoutMs?: number;
}

/**
 * Re-adopt a QEMU after a daemon restart: check that `pid` is still the process that started at
 * `startTimeTicks` and that its command line names `qmpSocket` (a reused pid is NOT_FOUND), then
 * reconnect QMP. The previous QMP connection must be closed (QEMU serves one client at a time).
 * Exit is noticed from the QMP socket closing plus the pid disappearing, within a second.
 */
export async function attachVm(options: AttachVmOptions): Promise<VmProcess> {
  const { pid, startTimeTicks } = options;
  const logger = options.logger.child({ component: 'qemu', pid });
  const stat = readProcStat(pid);
  if (stat === undefined || stat.state === 'Z') {
    throw notFound('VM_PROCESS_GONE', `QEMU pid ${pid} is no longer running.`);
  }
  if (stat.startTimeTicks !== startTimeTicks) {
    throw notFound(
      'VM_PROCESS_GONE',
      `pid ${pid} now belongs to another process (start time ${stat.startTimeTicks} ticks, recorded ${startTimeTicks}).`,
    );
  }
  const cmdline = readCmdline(pid);
  const binary = path.basename(cmdline[0] ?? '');
  const named = options.argvQmpSocket ?? options.qmpSocket;
  if (!binary.startsWith('qemu-system') || !cmdline.some((arg) => arg.includes(`path=${named.replaceAll(',', ',,')},`))) {
    throw precondition('VM_PROCESS_MISMATCH', `pid ${pid} (${binary || 'unknown'}) is not the QEMU serving ${options.qmpSocket}.`);
  }
  const qmp = await connectQmp(options.qmpSocket, {
    logger,
    ...(options.qmpTimeoutMs === undefined ? {} : { timeoutMs: options.qmpTimeoutMs }),
  });
  let ready: ReadyChannel | undefined;
  if (options.readySocket !== undefined) {
    try {
      ready = await ReadyChannel.connect(options.readySocket, logger);
    } catch (err) {
      logger.warn({ err: errorMessage(err) }, 'ready socket not reconnected; guest reports unavailable');
    }
  }

  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const processExit = new Promise<{ code: number | null; signal: string | null }>((resolve) => {
    const check = (): void => {
      if (stopped) return;
      if (!isSameLiveProcess(pid, startTimeTicks)) {
        resolve({ code: null, signal: null });
        return;
      }
      timer = setTimeout(check, qmp.isClosed ? EXIT_POLL_MS : LIVENESS_POLL_MS);
      timer.unref();
    };
    void qmp.closed.then(() => {
      clearTimeout(timer);
      check();
    });
    check();
  });
  const paths: Partial<VmPaths> = { qmpSocket: options.qmpSocket };
  if (options.readySocket !== undefined) paths.readySocket = options.readySocket;
  if (options.qemuLog !== undefined) paths.qemuLog = options.qemuLog;
  if (options.consoleLog !== undefined) paths.consoleLog = options.consoleLog;
  logger.info('QEMU re-attached');
  return new VmHandle({
    pid,
    startTimeTicks,
    qmp,
    ready,
    paths,
    logger,
    processExit,
    stopWatching: () => {
      stopped = true;
      clearTimeout(timer);
    },
  });
}
