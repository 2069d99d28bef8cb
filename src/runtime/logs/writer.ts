/**
 * `ContainerLogWriter`: appends a container's formatted output to its CRI log file and records,
 * after every batch, how far that output is stored, so a restarted daemon resumes StreamOutput
 * where the file ends, with nothing lost and nothing written twice.
 *
 * Why a crash at any point loses nothing and duplicates nothing. A batch moves the state from
 * (offset O, file F of size S, pending partial lines P) to (O', F, S', P') in three steps:
 * (1) append the records to F (S -> S'), (2) replace the state file atomically, (3) the caller
 * acknowledges O' to the agent. The agent keeps every byte at or above its acknowledged offset,
 * and the acknowledged offset never passes the stored O (step 3 follows step 2).
 * - Crash before or during (1), or between (1) and (2): the state still says (O, F, S, P). F may
 *   hold a torn or whole copy of the batch past S. `open` truncates F back to S (F found by its
 *   device and inode, at the log path or, if the kubelet rotated it meanwhile, as a sibling
 *   named `<log>.*`), restores P, and the caller resumes at O: the agent still holds [O, ...) so
 *   the same bytes are formatted again into the same records (only timestamps differ).
 * - Crash during (2): the rename is atomic, so the state is the old one (above) or the new one.
 * - Crash after (2), before or during (3): the state says (O', F, S', P'), F holds exactly S'
 *   bytes of records; the caller resumes at O' >= the agent's acknowledged offset, which the agent
 *   accepts. Nothing below O' is asked again, nothing at or above it was written.
 * Partial lines are why P is in the state: stdout and stderr share one offset sequence, so a
 * pending stdout fragment below a complete stderr line cannot be expressed by an offset alone.
 * `reopen` keeps the same invariant: it finishes the batch on the old file (state names the old
 * file), opens the new one, then records the new file (size as found) before writing to it; a
 * crash in between finds the old file already consistent and the new one untouched.
 * "Crash" means the daemon dies; on a host crash the VM and its unacknowledged output die too, so
 * fsyncing the log (the kubelet does not) would not save more: the state file alone is fsynced.
 */

import { constants, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { errnoCode, internal, isReason, precondition } from '../../common/errors.js';
import { CriLogFormatter, DEFAULT_MAX_LINE_BYTES, type LogStream, nanoClock, type PendingLines } from './format.js';
import { openLogNoFollow } from './open-nofollow.js';
import { decodePending, encodePending, type LogStateRecord, readLogState, writeLogState } from './state.js';
import './reasons.js';
import { isStderrChunk, type OutputChunkLike, type OutputSink } from './sink.js';

export interface ContainerLogWriterOptions {
  /** The CRI log path (log_directory joined with log_path), absolute. */
  logPath: string;
  /** Where this container's resume record lives (beside its other state). */
  statePath: string;
  /** A terminal merges both streams: everything is logged as stdout. */
  tty?: boolean;
  maxLineBytes?: number;
  /** Nanoseconds since the epoch; defaults to a monotonic wall clock. */
  nowNs?: () => bigint;
  /** Test seam: runs after a batch is appended and before the state is written. */
  afterAppend?: () => Promise<void>;
  /** Test seam: runs before a batch is appended (a slow disk). */
  beforeAppend?: () => Promise<void>;
}

function sameFile(st: { dev: bigint; ino: bigint }, state: LogStateRecord): boolean {
  return st.dev.toString() === state.fileDev && st.ino.toString() === state.fileIno;
}

/**
 * Undo a batch appended after the last recorded state: the recorded file, wherever the kubelet
 * moved it, is cut back to the recorded size. A different or shorter file is left alone.
 */
async function repairTail(logPath: string, state: LogStateRecord): Promise<void> {
  if (state.fileIno === '0') return;
  const candidates = [logPath];
  try {
    const base = path.basename(logPath);
    for (const name of await fsp.readdir(path.dirname(logPath))) {
      if (name.startsWith(`${base}.`)) candidates.push(path.join(path.dirname(logPath), name));
    }
  } catch (err) {
    if (errnoCode(err) !== 'ENOENT') throw err;
  }
  for (const file of candidates) {
    const st = await fsp.lstat(file, { bigint: true }).catch(() => undefined);
    if (st === undefined || !st.isFile() || !sameFile(st, state)) continue;
    if (st.size > BigInt(state.fileSizeBytes)) await truncateSameFile(file, state);
    return;
  }
}

/**
 * Cut `file` back to the recorded size only if what opens there (never through a link) is still
 * the recorded file: a name swapped for a link to another file between lstat and here is left alone.
 */
async function truncateSameFile(file: string, state: LogStateRecord): Promise<void> {
  const flags = constants.O_WRONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
  const handle = await fsp.open(file, flags).catch(() => undefined);
  if (handle === undefined) return;
  try {
    const st = await handle.stat({ bigint: true });
    if (st.isFile() && sameFile(st, state)) await handle.truncate(state.fileSizeBytes);
  } finally {
    await handle.close();
  }
}

/**
 * The log file, opened for appending with no symbolic link followed anywhere on its path (see
 * open-nofollow.ts): LOGS_DIR_MISSING when its directory is gone, LOGS_PATH_UNUSABLE (the
 * request's doing: a link, a directory, a FIFO) when it is not a regular file reached by real
 * directories.
 */
function openLog(logPath: string): Promise<FileHandle> {
  return openLogNoFollow(logPath, { createDirs: false });
}

async function writeAll(handle: FileHandle, data: Buffer): Promise<void> {
  let done = 0;
  while (done < data.byteLength) {
    const { bytesWritten } = await handle.write(data, done, data.byteLength - done);
    done += bytesWritten;
  }
}

/** Appends one container's output to its CRI log file; see the file comment for the guarantees. */
export class ContainerLogWriter implements OutputSink {
  private batch: Buffer[] = [];
  private batchBytes = 0;
  private readonly formatter: CriLogFormatter;
  private accepted: number;
  private eofSeen: boolean;
  private chain: Promise<void> = Promise.resolve();
  private failure: unknown;
  private closed = false;
  private readonly nowNs: () => bigint;

  private constructor(
    private readonly opts: ContainerLogWriterOptions,
    private state: LogStateRecord,
    private handle: FileHandle,
  ) {
    this.formatter = new CriLogFormatter(decodePending(state.pendingBase64), opts.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES);
    this.accepted = state.committedOffset;
    this.eofSeen = state.eof;
    this.nowNs = opts.nowNs ?? nanoClock();
  }

  /**
   * Open the log for writing, repairing what a crash left: after this, `committedOffset` is where
   * StreamOutput must resume. Fails with LOGS_DIR_MISSING when the log directory is absent.
   */
  static async open(opts: ContainerLogWriterOptions): Promise<ContainerLogWriter> {
    const state = await readLogState(opts.statePath);
    await repairTail(opts.logPath, state);
    const handle = await openLog(opts.logPath);
    const writer = new ContainerLogWriter(opts, state, handle);
    try {
      await writer.persist(handle, state.committedOffset, writer.formatter.pending(), state.eof);
    } catch (err) {
      await handle.close();
      throw err;
    }
    return writer;
  }

  /** Every output byte below this is stored (log file or state): the offset to acknowledge and to resume at. */
  get committedOffset(): number {
    return this.state.committedOffset;
  }

  /** The output's end was reached and is stored: nothing more will come. */
  get eof(): boolean {
    return this.state.eof;
  }

  /** A log writer is opened again after any failure: `open` repairs the file from the state. */
  get reusable(): boolean {
    return false;
  }

  /** Formatted bytes held in memory, not yet handed to a write. */
  get bufferedBytes(): number {
    return this.batchBytes;
  }

  /** Whether `flush` has anything to store. */
  get dirty(): boolean {
    return this.batchBytes > 0 || this.accepted !== this.state.committedOffset || this.eofSeen !== this.state.eof;
  }

  /**
   * Format a chunk into the current batch (memory only). Bytes below what was already accepted
   * are skipped (a resumed stream may repeat them); a chunk starting past it is a gap: an error.
   */
  accept(chunk: OutputChunkLike): void {
    this.check();
    if (this.eofSeen) return;
    if (chunk.offset > this.accepted) {
      throw internal('LOGS_OUTPUT_GAP', `output chunk at offset ${chunk.offset} skips past the stored offset ${this.accepted}.`, {
        details: { offset: chunk.offset, accepted: this.accepted },
      });
    }
    const data = chunk.data.subarray(Math.min(chunk.data.byteLength, this.accepted - chunk.offset));
    const stream: LogStream = this.opts.tty !== true && isStderrChunk(chunk) ? 'stderr' : 'stdout';
    const nowNs = this.nowNs();
    const records = [
      data.byteLength > 0 ? this.formatter.push({ stream, data, receivedAtNs: nowNs }) : undefined,
      chunk.eof === true ? this.formatter.finish(nowNs) : undefined,
    ];
    for (const r of records) {
      if (r === undefined || r.byteLength === 0) continue;
      this.batch.push(r);
      this.batchBytes += r.byteLength;
    }
    this.accepted += data.byteLength;
    if (chunk.eof === true) this.eofSeen = true;
  }

  /** Append the batch as one write, then record the new state. Resolves to `committedOffset`. */
  flush(): Promise<number> {
    return this.enqueue(async () => {
      await this.writeBatch();
    }).then(() => this.state.committedOffset);
  }

  /**
   * ReopenContainerLog: records accepted so far go to the current file, later ones to a file
   * freshly opened at the log path, which exists when this resolves. If the directory is gone this
   * fails (LOGS_DIR_MISSING) and the writer keeps the old file.
   */
  reopen(): Promise<void> {
    return this.enqueue(async () => {
      await this.writeBatch();
      const next = await openLog(this.opts.logPath);
      const old = this.handle;
      try {
        await this.persist(next, this.state.committedOffset, this.formatter.pending(), this.state.eof);
      } catch (err) {
        await next.close();
        throw err;
      }
      this.handle = next;
      await old.close();
    });
  }

  /** Store what is buffered and close the file. */
  async close(): Promise<void> {
    if (this.closed) return;
    try {
      if (this.failure === undefined) await this.flush();
    } finally {
      this.closed = true;
      await this.chain.catch(() => undefined);
      await this.handle.close();
    }
  }

  /** Drop the file without storing anything (what a crash leaves; for tests and teardown). */
  async abandon(): Promise<void> {
    this.closed = true;
    await this.chain.catch(() => undefined);
    await this.handle.close();
  }

  private check(): void {
    if (this.failure !== undefined) throw this.failure;
    if (this.closed) throw precondition('LOGS_WRITER_CLOSED', `log writer for ${this.opts.logPath} is closed.`);
  }

  /** Run file operations one at a time; after a failure the writer only reports it (reopen with `open`). */
  private enqueue(op: () => Promise<void>): Promise<void> {
    const run = this.chain.then(() => {
      this.check();
      return op();
    });
    this.chain = run.catch((err: unknown) => {
      // A missing directory on reopen leaves the writer whole (it keeps the old file); anything else may
      // have left a batch half done, so only `open` (which repairs from the state file) may go on.
      if (this.failure === undefined && !isReason(err, 'LOGS_DIR_MISSING')) this.failure = err;
    });
    return run;
  }

  private async writeBatch(): Promise<void> {
    if (!this.dirty) return;
    // Snapshot synchronously: records, partial lines and offset describe the same prefix of output.
    const records = this.batch;
    const pending = this.formatter.pending();
    const offset = this.accepted;
    const eof = this.eofSeen;
    this.batch = [];
    this.batchBytes = 0;
    if (records.length > 0) {
      await this.opts.beforeAppend?.();
      await writeAll(this.handle, records.length === 1 ? records[0]! : Buffer.concat(records));
    }
    await this.opts.afterAppend?.();
    await this.persist(this.handle, offset, pending, eof);
  }

  private async persist(handle: FileHandle, offset: number, pending: PendingLines, eof: boolean): Promise<void> {
    const st = await handle.stat({ bigint: true });
    const next: LogStateRecord = {
      version: 1,
      committedOffset: offset,
      fileDev: st.dev.toString(),
      fileIno: st.ino.toString(),
      fileSizeBytes: Number(st.size),
      pendingBase64: encodePending(pending),
      eof,
    };
    await writeLogState(this.opts.statePath, next);
    this.state = next;
  }
}
