/**
 * `FifoSink`: a container's output as raw bytes into FIFOs the caller made and reads
 * (containerd's shim API: `stdout`, `stderr`), stdout and stderr apart, or everything to stdout
 * with a terminal. No formatting, no file of ours: the bytes are the container's.
 *
 * Opening. Each FIFO is opened read-write (O_RDWR | O_NONBLOCK), which Linux never blocks on,
 * whether the reader has opened its end yet or not: a plain O_WRONLY open would wait for a reader
 * (blocking a thread of libuv's pool for as long), and O_WRONLY | O_NONBLOCK fails with ENXIO
 * without one. containerd opens its read end before Create, but a reader that comes late loses
 * nothing: the bytes wait in the pipe. Holding a read end ourselves also means a write never fails
 * with EPIPE when the reader goes away (containerd restarting): the bytes wait in the pipe for the
 * next reader, as containerd's own shims do by keeping both ends open.
 *
 * Writing. The descriptor is a libuv pipe (`net.Socket`), so a write never blocks the event loop:
 * when the pipe is full (nobody reads), the write waits for room and `flush` does not resolve, the
 * pump pulls no more, the agent's journal fills and the container blocks on its next write:
 * throttled, never dropped. A batch counts as stored once the kernel took all of it (the write
 * callbacks): only then is its offset committed and acknowledged to the agent.
 *
 * End. At the output's end (the eof chunk), once the last bytes went in, each FIFO is handed to its
 * reader (common/fifo.ts `handOverFifo`): our read-write end is closed, a write-only one keeps the
 * bytes in the pipe until a reader has opened (up to 30 s), and closing that gives the reader its
 * end of file after the bytes. (Our read-write end counts as a reader itself, so it cannot be the
 * one waiting.) `close` (or the abort signal) closes them at once, dropping a batch not yet taken
 * by the kernel (not acknowledged, so a resumed sink sends it again) and ending a hand-over; it
 * never waits for a reader that does not read.
 *
 * Nothing is persisted: after a restart the sink resumes at the offset the agent says it has
 * acknowledged (at least once: a batch written but not yet acknowledged when the process died is
 * written again).
 */

import type net from 'node:net';
import { internal, precondition } from '../../common/errors.js';
import { destroySocket, FIFO_READER_WAIT_MS, handOverFifo, openFifoSocket } from '../../common/fifo.js';
import { isStderrChunk, type OutputChunkLike, type OutputSink } from './sink.js';
import './reasons.js';

export interface FifoSinkOptions {
  /** The stdout FIFO; '' drops stdout. */
  stdout: string;
  /** The stderr FIFO; '' drops stderr. Unused with a terminal. */
  stderr: string;
  /** A terminal: one stream, everything goes to stdout. */
  terminal: boolean;
  /** The output offset to start at (what the agent has acknowledged). */
  startOffset: number;
  /** Aborting closes the FIFOs at once (as `close`), ending a flush that waits for a reader. */
  signal?: AbortSignal;
}

/** One FIFO opened for writing, as a libuv pipe. */
class FifoOut {
  private failure: Error | undefined;
  private destroyed = false;

  private constructor(
    readonly path: string,
    private readonly socket: net.Socket,
  ) {
    socket.on('error', (err) => {
      this.failure ??= err;
    });
  }

  static async open(fifo: string): Promise<FifoOut> {
    try {
      return new FifoOut(fifo, await openFifoSocket(fifo, 'write'));
    } catch (err) {
      throw precondition('LOGS_FIFO_UNUSABLE', `output FIFO ${fifo} cannot be opened as a FIFO`, { cause: err });
    }
  }

  /** Resolves once the kernel took every byte. */
  write(data: Buffer): Promise<void> {
    return new Promise((resolve, reject) => {
      const closedError = () => precondition('LOGS_WRITER_CLOSED', `output FIFO ${this.path} was closed before the bytes went in`);
      if (this.failure !== undefined) return reject(this.failure);
      if (this.destroyed) return reject(closedError());
      this.socket.write(data, (err) => {
        if (err !== undefined && err !== null) reject(err);
        // Node calls a write back without an error when the socket was destroyed meanwhile
        // (stream_base_commons onWriteComplete): those bytes did not all go in.
        else if (this.destroyed) reject(closedError());
        else resolve();
      });
    });
  }

  /** Close the descriptor once a reader has opened the FIFO, keeping the bytes in it (handOverFifo). */
  handOver(timeoutMs: number, signal: AbortSignal): Promise<boolean> {
    return handOverFifo(
      this.path,
      () => {
        this.destroyed = true;
        return destroySocket(this.socket);
      },
      timeoutMs,
      signal,
    );
  }

  /** Close the descriptor (a write still waiting for room is dropped and fails). */
  destroy(): void {
    this.destroyed = true;
    this.socket.destroy();
  }
}

/** Writes one container's output to its FIFOs; see the file comment. */
export class FifoSink implements OutputSink {
  private batch: Array<{ err: boolean; data: Buffer }> = [];
  private batchBytes = 0;
  private accepted: number;
  private committed: number;
  private eofSeen = false;
  private eofStored = false;
  private closed = false;
  /** Aborted by `release`: ends a hand-over still waiting for a reader. */
  private readonly released = new AbortController();
  /** A write failed: what went into the pipes is unknown; a new sink resumes at `committedOffset`. */
  private broken = false;

  private constructor(
    private readonly stdout: FifoOut | undefined,
    private readonly stderr: FifoOut | undefined,
    private readonly terminal: boolean,
    startOffset: number,
    private readonly signal: AbortSignal | undefined,
  ) {
    this.accepted = startOffset;
    this.committed = startOffset;
    signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  /**
   * Open the FIFOs (never blocks, whether their readers are there or not). FAILED_PRECONDITION
   * (`LOGS_FIFO_UNUSABLE`) when a path cannot be opened or is not a FIFO.
   */
  static async open(opts: FifoSinkOptions): Promise<FifoSink> {
    const stdout = opts.stdout === '' ? undefined : await FifoOut.open(opts.stdout);
    let stderr: FifoOut | undefined;
    try {
      stderr = opts.terminal || opts.stderr === '' ? undefined : await FifoOut.open(opts.stderr);
    } catch (err) {
      stdout?.destroy();
      throw err;
    }
    const sink = new FifoSink(stdout, stderr, opts.terminal, opts.startOffset, opts.signal);
    if (opts.signal?.aborted === true) sink.release();
    return sink;
  }

  get committedOffset(): number {
    return this.committed;
  }

  get eof(): boolean {
    return this.eofStored;
  }

  get bufferedBytes(): number {
    return this.batchBytes;
  }

  get reusable(): boolean {
    return !this.closed && !this.broken;
  }

  get dirty(): boolean {
    return this.batch.length > 0 || this.accepted !== this.committed || this.eofSeen !== this.eofStored;
  }

  accept(chunk: OutputChunkLike): void {
    if (this.closed) throw precondition('LOGS_WRITER_CLOSED', 'the output FIFOs are closed');
    if (this.eofSeen) return;
    if (chunk.offset > this.accepted) {
      throw internal('LOGS_OUTPUT_GAP', `output chunk at offset ${chunk.offset} skips past the accepted offset ${this.accepted}.`, {
        details: { offset: chunk.offset, accepted: this.accepted },
      });
    }
    const data = chunk.data.subarray(Math.min(chunk.data.byteLength, this.accepted - chunk.offset));
    if (data.byteLength > 0) {
      // Copied: the batch outlives the message the bytes came in.
      this.batch.push({ err: !this.terminal && isStderrChunk(chunk), data: Buffer.from(data) });
      this.batchBytes += data.byteLength;
    }
    this.accepted += data.byteLength;
    if (chunk.eof === true) this.eofSeen = true;
  }

  async flush(): Promise<number> {
    if (this.closed) throw precondition('LOGS_WRITER_CLOSED', 'the output FIFOs are closed');
    const batch = this.batch;
    const offset = this.accepted;
    const eof = this.eofSeen;
    this.batch = [];
    this.batchBytes = 0;
    const out = batch.filter((b) => !b.err).map((b) => b.data);
    const err = batch.filter((b) => b.err).map((b) => b.data);
    // Each stream in one write, both at once: a stderr nobody reads does not hold stdout back
    // within a batch (the pump's bound still stops pulling until both are in).
    try {
      await Promise.all([
        out.length > 0 && this.stdout !== undefined ? this.stdout.write(Buffer.concat(out)) : undefined,
        err.length > 0 && this.stderr !== undefined ? this.stderr.write(Buffer.concat(err)) : undefined,
      ]);
    } catch (e) {
      this.broken = true;
      throw e;
    }
    this.committed = offset;
    if (eof && !this.eofStored) {
      // Everything is in the pipes: closing our ends gives the readers their end of file, once
      // they have opened (bytes in a pipe nobody has opened yet go with its last writer).
      const stop = this.signal === undefined ? this.released.signal : AbortSignal.any([this.released.signal, this.signal]);
      await Promise.all([this.stdout, this.stderr].map((f) => (f === undefined ? true : f.handOver(FIFO_READER_WAIT_MS, stop))));
      this.eofStored = true;
      this.release();
    }
    return this.committed;
  }

  async close(): Promise<void> {
    this.release();
  }

  private readonly onAbort = (): void => this.release();

  private release(): void {
    if (this.closed) return;
    this.closed = true;
    this.released.abort();
    this.signal?.removeEventListener('abort', this.onAbort);
    this.stdout?.destroy();
    this.stderr?.destroy();
  }
}
