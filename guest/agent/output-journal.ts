import { Buffer } from 'node:buffer';
import type { Readable } from 'node:stream';
import { cancelled, invalid, precondition } from '../../src/common/errors.js';
import type { OutputChunk, OutputStream } from '../../src/generated/agent/agent.js';

interface Held {
  stream: OutputStream;
  offset: number;
  data: Buffer;
}

/**
 * A container's output as one offset-addressed byte sequence, kept until the host acknowledges
 * it. Why: the daemon may restart at any time and must resume its log file exactly where it
 * stopped. Bounded: when `limitBytes` are held unacknowledged, the sources are paused, so the
 * container blocks on its next write to the full pipe instead of losing output.
 */
export class OutputJournal {
  private readonly held: Held[] = [];
  private ackedOffset = 0;
  private endOffset = 0;
  private openSources = 0;
  private readonly waiters = new Set<() => void>();
  private readonly sources: Readable[] = [];
  private closedFlag = false;

  private readonly ackListeners = new Set<(offset: number) => void>();
  private readonly closeListeners = new Set<() => void>();

  /**
   * `startOffset`: where the numbering starts (a journal recovered from a spool file resumes at
   * the offset the host acknowledged before the agent restarted).
   */
  constructor(
    sources: { stream: OutputStream; readable: Readable | undefined }[],
    private readonly limitBytes: number,
    startOffset = 0,
  ) {
    this.ackedOffset = startOffset;
    this.endOffset = startOffset;
    for (const { stream, readable } of sources) {
      if (readable === undefined) continue;
      this.sources.push(readable);
      this.openSources += 1;
      readable.on('data', (chunk: Buffer) => this.append(stream, chunk));
      readable.once('close', () => this.sourceEnded());
      readable.on('error', () => {}); // a pipe error ends the source like EOF; 'close' follows
    }
  }

  get produced(): number {
    return this.endOffset;
  }

  get acked(): number {
    return this.ackedOffset;
  }

  /** Every source reached end of file. */
  get ended(): boolean {
    return this.openSources === 0;
  }

  /** Room for more output before the bound: a fed source reads only while this is true. */
  get hasRoom(): boolean {
    return this.endOffset - this.ackedOffset < this.limitBytes;
  }

  /**
   * A source fed by the caller (the reaper's spool file, output-spool.ts) rather than a Readable:
   * `push` appends, `end` counts as its end of file. The feeder applies the bound itself (hasRoom).
   */
  openFeed(): { push(stream: OutputStream, data: Buffer): void; end(): void } {
    this.openSources += 1;
    let open = true;
    return {
      push: (stream, data) => {
        if (open && data.length > 0) this.append(stream, data);
      },
      end: () => {
        if (!open) return;
        open = false;
        this.sourceEnded();
      },
    };
  }

  /** Called after each acknowledgement that moved the offset; returns the unsubscribe function. */
  onAck(listener: (offset: number) => void): () => void {
    this.ackListeners.add(listener);
    return () => this.ackListeners.delete(listener);
  }

  /** Called once when the journal is closed. */
  onClose(listener: () => void): void {
    this.closeListeners.add(listener);
  }

  /** Forget bytes below `offset`: the host stored them. */
  ack(offset: number): void {
    if (offset > this.endOffset)
      throw invalid('OUTPUT_ACK_BEYOND_END', `offset ${offset} is beyond the output produced (${this.endOffset}).`);
    if (offset <= this.ackedOffset) return;
    this.ackedOffset = offset;
    while (this.held.length > 0 && this.held[0]!.offset + this.held[0]!.data.length <= offset) this.held.shift();
    this.throttle();
    for (const listener of this.ackListeners) listener(offset);
  }

  /** Chunks from `fromOffset` on, waiting for more, until end of file (a last chunk with eof). */
  async *read(fromOffset: number, signal: AbortSignal): AsyncGenerator<Partial<OutputChunk>> {
    if (fromOffset < this.ackedOffset)
      throw precondition('OUTPUT_OFFSET_GONE', `offset ${fromOffset} was acknowledged already (kept from ${this.ackedOffset}).`);
    let at = fromOffset;
    for (;;) {
      if (signal.aborted) throw signal.reason ?? cancelled('OUTPUT_READ_CANCELLED', 'the output reader went away.');
      if (at < this.ackedOffset) throw precondition('OUTPUT_OFFSET_GONE', `offset ${at} was acknowledged while being read.`);
      const next = this.held.find((h) => h.offset + h.data.length > at);
      if (next !== undefined) {
        const skip = Math.max(0, at - next.offset);
        yield { stream: next.stream, offset: at, data: next.data.subarray(skip) };
        at = next.offset + next.data.length;
        continue;
      }
      if (this.ended || this.closedFlag) {
        yield { stream: 'OUTPUT_STREAM_STDOUT', offset: at, data: Buffer.alloc(0), eof: true };
        return;
      }
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          this.waiters.delete(wake);
          signal.removeEventListener('abort', wake);
          resolve();
        };
        this.waiters.add(wake);
        signal.addEventListener('abort', wake, { once: true });
      });
    }
  }

  /** The container is gone: stop reading and end every reader. */
  close(): void {
    this.closedFlag = true;
    for (const s of this.sources) s.destroy();
    for (const listener of this.closeListeners) listener();
    this.closeListeners.clear();
    this.wake();
  }

  private append(stream: OutputStream, data: Buffer): void {
    this.held.push({ stream, offset: this.endOffset, data });
    this.endOffset += data.length;
    this.throttle();
    this.wake();
  }

  private sourceEnded(): void {
    this.openSources -= 1;
    this.wake();
  }

  private throttle(): void {
    const full = this.endOffset - this.ackedOffset >= this.limitBytes;
    for (const s of this.sources) {
      if (full) s.pause();
      else s.resume();
    }
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }
}
