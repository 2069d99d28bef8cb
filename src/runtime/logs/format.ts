/**
 * The CRI log format, pure: container output chunks in, log records out.
 *
 * A record is `<timestamp> <stdout|stderr> <P|F> <content>\n`, exactly what the kubelet's reader
 * (`kuberuntime/logs`, parseCRILog) expects and what containerd's CRI logger writes:
 * - one record per line and per stream: stdout and stderr keep separate partial-line buffers, so
 *   interleaved partial writes never mix inside one record;
 * - `F` ends a line (the newline is the record's own end; a `\r` before it is content, as the
 *   kubelet keeps it);
 * - a line longer than `maxLineBytes` leaves as `P` records of exactly `maxLineBytes` bytes,
 *   emitted as soon as more than that many bytes are pending, then an `F` record with the rest
 *   (1..maxLineBytes bytes), as containerd splits at `max_container_log_line_size`;
 * - at end of output an unterminated last line is flushed as one `P` record (containerd treats a
 *   read that ends without a newline as a partial line); an empty remainder writes nothing.
 * The records depend only on the byte sequence of each stream, never on how it was chunked.
 */

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
const TAG_BYTES = { P: Buffer.from(' P '), F: Buffer.from(' F ') } as const;
const STREAM_BYTES = { stdout: Buffer.from(' stdout'), stderr: Buffer.from(' stderr') } as const;

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
  const baseNs = BigInt(Date.now()) * 1_000_000n;
  const baseHr = process.hrtime.bigint();
  return () => baseNs + (process.hrtime.bigint() - baseHr);
}

function record(out: Buffer[], stream: LogStream, tag: 'P' | 'F', content: Uint8Array, stamp: string): void {
  out.push(
    Buffer.from(stamp, 'latin1'),
    STREAM_BYTES[stream],
    TAG_BYTES[tag],
    Buffer.from(content.buffer, content.byteOffset, content.byteLength),
    Buffer.from([NEWLINE]),
  );
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.byteLength === 0) return b;
  if (b.byteLength === 0) return a;
  return Buffer.concat([a, b]);
}

/**
 * Format `chunks` given the partial lines left by earlier chunks. Returns the records (as buffers
 * to write in order) and the partial lines to carry on. With `eof`, pending partial lines are
 * flushed as `P` records and nothing is carried.
 */
export function formatChunks(
  pending: PendingLines,
  chunks: readonly FormatChunk[],
  opts: { maxLineBytes?: number; eof?: boolean; eofAtNs?: bigint } = {},
): { records: Buffer[]; pending: PendingLines } {
  const max = opts.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES;
  const out: Buffer[] = [];
  const carry: PendingLines = { stdout: pending.stdout, stderr: pending.stderr };
  for (const chunk of chunks) {
    const stamp = formatRfc3339Nano(chunk.receivedAtNs);
    let rest = concat(carry[chunk.stream], chunk.data);
    let start = 0;
    for (;;) {
      const nl = rest.indexOf(NEWLINE, start);
      const lineEnd = nl === -1 ? rest.byteLength : nl;
      // Over-long line: P records of exactly `max` bytes while more than `max` remain unsent.
      while (lineEnd - start > max) {
        record(out, chunk.stream, 'P', rest.subarray(start, start + max), stamp);
        start += max;
      }
      if (nl === -1) break;
      record(out, chunk.stream, 'F', rest.subarray(start, nl), stamp);
      start = nl + 1;
    }
    rest = rest.subarray(start);
    // Copy what is carried so that a caller reusing its chunk buffers cannot change it.
    carry[chunk.stream] = Buffer.from(rest);
  }
  if (opts.eof === true) {
    const stamp = formatRfc3339Nano(opts.eofAtNs ?? chunks.at(-1)?.receivedAtNs ?? 0n);
    for (const stream of ['stdout', 'stderr'] as const) {
      if (carry[stream].byteLength > 0) record(out, stream, 'P', carry[stream], stamp);
      carry[stream] = new Uint8Array(0);
    }
  }
  return { records: out, pending: carry };
}
