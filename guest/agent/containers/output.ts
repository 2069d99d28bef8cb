import type { Readable } from 'node:stream';
import { precondition } from '../../../src/common/errors.js';
import type { OutputChunk, StreamName } from './types.js';

/**
 * The output of one process (a container's init or an exec): both streams kept in arrival order,
 * with byte offsets per stream, a bounded window of retained bytes and explicit acknowledgement.
 *
 * Backpressure: a stream's pipe is paused as soon as it holds `capacityBytes` that were read but
 * not yet acknowledged. Node then stops reading the pipe once its own buffer (highWaterMark) is
 * full, the pipe fills, and the container's write() blocks: a slow consumer throttles the
 * container, nothing is dropped. Read-ahead is bounded by capacity + highWaterMark + one read.
 *
 * Resume: the bytes from the last acknowledged offset onwards stay retained, so a consumer that
 * went away (the host daemon restarting) reads again from the offset it had persisted.
 */
export class ProcessOutput {
  private readonly streams: Map<StreamName, StreamWindow> = new Map();
  private seq = 0;
  private readonly waiters = new Set<() => void>();

  constructor(
    sources: Partial<Record<StreamName, Readable>>,
    readonly capacityBytes: number,
  ) {
    for (const name of ['stdout', 'stderr'] as const) {
      const window = new StreamWindow(
        name,
        sources[name],
        capacityBytes,
        () => this.seq++,
        () => this.wake(),
      );
      this.streams.set(name, window);
    }
  }

  /** Bytes of `stream` read from the pipe so far (the offset just past the newest byte). */
  endOffset(stream: StreamName): number {
    return this.window(stream).endOffset;
  }

  /** Forget bytes before `offset`; lets the pipe be read further. */
  ack(stream: StreamName, offset: number): void {
    this.window(stream).ack(offset);
  }

  /** True once both streams reached EOF (the process and its children closed them). */
  get ended(): boolean {
    return [...this.streams.values()].every((w) => w.ended);
  }

  /**
   * Chunks from the given offsets (default: the oldest retained byte) until both streams end.
   * With `autoAck`, asking for the next chunk acknowledges the previous one (for consumers that
   * do not persist, such as ExecSync); otherwise the consumer calls `ack` after persisting.
   */
  async *chunks(options: { from?: Partial<Record<StreamName, number>>; autoAck?: boolean } = {}): AsyncGenerator<OutputChunk> {
    const cursor = new Map<StreamName, number>();
    for (const [name, w] of this.streams) {
      const from = options.from?.[name] ?? w.baseOffset;
      if (from < w.baseOffset || from > w.endOffset) {
        throw precondition('OUTPUT_OFFSET_UNAVAILABLE', `Output offset ${from} of ${name} is no longer retained.`, {
          details: { stream: name, from, retainedFrom: w.baseOffset, end: w.endOffset },
        });
      }
      cursor.set(name, from);
    }
    for (;;) {
      const next = this.nextChunk(cursor);
      if (next) {
        cursor.set(next.stream, next.offset + next.data.length);
        yield next;
        if (options.autoAck) this.ack(next.stream, next.offset + next.data.length);
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => this.waiters.add(resolve));
    }
  }

  private nextChunk(cursor: Map<StreamName, number>): OutputChunk | undefined {
    let best: { w: StreamWindow; seq: number; chunk: OutputChunk } | undefined;
    for (const [name, w] of this.streams) {
      const found = w.chunkAt(cursor.get(name) ?? 0);
      if (found && (!best || found.seq < best.seq)) best = { w, seq: found.seq, chunk: found.chunk };
    }
    return best?.chunk;
  }

  private wake(): void {
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const w of waiters) w();
  }

  private window(stream: StreamName): StreamWindow {
    const w = this.streams.get(stream);
    if (!w) throw new Error(`unknown stream ${stream}`);
    return w;
  }
}

interface Stored {
  seq: number;
  offset: number;
  data: Buffer;
}

class StreamWindow {
  private readonly stored: Stored[] = [];
  baseOffset = 0;
  endOffset = 0;
  ended: boolean;

  constructor(
    private readonly name: StreamName,
    private readonly source: Readable | undefined,
    private readonly capacityBytes: number,
    nextSeq: () => number,
    wake: () => void,
  ) {
    this.ended = source === undefined;
    if (!source) return;
    source.on('data', (data: Buffer) => {
      this.stored.push({ seq: nextSeq(), offset: this.endOffset, data });
      this.endOffset += data.length;
      if (this.endOffset - this.baseOffset >= this.capacityBytes) source.pause();
      wake();
    });
    const finish = () => {
      this.ended = true;
      wake();
    };
    source.once('end', finish);
    source.once('close', finish);
    // A read error on our end of the pipe ends the stream; the exit status still tells the story.
    source.on('error', finish);
  }

  ack(offset: number): void {
    const upTo = Math.min(offset, this.endOffset);
    if (upTo <= this.baseOffset) return;
    this.baseOffset = upTo;
    while (this.stored.length > 0) {
      const first = this.stored[0]!;
      if (first.offset + first.data.length > upTo) break;
      this.stored.shift();
    }
    if (this.source?.isPaused() && this.endOffset - this.baseOffset < this.capacityBytes) this.source.resume();
  }

  chunkAt(offset: number): { seq: number; chunk: OutputChunk } | undefined {
    for (const s of this.stored) {
      const end = s.offset + s.data.length;
      if (end <= offset) continue;
      const data = offset > s.offset ? s.data.subarray(offset - s.offset) : s.data;
      return { seq: s.seq, chunk: { stream: this.name, offset: Math.max(offset, s.offset), data } };
    }
    return undefined;
  }
}
