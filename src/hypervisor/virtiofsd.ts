import { spawn } from 'node:child_process';
import { closeSync, promises as fsp, openSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { invalid, precondition, timedOut, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { isSameLiveProcess, readProcStat } from '../common/procfs.js';
import { SUN_PATH_MAX_BYTES } from './argv.js';
import { tailFile } from './log-tail.js';

/** Where Debian's QEMU 7.2 ships the C virtiofsd. */
export const DEFAULT_VIRTIOFSD_BINARY = '/usr/lib/qemu/virtiofsd';

export interface VirtiofsdArgvSpec {
  /** The vhost-user socket virtiofsd listens on and QEMU connects to (paths.virtiofsSocket). */
  socketPath: string;
  /** The sandbox's shared directory: the root of what the guest sees at the share's tag. */
  sourceDir: string;
  /** FUSE cache mode; `auto` (the default) revalidates on open, so host changes are seen. */
  cache?: 'auto' | 'always' | 'none';
}

/**
 * Pure: virtiofsd's argv (without the binary). The sandbox stays `namespace`: virtiofsd
 * pivot_roots into the shared directory, so `..` and absolute symlinks resolve inside it and the
 * guest cannot name anything else of the host; CAP_MKNOD and CAP_SETFCAP are dropped, so no
 * device node or file capability can be made in the host directory; its own seccomp filter is
 * always on. Throws `invalid` naming the field.
 */
export function buildVirtiofsdArgv(spec: VirtiofsdArgvSpec): string[] {
  for (const [field, value] of [
    ['socketPath', spec.socketPath],
    ['sourceDir', spec.sourceDir],
  ] as const) {
    // virtiofsd splits -o values at commas and has no escape for them.
    if (!path.isAbsolute(value) || /[,\n\0]/.test(value)) {
      throw invalid('VIRTIOFSD_PATH_INVALID', `virtiofsd ${field} ${JSON.stringify(value)} must be an absolute path without commas.`);
    }
  }
  const bytes = Buffer.byteLength(spec.socketPath, 'utf8');
  if (bytes > SUN_PATH_MAX_BYTES) {
    throw invalid(
      'UNIX_SOCKET_PATH_TOO_LONG',
      `virtiofsd socketPath ${spec.socketPath} is ${bytes} bytes long but a unix socket path must fit in ${SUN_PATH_MAX_BYTES} bytes.`,
    );
  }
  return [
    `--socket-path=${spec.socketPath}`,
    '-o',
    `source=${spec.sourceDir}`,
    '-o',
    `cache=${spec.cache ?? 'auto'}`,
    '-o',
    'sandbox=namespace',
    // Its default set is chown, dac_override, fowner, fsetid, setgid, setuid, mknod and setfcap.
    // Without CAP_MKNOD the guest cannot create device nodes in the host directory at all; without
    // CAP_SETFCAP nothing can set a file capability (xattrs are off anyway: no_xattr is the
    // default). Each of the rest was dropped in turn against a real guest and broke what a root
    // container does (docs/virtiofsd.md: chown EPERM, reading or writing another user's file
    // EACCES, chmod of another user's file EPERM, chmod g+s silently lost, a non-root user's
    // create EPERM), while none of them
    // keeps guest root from making a set-uid-root file: it owns the file it creates. That is
    // answered by the nosuid binds the directories are exported through, and the measured reason
    // virtiofsd is not run in a user namespace is in the same document.
    '-o',
    'modcaps=-mknod:-setfcap',
    '-o',
    'log_level=warn',
  ];
}

export interface StartVirtiofsdOptions extends VirtiofsdArgvSpec {
  binary?: string;
  /** virtiofsd's stdout/stderr (truncated). */
  logFile: string;
  logger: Logger;
  /** How long virtiofsd may take to listen; 10 s unless given. */
  startTimeoutMs?: number;
}

/** A running virtiofsd; identify it by pid and start time (pids are reused). */
export interface VirtiofsdProcess {
  pid: number;
  startTimeTicks: number;
  socketPath: string;
  /**
   * virtiofsd and its live children. It forks its sandbox child into its own namespaces once QEMU
   * has connected, and that child serves the guest (QEMU's vhost-user handshake included, so the
   * child exists once QEMU has realised the device): both share the pod's budget, and placing the
   * parent alone would not move a child forked before it.
   */
  pids(): number[];
  /** SIGTERM, then SIGKILL after `timeoutMs` (default 5 s); resolves once it is gone. Idempotent. */
  stop(timeoutMs?: number): Promise<void>;
}

const DEFAULT_START_TIMEOUT_MS = 10_000;
const DEFAULT_STOP_TIMEOUT_MS = 5_000;
const POLL_MS = 20;
/** `Flags` of a listening socket in /proc/net/unix (__SO_ACCEPTCON). */
const UNIX_LISTENING_FLAGS = 0x10000;

/**
 * Start virtiofsd detached (its own session, so it outlives a daemon restart like QEMU does) and
 * resolve once its socket listens: QEMU, started next, connects to it and fails if it cannot.
 * Listening is read from /proc/net/unix, never by connecting (virtiofsd serves one client only).
 * If virtiofsd exits or does not listen in time, the error carries its log and no process is left.
 */
export async function startVirtiofsd(options: StartVirtiofsdOptions): Promise<VirtiofsdProcess> {
  const binary = options.binary ?? DEFAULT_VIRTIOFSD_BINARY;
  const argv = buildVirtiofsdArgv(options);
  const logger = options.logger.child({ component: 'virtiofsd' });
  await fsp.rm(options.socketPath, { force: true });
  let logFd: number;
  try {
    logFd = openSync(options.logFile, 'w', 0o640);
  } catch (err) {
    throw precondition('VIRTIOFSD_LOG_UNWRITABLE', `virtiofsd log file ${options.logFile} cannot be created.`, { cause: err });
  }
  let exited = false;
  let pid: number;
  try {
    const child = spawn(binary, argv, { detached: true, stdio: ['ignore', logFd, logFd] });
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', (err) =>
        reject(unavailable('VIRTIOFSD_SPAWN_FAILED', `virtiofsd binary ${binary} could not be started.`, { cause: err })),
      );
    });
    child.once('exit', () => {
      exited = true;
    });
    child.unref();
    pid = child.pid!;
  } finally {
    closeSync(logFd);
  }
  const stat = readProcStat(pid);
  const handle = makeHandle(pid, stat?.startTimeTicks ?? 0, options.socketPath);
  const deadline = Date.now() + (options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS);
  while (!exited && stat !== undefined) {
    if (await isListening(options.socketPath)) {
      logger.info({ pid, socket: options.socketPath, source: options.sourceDir }, 'virtiofsd listening');
      return handle;
    }
    if (Date.now() > deadline) {
      await handle.stop(0);
      throw timedOut('VIRTIOFSD_START_TIMEOUT', `virtiofsd did not listen on ${options.socketPath} in time.`, {
        details: { log: await tailFile(options.logFile, 20) },
      });
    }
    await sleep(POLL_MS);
  }
  await handle.stop(0);
  const log = await tailFile(options.logFile, 20);
  throw unavailable('VIRTIOFSD_EXITED', `virtiofsd exited before it listened on ${options.socketPath}: ${log || 'no output'}.`, {
    details: { log },
  });
}

/** The handle of a virtiofsd started earlier (by a daemon before its restart), from its record. */
export function attachVirtiofsd(record: { pid: number; startTimeTicks: number; socketPath: string }): VirtiofsdProcess {
  return makeHandle(record.pid, record.startTimeTicks, record.socketPath);
}

function makeHandle(pid: number, startTimeTicks: number, socketPath: string): VirtiofsdProcess {
  return {
    pid,
    startTimeTicks,
    socketPath,
    pids: () => [pid, ...childrenOf(pid).map((c) => c.pid)],
    async stop(timeoutMs = DEFAULT_STOP_TIMEOUT_MS): Promise<void> {
      // Its sandbox child dies with it (PR_SET_PDEATHSIG), but only a moment later: it is waited
      // for too, so nothing of it outlives stop() (the soak's orphan audit saw it otherwise).
      const children = childrenOf(pid);
      await stopOne(pid, startTimeTicks, timeoutMs);
      for (const child of children) await stopOne(child.pid, child.startTimeTicks, CHILD_GRACE_MS);
    },
  };
}

/** How long virtiofsd's sandbox child may take to follow its parent before it is killed. */
const CHILD_GRACE_MS = 2000;

/** The live children of `pid` (from /proc/<pid>/task/<tid>/children), named by pid + start time. */
function childrenOf(pid: number): Array<{ pid: number; startTimeTicks: number }> {
  const out: Array<{ pid: number; startTimeTicks: number }> = [];
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tids) {
    let text = '';
    try {
      text = readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8');
    } catch {
      continue;
    }
    for (const child of text.split(' ').filter((c) => /^[0-9]+$/.test(c))) {
      const stat = readProcStat(Number(child));
      if (stat !== undefined) out.push({ pid: Number(child), startTimeTicks: stat.startTimeTicks });
    }
  }
  return out;
}

/** SIGTERM, then SIGKILL after `timeoutMs`, waiting for the process (pid + start time) to be gone. */
async function stopOne(pid: number, startTimeTicks: number, timeoutMs: number): Promise<void> {
  for (const [signal, waitMs] of [
    ['SIGTERM', timeoutMs],
    ['SIGKILL', DEFAULT_STOP_TIMEOUT_MS],
  ] as const) {
    if (!isSameLiveProcess(pid, startTimeTicks)) return;
    try {
      process.kill(pid, signal);
    } catch {
      return; // gone meanwhile
    }
    const until = Date.now() + waitMs;
    while (isSameLiveProcess(pid, startTimeTicks) && Date.now() < until) await sleep(POLL_MS);
  }
}

/** Whether some socket listens on `socketPath` in this network namespace. */
async function isListening(socketPath: string): Promise<boolean> {
  const table = await fsp.readFile('/proc/net/unix', 'utf8');
  for (const line of table.split('\n')) {
    // Num RefCount Protocol Flags Type St Inode Path
    const fields = line.trim().split(/\s+/);
    if (fields[7] !== socketPath) continue;
    if ((Number.parseInt(fields[3] ?? '0', 16) & UNIX_LISTENING_FLAGS) !== 0) return true;
  }
  return false;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
