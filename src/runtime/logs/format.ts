/**
 * The CRI log format, pure: container output chunks in, log records out.
 *
 * A record is `<timestamp> <stdout|stderr> <P|F> <content>\n`, exactly what the kubelet's reader
 * (`kuberuntime/logs`, parseCRILog) expects and what containerd's CRI logger writes:
 * - one record per line and per stream: stdout and stderr keep separate partial-line buffers, so
 *   interleaved partial writes never mix inside one record;
 * - `F` ends a line; the record's own newline stands for it. A line ends at `\n` or `\r\n`
 *   (containerd's reader drops both, so `kubectl logs` shows `\n`); any other `\r` is content;
 * - a line longer than `maxLineBytes` leaves as `P` records of exactly `maxLineBytes` bytes,
 *   emitted as soon as more than that many bytes are pending, then an `F` record with the rest
 *   (1..maxLineBytes bytes), as containerd splits at `max_container_log_line_size`;
 * - at end of output an unterminated last line is flushed as one `P` record (containerd treats a
 *   read that ends without a newline as a partial line); an empty remainder writes nothing.
 * The records depend only on the byte sequence of each stream, never on how it was chunked.
 */
import { epochNs } from '../../common/time.js';

/** containerd's default `max_container_log_line_size`. */
export const DEFAULT_MAX_LINE_BYTES = 16 * 1024;

export type LogStream = 'stdout' | 'stderr';

/** One piece of a container's output, as the formatter sees it. */
export interface FormatChunk {
  stream: LogStream;
  data: Uint8Array;
  /** Wall-clock time the host received it, nanoseconds since the Unix epoch. */
  receivedAtNs: bigint;
}

/** Bytes of a line not yet ended, per stream: what a formatter carries between chunks. */
export interface PendingLines {
  stdout: Uint8Array;
  stderr: Uint8Array;
}

export const NO_PENDING: PendingLines = { stdout: new Uint8Array(0), stderr: new Uint8Array(0) };

const NEWLINE = 0x0a;
const CR = 0x0d;
const SPACE = 0x20;
const TAG_P = 0x50;
const TAG_F = 0x46;
const EMPTY = Buffer.alloc(0);

/**
 * Go's `time.RFC3339Nano` in UTC: `2016-10-06T00:17:09.669794202Z`, the fraction with trailing
 * zeros trimmed and left out entirely when it is zero (`2016-10-06T00:17:09Z`).
 */
export function formatRfc3339Nano(epochNs: bigint): string {
  const seconds = epochNs / 1_000_000_000n - (epochNs % 1_000_000_000n < 0n ? 1n : 0n);
  const nanos = epochNs - seconds * 1_000_000_000n;
  const whole = new Date(Number(seconds) * 1000).toISOString().slice(0, 19);
  const fraction = nanos === 0n ? '' : `.${nanos.toString().padStart(9, '0').replace(/0+$/, '')}`;
  return `${whole}${fraction}Z`;
}

/** A wall clock with nanosecond resolution that never goes backwards within the process. */
export function nanoClock(): () => bigint {
  const baseNs = epochNs();
  const baseHr = process.hrtime.bigint();
  return () => baseNs + (process.hrtime.bigint() - baseHr);
}

/** One stream's unfinished line, kept as the pieces that arrived (joined only when written). */
class LineBuffer {
  private pieces: Uint8Array[] = [];
  private length = 0;

  constructor(initial: Uint8Array) {
    this.add(initial);
  }

  get byteLength(): number {
    return this.length;
  }

  lastByte(): number | undefined {
    const last = this.pieces.at(-1);
    return last === undefined ? undefined : last[last.byteLength - 1];
  }

  add(data: Uint8Array): void {
    if (data.byteLength === 0) return;
    this.pieces.push(data);
    this.length += data.byteLength;
  }

  /** The buffered bytes as one buffer; the pieces are replaced by it, so joining happens once. */
  joined(): Buffer {
    const one =
      this.pieces.length === 1
        ? Buffer.from(this.pieces[0]!.buffer, this.pieces[0]!.byteOffset, this.pieces[0]!.byteLength)
        : Buffer.concat(this.pieces, this.length);
    this.pieces = one.byteLength === 0 ? [] : [one];
    return one;
  }

  take(): Buffer {
    const all = this.joined();
    this.pieces = [];
    this.length = 0;
    return all;
  }
}

type Rec = { tag: 'P' | 'F'; content: Uint8Array };

/**
 * The stateful formatter the writer uses: `push` returns the records one chunk completes as one
 * buffer, in linear time however small the chunks are (partial lines are not re-copied per chunk).
 */
export class CriLogFormatter {
  private readonly lines: Record<LogStream, LineBuffer>;

  constructor(
    pending: PendingLines = NO_PENDING,
    private readonly maxLineBytes = DEFAULT_MAX_LINE_BYTES,
  ) {
    // Copy what is carried so that a caller reusing its buffers cannot change it.
    this.lines = { stdout: new LineBuffer(Buffer.from(pending.stdout)), stderr: new LineBuffer(Buffer.from(pending.stderr)) };
  }

  /** The unfinished lines, for the resume state. */
  pending(): PendingLines {
    return { stdout: this.lines.stdout.joined(), stderr: this.lines.stderr.joined() };
  }

  push(chunk: FormatChunk): Buffer {
    const max = this.maxLineBytes;
    const line = this.lines[chunk.stream];
    const data = chunk.data;
    const recs: Rec[] = [];
    let start = 0;
    for (;;) {
      const nl = data.indexOf(NEWLINE, start);
      if (nl === -1) break;
      line.add(data.subarray(start, nl));
      start = nl + 1;
      let content = line.take();
      // "\r\n" ends a line as "\n" does (containerd's reader drops both); a lone "\r" is content.
      if (content.byteLength > 0 && content[content.byteLength - 1] === CR) content = content.subarray(0, -1);
      let at = 0;
      for (; content.byteLength - at > max; at += max) recs.push({ tag: 'P', content: content.subarray(at, at + max) });
      recs.push({ tag: 'F', content: content.subarray(at) });
    }
    // The rest is unfinished; copied, since the caller may reuse its chunk buffers.
    if (start < data.byteLength) line.add(Buffer.from(data.subarray(start)));
    // A trailing "\r" may be half of "\r\n": it does not count until the next byte decides.
    if (line.byteLength - (line.lastByte() === CR ? 1 : 0) > max) {
      // Over-long line: P records of exactly `max` bytes while more than `max` remain unsent.
      const content = line.take();
      const counted = content.byteLength - (content[content.byteLength - 1] === CR ? 1 : 0);
      let at = 0;
      for (; counted - at > max; at += max) recs.push({ tag: 'P', content: content.subarray(at, at + max) });
      line.add(content.subarray(at));
    }
    return render(recs, chunk.stream, chunk.receivedAtNs);
  }

  /** End of output: unterminated lines leave as P records (stdout first), nothing is kept. */
  finish(atNs: bigint): Buffer {
    const out: Buffer[] = [];
    for (const stream of ['stdout', 'stderr'] as const) {
      // At most `max` bytes plus a trailing "\r" wait here; that "\r" is content now, on its own.
      const rest = this.lines[stream].take();
      const recs: Rec[] = [];
      for (let at = 0; at < rest.byteLength; at += this.maxLineBytes)
        recs.push({ tag: 'P', content: rest.subarray(at, at + this.maxLineBytes) });
      out.push(render(recs, stream, atNs));
    }
    return Buffer.concat(out);
  }
}

/** Records to bytes, in one allocation: `<stamp> <stream> <tag> <content>\n` each. */
function render(recs: readonly Rec[], stream: LogStream, atNs: bigint): Buffer {
  if (recs.length === 0) return EMPTY;
  const head = Buffer.from(`${formatRfc3339Nano(atNs)} ${stream} `, 'latin1');
  let size = 0;
  for (const r of recs) size += head.byteLength + 2 + r.content.byteLength + 1;
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  for (const r of recs) {
    at += head.copy(out, at);
    out[at++] = r.tag === 'P' ? TAG_P : TAG_F;
    out[at++] = SPACE;
    out.set(r.content, at);
    at += r.content.byteLength;
    out[at++] = NEWLINE;
  }
  return out;
}

/**
 * Format `chunks` given the partial lines left by earlier chunks (pure). Returns the records (as
 * buffers to write in order) and the partial lines to carry on. With `eof`, pending partial lines
 * are flushed as `P` records and nothing is carried.
 */
export function formatChunks(
  pending: PendingLines,
  chunks: readonly FormatChunk[],
  opts: { maxLineBytes?: number; eof?: boolean; eofAtNs?: bigint } = {},
): { records: Buffer[]; pending: PendingLines } {
  const f = new CriLogFormatter(pending, opts.maxLineBytes);
  const records = chunks.map((c) => f.push(c)).filter((b) => b.byteLength > 0);
  if (opts.eof === true) {
    const tail = f.finish(opts.eofAtNs ?? chunks.at(-1)?.receivedAtNs ?? 0n);
    if (tail.byteLength > 0) records.push(tail);
  }
  return { records, pending: f.pending() };
}
