/**
 * A task's stdout and stderr as containerd names them in Create. containerd's clients pass one
 * of three forms, and the scheme of `stdout` decides for both streams (as containerd's own shims
 * read it, pkg/process/io.go):
 *
 * - a plain path (no scheme): FIFOs containerd made and reads; handed to the core as they are;
 * - `file:///path`: the output is appended to that file (its directory made 0755, the file 0644,
 *   both streams into the same file; `ctr run --log-uri file:///...`);
 * - `binary:///path/to/logger?k=v`: containerd's logging-binary protocol (`nerdctl run -d`,
 *   `ctr run --log-uri binary:///...`): the logger is started with the container's stdout as fd 3,
 *   its stderr as fd 4 (pipes) and the write end of a "ready" pipe as fd 5, with the arguments
 *   `k v` for each query key (its first value) and the environment CONTAINER_ID and
 *   CONTAINER_NAMESPACE only; the task is ready once the logger closed fd 5 (or exited). At the
 *   task's delete the logger gets SIGTERM, and SIGKILL 12 s later if it still runs.
 *
 * For the last two the shim makes FIFOs of its own (`<dir>/stdout`, `<dir>/stderr`) and hands
 * those to the core, which writes into them exactly as into containerd's. Each FIFO is held open
 * by a writer of ours until the task ended and its output was stored (`end()`), so that a reader
 * sees end-of-file once, after the last byte, even when the core's writer reopens after a broken
 * session. The file relay reads them; the logger reads them itself (a FIFO is a pipe: its fd 3 and
 * 4 are the FIFOs' read ends, blocking, as a pipe's would be).
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { closeSync, constants, promises as fsp, openSync } from 'node:fs';
import type net from 'node:net';
import path from 'node:path';
import type { Writable } from 'node:stream';
import { finished } from 'node:stream/promises';
import { promisify } from 'node:util';
import { errorMessage, invalid, unavailable } from '../common/errors.js';
import { destroySocket, openFifoSocket } from '../common/fifo.js';
import type { Logger } from '../common/logger.js';
import './decode/reasons.js';
import './reasons.js';
import type { TaskIo } from './stdio.js';

const execFileAsync = promisify(execFile);

/** Where a task's stdout (and with it stderr) goes, as decoded from its URI. */
export type OutputTarget = { kind: 'fifo' } | { kind: 'file'; path: string } | { kind: 'binary'; path: string; args: string[] };

/** How long a logger may take to close its ready pipe (containerd waits without a bound). */
export const LOGGER_READY_TIMEOUT_MS = 30_000;
/** containerd's grace for a logger between SIGTERM and SIGKILL (binaryIOProcTermTimeout). */
export const LOGGER_TERM_TIMEOUT_MS = 12_000;
/** How long a task's exit waits for the file relay to write the last bytes. */
export const OUTPUT_DRAIN_TIMEOUT_MS = 10_000;

function uriPath(url: URL, field: string, raw: string): string {
  if (url.host !== '') {
    throw invalid(
      'SHIM_STDIO_INVALID',
      `${field} ${JSON.stringify(raw.slice(0, 256))} names a host; a ${url.protocol}// URI names a local path (three slashes)`,
      {
        details: { field },
      },
    );
  }
  let p: string;
  try {
    p = decodeURIComponent(url.pathname);
  } catch (cause) {
    throw invalid('SHIM_STDIO_INVALID', `${field} has a path that is not valid percent-encoding`, { cause, details: { field } });
  }
  if (!path.isAbsolute(p) || p.includes('\0') || path.posix.normalize(p) !== p || p === '/') {
    throw invalid('SHIM_STDIO_INVALID', `${field} must name an absolute, normalised path, got ${JSON.stringify(p.slice(0, 256))}`, {
      details: { field },
    });
  }
  return p;
}

/**
 * A task's `stdout` as containerd passes it (pure): '' or a plain path is containerd's FIFO,
 * `file://` and `binary://` URIs as described above; any other scheme, a relative path or a URI
 * naming a host is INVALID_ARGUMENT `SHIM_STDIO_INVALID` naming `field`.
 */
export function parseOutputUri(value: string, field = 'stdout'): OutputTarget {
  if (value === '' || value.startsWith('/')) return { kind: 'fifo' };
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(value)?.[1]?.toLowerCase();
  if (scheme === undefined) {
    throw invalid('SHIM_STDIO_INVALID', `${field} ${JSON.stringify(value.slice(0, 256))} is neither an absolute FIFO path nor a URI`, {
      details: { field },
    });
  }
  if (scheme !== 'file' && scheme !== 'binary') {
    throw invalid('SHIM_STDIO_INVALID', `${field} has the scheme "${scheme}"; FIFO paths, file:// and binary:// are understood`, {
      details: { field },
    });
  }
  let url: URL;
  try {
    url = new URL(value);
  } catch (cause) {
    throw invalid('SHIM_STDIO_INVALID', `${field} ${JSON.stringify(value.slice(0, 256))} is not a URI`, { cause, details: { field } });
  }
  const p = uriPath(url, field, value);
  if (scheme === 'file') {
    if (url.search !== '')
      throw invalid('SHIM_STDIO_INVALID', `${field} is a file:// URI with a query; it names a file only`, { details: { field } });
    return { kind: 'file', path: p };
  }
  // Each key once, in the URI's order, with its first value ('' for a bare key), as containerd's NewBinaryCmd.
  const args: string[] = [];
  for (const key of new Set(url.searchParams.keys())) args.push(key, url.searchParams.getAll(key)[0] ?? '');
  return { kind: 'binary', path: p, args };
}

export interface TaskOutputOptions {
  /** A directory of the shim's own for the task's FIFOs (made 0700; removed by close()); unused for containerd's FIFOs. */
  dir: string;
  containerId: string;
  namespace: string;
  logger: Logger;
  readyTimeoutMs?: number;
}

/** What the shim keeps of a task's output while the task lives. */
export interface TaskOutput {
  /** The FIFOs the core writes into (the caller's own for a plain FIFO path). */
  readonly io: TaskIo;
  readonly target: OutputTarget;
  /** The logging binary's pid while it runs (binary://), else undefined. */
  readonly loggerPid: number | undefined;
  /** The task ended and the core stored its output: the FIFOs' readers get their end after the last byte. */
  end(): void;
  /** Resolves once the file relay wrote everything up to the end (at once for FIFOs and a logger); bounded. */
  drained(timeoutMs?: number): Promise<void>;
  /** The task is deleted (or its Create failed): the logger ended (SIGTERM, then SIGKILL), FIFOs and their directory removed. */
  close(): Promise<void>;
}

/** A task whose stdout is containerd's FIFO: nothing of the shim's own. */
function passThrough(io: TaskIo): TaskOutput {
  return {
    io,
    target: { kind: 'fifo' },
    loggerPid: undefined,
    end: () => undefined,
    drained: async () => undefined,
    close: async () => undefined,
  };
}

/** One of our FIFOs with the writer that holds it open until end(). */
interface HeldFifo {
  path: string;
  holder: number;
}

async function makeHeldFifo(file: string): Promise<HeldFifo> {
  await execFileAsync('mkfifo', ['-m', '600', '--', file]);
  // Read-write never blocks on a FIFO and counts as a writer: no reader sees an end before end().
  return { path: file, holder: openSync(file, constants.O_RDWR | constants.O_NONBLOCK | constants.O_NOCTTY) };
}

/**
 * Set up a task's output as `io.stdout` names it: for containerd's FIFOs nothing; for `file://`
 * the file and the relay; for `binary://` the logger, started and ready. Rejects (having undone
 * everything it made) when the URI is refused, the file cannot be opened, or the logger cannot be
 * started or is not ready in time (UNAVAILABLE `SHIM_LOGGER_FAILED`).
 */
export async function openTaskOutput(io: TaskIo, options: TaskOutputOptions): Promise<TaskOutput> {
  const target = parseOutputUri(io.stdout, 'stdout');
  if (target.kind === 'fifo') return passThrough(io);
  if (target.kind === 'file') {
    // As containerd: the directory and the file exist before the task does (a bad path fails Create).
    await fsp.mkdir(path.dirname(target.path), { recursive: true, mode: 0o755 });
    await (await fsp.open(target.path, constants.O_RDWR | constants.O_CREAT | constants.O_APPEND, 0o644)).close();
  }
  const held: HeldFifo[] = [];
  const sockets: net.Socket[] = [];
  const sinks: Writable[] = [];
  let logger: ChildProcess | undefined;
  const relays: Array<Promise<void>> = [];
  const undo = async () => {
    for (const s of sockets) await destroySocket(s);
    // A relay cut short (a failed Create) closes its file too.
    for (const sink of sinks) sink.destroy();
    for (const h of held) {
      try {
        closeSync(h.holder);
      } catch {
        // closed by end() already
      }
    }
    held.length = 0;
    if (logger !== undefined) await stopLogger(logger, LOGGER_TERM_TIMEOUT_MS, options.logger);
    await fsp.rm(options.dir, { recursive: true, force: true });
  };
  try {
    await fsp.mkdir(options.dir, { recursive: true, mode: 0o700 });
    const stdout = await makeHeldFifo(path.join(options.dir, 'stdout'));
    held.push(stdout);
    const stderr = await makeHeldFifo(path.join(options.dir, 'stderr'));
    held.push(stderr);
    if (target.kind === 'file') {
      // The readers are open before the core's writer comes; each relay ends at its FIFO's end.
      for (const fifo of [stdout, stderr]) {
        const reader = await openFifoSocket(fifo.path, 'read');
        sockets.push(reader);
        reader.on('error', (err) => options.logger.warn({ err: errorMessage(err) }, "reading the task's output FIFO failed"));
        const sink = (await fsp.open(target.path, constants.O_WRONLY | constants.O_APPEND)).createWriteStream();
        sinks.push(sink);
        reader.pipe(sink);
        // Handled at once: a relay torn down by a failed Create rejects, and must not go unheard.
        relays.push(
          finished(sink).catch((err: unknown) =>
            options.logger.warn({ err: errorMessage(err) }, 'the output relay to the file ended early'),
          ),
        );
      }
    } else {
      logger = await startLogger(target, stdout.path, stderr.path, options);
    }
  } catch (err) {
    await undo();
    throw err;
  }
  const relayDone = Promise.all(relays);
  let ended = false;
  return {
    io: { stdin: io.stdin, stdout: held[0]!.path, stderr: io.terminal ? '' : held[1]!.path, terminal: io.terminal },
    target,
    get loggerPid() {
      return logger !== undefined && logger.exitCode === null && logger.signalCode === null ? logger.pid : undefined;
    },
    end: () => {
      if (ended) return;
      ended = true;
      for (const h of held) {
        try {
          closeSync(h.holder);
        } catch {
          // already closed
        }
      }
      held.length = 0;
    },
    drained: async (timeoutMs = OUTPUT_DRAIN_TIMEOUT_MS) => {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([relayDone, new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
      clearTimeout(timer);
    },
    close: undo,
  };
}

/**
 * Start the logging binary: fd 3 and 4 the read ends of the stdout and stderr FIFOs (blocking, as
 * pipes: they open at once because our holders are writers), fd 5 the write end of the ready pipe;
 * resolves once fd 5 reached its end (the logger closed it, or exited).
 */
async function startLogger(
  target: Extract<OutputTarget, { kind: 'binary' }>,
  stdoutFifo: string,
  stderrFifo: string,
  options: TaskOutputOptions,
): Promise<ChildProcess> {
  const readyFifo = path.join(options.dir, 'ready');
  await execFileAsync('mkfifo', ['-m', '600', '--', readyFifo]);
  const fds: number[] = [];
  let ready: net.Socket | undefined;
  try {
    fds.push(openSync(stdoutFifo, constants.O_RDONLY | constants.O_NOCTTY));
    fds.push(openSync(stderrFifo, constants.O_RDONLY | constants.O_NOCTTY));
    // Our reader first (non-blocking), then the logger's write end opens at once.
    ready = await openFifoSocket(readyFifo, 'read');
    fds.push(openSync(readyFifo, constants.O_WRONLY | constants.O_NOCTTY));
    await fsp.rm(readyFifo, { force: true });
    const child = spawn(target.path, target.args, {
      cwd: '/',
      env: { CONTAINER_ID: options.containerId, CONTAINER_NAMESPACE: options.namespace },
      stdio: ['ignore', 'ignore', 'ignore', fds[0]!, fds[1]!, fds[2]!],
      detached: false,
    });
    // A later failure (a signal that cannot be sent) is logged, never an unheard 'error' event.
    child.on('error', (err) => options.logger.warn({ logger: target.path, err: errorMessage(err) }, 'the logging binary failed'));
    const spawned = new Promise<void>((resolve, reject) => {
      child.once('spawn', () => resolve());
      child.once('error', reject);
    });
    await spawned.catch((err: unknown) => {
      throw unavailable('SHIM_LOGGER_FAILED', `the logging binary ${target.path} could not be started: ${errorMessage(err)}`, {
        details: { field: 'stdout' },
      });
    });
    for (const fd of fds.splice(0)) closeSync(fd);
    const socket = ready;
    const readyTimeoutMs = options.readyTimeoutMs ?? LOGGER_READY_TIMEOUT_MS;
    const isReady = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), readyTimeoutMs);
      socket.on('data', () => undefined);
      socket.once('end', () => {
        clearTimeout(timer);
        resolve(true);
      });
      socket.once('error', () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    if (!isReady) {
      await stopLogger(child, 0, options.logger);
      throw unavailable(
        'SHIM_LOGGER_FAILED',
        `the logging binary ${target.path} did not close its ready pipe (fd 5) within ${readyTimeoutMs} ms`,
        {
          details: { field: 'stdout' },
        },
      );
    }
    options.logger.info({ logger: target.path, pid: child.pid }, 'logging binary ready');
    return child;
  } finally {
    for (const fd of fds) closeSync(fd);
    if (ready !== undefined) await destroySocket(ready);
    await fsp.rm(readyFifo, { force: true });
  }
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves once the logger exited. Only our own child, by its handle. */
async function stopLogger(child: ChildProcess, graceMs: number, logger: Logger): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill(graceMs > 0 ? 'SIGTERM' : 'SIGKILL');
  let timer: NodeJS.Timeout | undefined;
  const late = await Promise.race([
    exited.then(() => false),
    new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), graceMs))),
  ]);
  clearTimeout(timer);
  if (late) {
    logger.warn({ pid: child.pid }, 'the logging binary did not end on SIGTERM; killed');
    child.kill('SIGKILL');
    await exited;
  }
}
