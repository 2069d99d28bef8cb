/**
 * The bench's baseline: the same QEMU binary with the runtime's own argv for an identical pod
 * (same kernel, initramfs, machine, sizes and devices), started directly with child_process and
 * timed from spawn to the guest's KATA_TS_READY line on its ready port, with no daemon involved.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, promises as fsp, openSync } from 'node:fs';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import { silentLogger } from '../../src/common/logger.js';
import { connectQmp, type GuestReport, parseGuestLine, type QmpClient, readProcStat, vmPaths } from '../../src/hypervisor/index.js';
import { LineSplitter } from '../../src/hypervisor/line-splitter.js';
import { READY_LINE_MAX_BYTES } from '../../src/hypervisor/ready-channel.js';
import { readVmRssKiB } from './proc.js';

/**
 * How the bare QEMU leaves the paused state the runtime's argv asks for:
 * - `direct`: `-S` is dropped, QEMU runs from its first instruction; the bench only connects
 *   the ready socket. This is how one would boot a VM by hand, so the ratio charges the runtime
 *   for everything it adds, its own pause / QMP handshake / cgroup placement / `cont` included.
 * - `paused`: `-S` is kept; QMP and the ready socket are connected, then `cont` is sent at once
 *   (what the runtime's launcher does, minus the daemon): the ratio then isolates the daemon.
 */
export type BareMode = 'direct' | 'paused';

/** QEMU option values double a literal comma (src/hypervisor/argv.ts does the same). */
function optionValue(value: string): string {
  return value.replaceAll(',', ',,');
}

/**
 * The runtime's argv with every mention of its sandbox work dir (`fromDir`: the QMP and ready
 * sockets, the console log) pointed at `toDir`, and `-S` removed in `direct` mode. Throws when
 * the argv does not look like the runtime's (no ready socket, no single `-S`) or still names
 * `fromDir` afterwards: the baseline must not share a file with a sandbox.
 */
export function bareArgv(runtimeArgv: readonly string[], fromDir: string, toDir: string, mode: BareMode): string[] {
  const from = optionValue(fromDir);
  const to = optionValue(toDir);
  const rewritten = runtimeArgv.map((arg) => arg.split(from).join(to));
  if (rewritten.some((arg) => arg.includes(fromDir))) throw new Error(`bare argv still names the sandbox work dir ${fromDir}`);
  const readyPath = `path=${optionValue(vmPaths(toDir).readySocket)},`;
  if (!rewritten.some((arg) => arg.includes(readyPath))) throw new Error(`runtime argv has no ready socket under its work dir ${fromDir}`);
  const pauses = rewritten.filter((arg) => arg === '-S').length;
  if (pauses !== 1) throw new Error(`runtime argv has ${pauses} -S options, expected exactly one`);
  return mode === 'direct' ? rewritten.filter((arg) => arg !== '-S') : rewritten;
}

/**
 * The argv with the per-sandbox parts (work dir, `-name guest=`) replaced by placeholders: two
 * pods that differ only in identity give the same normalized argv.
 */
export function normalizedArgv(argv: readonly string[], workDir: string): string[] {
  const dir = optionValue(workDir);
  return argv.map((arg) =>
    arg
      .split(dir)
      .join('<workdir>')
      .replace(/^guest=[^,]*/, 'guest=<name>'),
  );
}

export interface BareBoot {
  pid: number;
  /** From spawn to the KATA_TS_READY line, in milliseconds. */
  readyMs: number;
  report: GuestReport;
  /** QEMU's VmRSS when the ready line arrived. */
  qemuRssKiB: number | undefined;
  /** QMP `quit`, SIGKILL by pid if it has not exited within 5 s; removes the work dir. */
  stop(): Promise<void>;
}

export interface BareBootOptions {
  qemuBinary: string;
  /** From bareArgv(..., dir, mode). */
  argv: string[];
  /** Created here; sockets and logs live in it (the paths the argv was rewritten to). */
  dir: string;
  mode: BareMode;
  readyTimeoutMs: number;
  /** Called with the pid as soon as QEMU is spawned, so the caller can kill it whatever happens next. */
  onSpawn(pid: number): void;
}

const CONNECT_RETRY_MS = 10;

/** Boot one bare QEMU and resolve when its guest has reported ready. Kills it on any failure. */
export async function bootBare(options: BareBootOptions): Promise<BareBoot> {
  const paths = vmPaths(options.dir);
  await fsp.mkdir(options.dir, { recursive: true, mode: 0o700 });
  const logFd = openSync(paths.qemuLog, 'w', 0o640);
  const started = performance.now();
  let child: ChildProcess;
  try {
    // Detached with output to a file, as the runtime's launcher starts its QEMU.
    child = spawn(options.qemuBinary, options.argv, { detached: true, stdio: ['ignore', logFd, logFd] });
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
  } finally {
    closeSync(logFd);
  }
  const pid = child.pid!;
  options.onSpawn(pid);
  let exit: string | undefined;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', (code, signal) => {
      exit = signal !== null ? `signal ${signal}` : `code ${code}`;
      resolve();
    });
  });
  const deadline = Date.now() + options.readyTimeoutMs;
  let qmp: QmpClient | undefined;
  let ready: net.Socket | undefined;
  try {
    if (options.mode === 'paused')
      qmp = await retry(
        () => connectQmp(paths.qmpSocket, { logger: silentLogger() }),
        deadline,
        () => exit,
      );
    ready = await retry(
      () => connectSocket(paths.readySocket),
      deadline,
      () => exit,
    );
    const report = waitForReadyLine(ready, deadline, () => exit);
    // The guest's write blocks until a host end is connected, so nothing can be missed before this.
    if (qmp !== undefined) await qmp.cont();
    const guest = await report;
    const readyMs = performance.now() - started;
    const qemuRssKiB = readVmRssKiB(pid);
    ready.destroy();
    const connected = qmp;
    return {
      pid,
      readyMs,
      report: guest,
      qemuRssKiB,
      stop: () => stopBare(pid, connected, paths.qmpSocket, exited, options.dir),
    };
  } catch (err) {
    ready?.destroy();
    await stopBare(pid, qmp, undefined, exited, options.dir, 'kill');
    const log = (await fsp.readFile(paths.qemuLog, 'utf8').catch(() => '')).trim().split('\n').slice(-3).join(' | ');
    throw new Error(`bare QEMU pid ${pid} did not report ready: ${(err as Error).message}${log === '' ? '' : `; its log ends: ${log}`}`);
  }
}

async function stopBare(
  pid: number,
  qmp: QmpClient | undefined,
  qmpSocket: string | undefined,
  exited: Promise<void>,
  dir: string,
  how: 'quit' | 'kill' = 'quit',
): Promise<void> {
  if (how === 'quit') {
    try {
      const client = qmp ?? (qmpSocket === undefined ? undefined : await connectQmp(qmpSocket, { logger: silentLogger() }));
      await client?.quit({ timeoutMs: 3000 });
      client?.close();
    } catch {
      // falls through to SIGKILL below
    }
  } else {
    qmp?.close();
  }
  const timer = new Promise<'late'>((resolve) => setTimeout(() => resolve('late'), how === 'quit' ? 5000 : 0).unref());
  if ((await Promise.race([exited.then(() => 'gone' as const), timer])) === 'late') {
    const stat = readProcStat(pid);
    if (stat !== undefined && stat.state !== 'Z') {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
    await exited;
  }
  await fsp.rm(dir, { recursive: true, force: true });
}

function connectSocket(socketPath: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(socketPath);
    socket.once('error', reject);
    socket.once('connect', () => {
      socket.removeListener('error', reject);
      resolve(socket);
    });
  });
}

/** Retry `attempt` until it succeeds; give up when QEMU exited (`exitedWith()` set) or at the deadline. */
async function retry<T>(attempt: () => Promise<T>, deadline: number, exitedWith: () => string | undefined): Promise<T> {
  for (;;) {
    const exit = exitedWith();
    if (exit !== undefined) throw new Error(`QEMU exited with ${exit}`);
    try {
      return await attempt();
    } catch (err) {
      if (Date.now() >= deadline) throw err;
    }
    await new Promise((r) => setTimeout(r, CONNECT_RETRY_MS));
  }
}

/** The first KATA_TS_READY report on the socket, split into lines and parsed by the runtime's own code. */
function waitForReadyLine(socket: net.Socket, deadline: number, exitedWith: () => string | undefined): Promise<GuestReport> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(new Error(`no ready line within the timeout`)), Math.max(0, deadline - Date.now()));
    const lines = new LineSplitter(
      (line) => {
        const message = parseGuestLine(line);
        if (message?.kind === 'ready') {
          clearTimeout(timer);
          resolve(message);
        }
      },
      { maxLineBytes: READY_LINE_MAX_BYTES, onOverflow: () => fail(new Error('the guest sent a ready line over the bound')) },
    );
    const fail = (err: Error): void => {
      clearTimeout(timer);
      reject(err);
    };
    socket.on('data', (chunk: Buffer) => lines.push(chunk));
    socket.on('error', () => undefined);
    socket.once('close', () =>
      fail(new Error(`ready socket closed${exitedWith() === undefined ? '' : ` (QEMU exited with ${exitedWith()})`}`)),
    );
  });
}

/** Milliseconds from `t0` until something arrives on the unix socket (retried until it exists); NaN after `timeoutMs`. */
export async function msToFirstBytes(socketPath: string, t0: number, timeoutMs: number): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ms = await new Promise<number | undefined>((resolve) => {
      const sock = net.connect(socketPath);
      sock.once('data', () => {
        resolve(performance.now() - t0);
        sock.destroy();
      });
      sock.once('error', () => resolve(undefined));
      sock.once('close', () => resolve(undefined));
    });
    if (ms !== undefined) return ms;
    if (Date.now() > deadline) return Number.NaN;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** SIGKILL every bare QEMU a bench started and has not yet ended (by pid; one already gone is skipped). */
export function killBareQemus(pids: Iterable<number>): void {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}
