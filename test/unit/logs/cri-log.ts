/**
 * Test helpers: a CRI log reader that parses records the way the kubelet's
 * kuberuntime/logs parseCRILog does (timestamp, stream, tags split on ':', content; a P record's
 * newline is not content, an F record's is), and a fake agent output buffer with offsets.
 */
import type { OutputChunkLike } from '../../../src/runtime/logs/sink.js';

export interface ParsedRecord {
  timestamp: string;
  stream: 'stdout' | 'stderr';
  tag: 'P' | 'F';
  /** What the kubelet shows: an F record's content ends with its newline, a P record's does not. */
  content: Buffer;
  /** The record's payload as written between the tag and the record's end. */
  payload: Buffer;
}

const RFC3339_NANO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/;

/** Parse a whole CRI log file; throws on a record the kubelet would refuse. */
export function parseCriLog(file: Buffer): ParsedRecord[] {
  const out: ParsedRecord[] = [];
  let start = 0;
  while (start < file.byteLength) {
    let end = file.indexOf(0x0a, start);
    if (end === -1) throw new Error(`unterminated record at byte ${start}`);
    end += 1;
    const line = file.subarray(start, end);
    start = end;
    const sp1 = line.indexOf(0x20);
    const sp2 = line.indexOf(0x20, sp1 + 1);
    const sp3 = line.indexOf(0x20, sp2 + 1);
    if (sp1 < 0 || sp2 < 0 || sp3 < 0) throw new Error(`malformed record ${JSON.stringify(line.toString('latin1'))}`);
    const timestamp = line.subarray(0, sp1).toString('latin1');
    if (!RFC3339_NANO.test(timestamp)) throw new Error(`bad timestamp ${timestamp}`);
    const stream = line.subarray(sp1 + 1, sp2).toString('latin1');
    if (stream !== 'stdout' && stream !== 'stderr') throw new Error(`bad stream ${stream}`);
    const tag = line
      .subarray(sp2 + 1, sp3)
      .toString('latin1')
      .split(':')[0];
    if (tag !== 'P' && tag !== 'F') throw new Error(`bad tag ${tag}`);
    const content = line.subarray(sp3 + 1);
    const payload = content.subarray(0, content.byteLength - 1);
    out.push({ timestamp, stream, tag, content: Buffer.from(tag === 'P' ? payload : content), payload: Buffer.from(payload) });
  }
  return out;
}

/** What `kubectl logs` shows for one stream: the contents, joined. */
export function streamText(records: readonly ParsedRecord[], stream: 'stdout' | 'stderr'): Buffer {
  return Buffer.concat(records.filter((r) => r.stream === stream).map((r) => r.content));
}

/** A stream's bytes as they come back from the log: each "\r\n" line end becomes "\n". */
export function asKubectlShows(bytes: Buffer): Buffer {
  return Buffer.from(bytes.toString('latin1').replace(/\r\n/g, '\n'), 'latin1');
}

/** Records without timestamps, for comparisons that must not depend on the clock. */
export function withoutTimes(records: readonly ParsedRecord[]): string[] {
  return records.map((r) => `${r.stream} ${r.tag} ${r.payload.toString('hex')}`);
}

/** One write of the container: a stream and its bytes. */
export interface Write {
  stream: 'stdout' | 'stderr';
  data: Buffer;
}

/**
 * The agent's side of StreamOutput/AckOutput: the container's writes laid out in one offset
 * sequence; `stream(from)` sends everything at or above `from` in chunks of at most `chunkBytes`
 * (never mixing streams), the last one with eof; `from` below the acknowledged offset is refused.
 */
export class FakeAgent {
  acked = 0;
  readonly acks: number[] = [];
  constructor(
    readonly writes: readonly Write[],
    readonly chunkBytes = 7,
  ) {}

  get total(): number {
    return this.writes.reduce((n, w) => n + w.data.byteLength, 0);
  }

  async *stream(from: number, opts: { eof?: boolean } = {}): AsyncGenerator<OutputChunkLike> {
    if (from < this.acked) throw new Error(`resume at ${from} below the acknowledged ${this.acked}`);
    let offset = 0;
    const chunks: OutputChunkLike[] = [];
    for (const w of this.writes) {
      for (let i = 0; i < w.data.byteLength; i += this.chunkBytes) {
        const data = w.data.subarray(i, i + this.chunkBytes);
        if (offset + data.byteLength > from) {
          const skip = Math.max(0, from - offset);
          chunks.push({
            stream: w.stream === 'stdout' ? 'OUTPUT_STREAM_STDOUT' : 'OUTPUT_STREAM_STDERR',
            offset: offset + skip,
            data: data.subarray(skip),
          });
        }
        offset += data.byteLength;
      }
    }
    if (opts.eof !== false) chunks.push({ stream: 'OUTPUT_STREAM_STDOUT', offset, data: new Uint8Array(0), eof: true });
    for (const c of chunks) yield c;
  }

  async ack(offset: number): Promise<void> {
    if (offset < this.acked) throw new Error(`ack went backwards: ${offset} < ${this.acked}`);
    this.acked = offset;
    this.acks.push(offset);
  }
}
