/**
 * Where a pod's shim logs. containerd 1.6 (and CRI-O's VM runtime) makes a FIFO `<bundle>/log`
 * before it runs `start` and copies whatever comes out of it into its own log; the per-pod `serve`
 * process gets that FIFO as its stderr. Elsewhere (a bundle without the FIFO, nobody reading it)
 * the log is a file in the pod's state dir.
 *
 * A FIFO is opened write-only and non-blocking: opening it blocks (or, non-blocking, fails with
 * ENXIO) while nobody reads it, and a full FIFO must never stall the shim. The logger writes
 * each line with one write(2) and drops what the FIFO cannot take right now (EAGAIN) or what
 * nobody reads any more (EPIPE: containerd restarted; it opens the FIFO again when it reconnects,
 * and lines flow again): a pod's VM must not stop because containerd's log reader did.
 *
 * containerd copies the FIFO's bytes as they are into its own stderr, where its own lines are
 * logrus text (`time="..." level=info msg="..." key=value`). The shim's lines take the same shape
 * (logfmt: `time=... level=... msg="..." sandboxId=... containerId=... execId=...`, then the
 * other fields), so containerd's log reads as one log and a logfmt parser reads ours with its
 * own. Every line carries the pod's namespace and sandbox id (the serve logger's base fields);
 * the task service adds the container and exec ids of the call it logs for.
 */
import fs, { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';
import { createLogger, type Logger, type LogLevel } from '../common/logger.js';
import { SHIM_LOG_FILE } from './paths.js';

/** An open log target: the descriptor to hand the `serve` process as its stderr. */
export interface ShimLogTarget {
  fd: number;
  /** What it is, for error messages: the FIFO's or the file's path. */
  path: string;
  kind: 'fifo' | 'file';
}

/**
 * Open `<bundle>/log` when it is a FIFO someone reads, else `<stateDir>/shim.log` (appended,
 * created 0600). The caller closes the descriptor once the child has it.
 */
export async function openShimLog(bundle: string, stateDir: string): Promise<ShimLogTarget> {
  const fifo = path.join(bundle, 'log');
  const isFifo = await fsp.lstat(fifo).then(
    (st) => st.isFIFO(),
    () => false,
  );
  if (isFifo) {
    try {
      return { fd: fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK), path: fifo, kind: 'fifo' };
    } catch (err) {
      // ENXIO: nobody reads it (containerd is not waiting on it): fall back to the file.
      if (errnoCode(err) !== 'ENXIO') throw err;
    }
  }
  await fsp.mkdir(stateDir, { recursive: true, mode: 0o700 });
  const file = path.join(stateDir, SHIM_LOG_FILE);
  return { fd: fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600), path: file, kind: 'file' };
}

/** A pino destination on a descriptor that never throws and never blocks on a full FIFO. */
export class DroppingFdSink {
  /** Lines (or line tails) dropped because the reader was full or gone. */
  dropped = 0;

  constructor(private readonly fd: number) {}

  write(line: string): boolean {
    let data = Buffer.from(line);
    // A few tries for a partial write; then the rest of the line is dropped rather than waited for.
    for (let tries = 0; data.length > 0 && tries < 3; tries++) {
      try {
        const written = fs.writeSync(this.fd, data);
        data = data.subarray(written);
      } catch {
        // EAGAIN (full), EPIPE (no reader), or worse: a log line is never worth failing the caller.
        break;
      }
    }
    if (data.length > 0) this.dropped++;
    return true;
  }
}

/** Keys written first, in this order: logrus's three, then the ids that say which pod, task and process. */
const LEADING_KEYS = ['time', 'level', 'msg', 'namespace', 'sandboxId', 'containerId', 'execId'];

/** A logfmt value: bare when it is one plain token, else quoted with `\`, `"` and control characters escaped. */
export function logfmtValue(value: unknown): string {
  const text = typeof value === 'string' ? value : value === undefined ? '' : (JSON.stringify(value) ?? String(value));
  if (typeof value !== 'string' && (typeof value === 'number' || typeof value === 'boolean' || value === null)) return text;
  if (text !== '' && /^[A-Za-z0-9_.:/@^+,-]+$/.test(text)) return text;
  let escaped = '';
  for (const c of text) {
    const code = c.charCodeAt(0);
    if (c === '\\') escaped += '\\\\';
    else if (c === '"') escaped += '\\"';
    else if (c === '\n') escaped += '\\n';
    else if (c === '\r') escaped += '\\r';
    else if (c === '\t') escaped += '\\t';
    else if (code < 0x20 || code === 0x7f) escaped += `\\u${code.toString(16).padStart(4, '0')}`;
    else escaped += c;
  }
  return `"${escaped}"`;
}

/** One log record as a logfmt line (with its newline): LEADING_KEYS first, then the rest as they came. */
export function logfmtLine(entry: Readonly<Record<string, unknown>>): string {
  const keys = [...LEADING_KEYS.filter((k) => Object.hasOwn(entry, k)), ...Object.keys(entry).filter((k) => !LEADING_KEYS.includes(k))];
  return `${keys.map((k) => `${k}=${logfmtValue(entry[k])}`).join(' ')}\n`;
}

/** A pino destination that writes each JSON line it gets as a logfmt line into `sink` (a line that is not JSON as it came). */
export class LogfmtSink {
  constructor(private readonly sink: { write(line: string): boolean }) {}

  write(line: string): boolean {
    let entry: unknown;
    try {
      entry = JSON.parse(line);
    } catch {
      return this.sink.write(line);
    }
    if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) return this.sink.write(line);
    return this.sink.write(logfmtLine(entry as Record<string, unknown>));
  }
}

/**
 * The shim's logger on descriptor `fd` (the `serve` process's stderr): logfmt lines (see the
 * file's comment) carrying `fields` (the pod's namespace and sandbox id) on every line.
 */
export function shimLogger(fd: number, level: LogLevel, fields: Record<string, unknown>): Logger {
  return createLogger({ level, destination: new LogfmtSink(new DroppingFdSink(fd)) }).child({
    component: 'shim',
    pid: process.pid,
    ...fields,
  });
}
