import { Buffer } from 'node:buffer';

/** What a LineSplitter reports when a line grows past its bound. */
export interface LineOverflow {
  /** The bound that was passed. */
  maxLineBytes: number;
  /** Bytes of the unfinished line when it was given up (at least maxLineBytes + 1). */
  heldBytes: number;
}

export interface LineSplitterOptions {
  /**
   * The longest line accepted, in bytes, without its LF. The peer (QEMU, the guest) is not
   * trusted: without a bound, bytes sent without a newline would grow the daemon's heap, which
   * every pod shares.
   */
  maxLineBytes: number;
  /**
   * Called once when a line passes the bound. From then on the splitter drops every byte: the
   * stream can no longer be framed, so its owner must give it up (close it, fail its pod).
   */
  onOverflow: (overflow: LineOverflow) => void;
}

const LF = 0x0a;

/**
 * Turns stream chunks into lines: a chunk may carry half a line, several lines, or cut a UTF-8
 * character in two (bytes are kept until the LF, which is never part of a multi-byte character,
 * so each line decodes whole). CR before LF is dropped (QEMU ends QMP messages with CRLF). Holds at
 * most `maxLineBytes` plus one chunk.
 */
export class LineSplitter {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private overflowed = false;

  constructor(
    private readonly onLine: (line: string) => void,
    private readonly options: LineSplitterOptions,
  ) {}

  /** True once a line passed the bound (every later byte is dropped). */
  get hasOverflowed(): boolean {
    return this.overflowed;
  }

  /** Bytes of the unfinished line held now. */
  get heldBytes(): number {
    return this.pendingBytes;
  }

  push(chunk: Buffer | string): void {
    if (this.overflowed) return;
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
    let start = 0;
    for (;;) {
      const newline = bytes.indexOf(LF, start);
      if (newline < 0) break;
      const lineBytes = this.pendingBytes + (newline - start);
      if (lineBytes > this.options.maxLineBytes) {
        this.overflow(lineBytes);
        return;
      }
      const parts = [...this.pending, bytes.subarray(start, newline)];
      this.pending = [];
      this.pendingBytes = 0;
      start = newline + 1;
      const line = (parts.length === 1 ? parts[0]! : Buffer.concat(parts)).toString('utf8').replace(/\r$/, '');
      this.onLine(line);
      if (this.overflowed) return;
    }
    if (start >= bytes.length) return;
    const rest = bytes.subarray(start);
    if (this.pendingBytes + rest.length > this.options.maxLineBytes) {
      this.overflow(this.pendingBytes + rest.length);
      return;
    }
    // A copy: the caller's chunk may be a slice of a larger pooled buffer that would stay alive.
    this.pending.push(Buffer.from(rest));
    this.pendingBytes += rest.length;
  }

  private overflow(heldBytes: number): void {
    this.overflowed = true;
    this.pending = [];
    this.pendingBytes = 0;
    this.options.onOverflow({ maxLineBytes: this.options.maxLineBytes, heldBytes });
  }
}
