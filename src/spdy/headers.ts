/**
 * SPDY/3 header blocks: a count, then length-prefixed names and values (32-bit big-endian),
 * several values of one name joined by NUL; compressed with zlib primed with the SPDY/3
 * dictionary, one compression context per direction for the whole connection, each block ending
 * with a sync flush. Names are lower case on the wire.
 */
import { Buffer } from 'node:buffer';
import zlib from 'node:zlib';
import { invalid } from '../common/errors.js';
import { SPDY3_DICTIONARY } from './dictionary.js';

/** Header names (lower case) to their values. */
export type SpdyHeaders = Map<string, string[]>;

/** The uncompressed bytes of a header block. */
export function encodeHeaderBlock(headers: Iterable<[string, string | string[]]>): Buffer {
  const parts: Buffer[] = [];
  let count = 0;
  const u32 = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n);
    return b;
  };
  for (const [name, value] of headers) {
    const n = Buffer.from(name.toLowerCase(), 'utf8');
    const v = Buffer.from(Array.isArray(value) ? value.join('\0') : value, 'utf8');
    parts.push(u32(n.length), n, u32(v.length), v);
    count++;
  }
  return Buffer.concat([u32(count), ...parts]);
}

/** Parse an uncompressed header block; refuses truncated blocks and empty names. */
export function decodeHeaderBlock(block: Buffer): SpdyHeaders {
  const headers: SpdyHeaders = new Map();
  let at = 0;
  const read = (): string => {
    if (block.length - at < 4) throw invalid('SPDY_PROTOCOL_ERROR', 'a header block is truncated.');
    const length = block.readUInt32BE(at);
    at += 4;
    if (block.length - at < length) throw invalid('SPDY_PROTOCOL_ERROR', 'a header block is truncated.');
    const s = block.toString('utf8', at, at + length);
    at += length;
    return s;
  };
  if (block.length < 4) throw invalid('SPDY_PROTOCOL_ERROR', 'a header block is truncated.');
  const count = block.readUInt32BE(0);
  at = 4;
  for (let i = 0; i < count; i++) {
    const name = read().toLowerCase();
    if (name === '') throw invalid('SPDY_PROTOCOL_ERROR', 'a header name is empty.');
    const values = read().split('\0');
    headers.set(name, [...(headers.get(name) ?? []), ...values]);
  }
  return headers;
}

/** Runs zlib over successive blocks, in order, one block's output per call (sync flush between). */
class ZlibContext {
  private chain: Promise<unknown> = Promise.resolve();
  private output: Buffer[] = [];

  constructor(private readonly stream: zlib.Deflate | zlib.Inflate) {
    stream.on('data', (chunk: Buffer) => this.output.push(chunk));
    stream.on('error', () => {});
  }

  run(input: Buffer): Promise<Buffer> {
    const next = this.chain.then(
      () =>
        new Promise<Buffer>((resolve, reject) => {
          const onError = (err: Error) => reject(invalid('SPDY_PROTOCOL_ERROR', 'a header block did not (de)compress.', { cause: err }));
          this.stream.once('error', onError);
          this.stream.write(input);
          this.stream.flush(zlib.constants.Z_SYNC_FLUSH, () => {
            this.stream.off('error', onError);
            const out = Buffer.concat(this.output);
            this.output = [];
            resolve(out);
          });
        }),
    );
    this.chain = next.catch(() => undefined);
    return next;
  }

  close(): void {
    this.stream.destroy();
  }
}

/** Compresses the header blocks one side of a connection sends. */
export class HeaderCompressor {
  private readonly ctx = new ZlibContext(zlib.createDeflate({ dictionary: SPDY3_DICTIONARY }));

  compress(headers: Iterable<[string, string | string[]]>): Promise<Buffer> {
    return this.ctx.run(encodeHeaderBlock(headers));
  }

  close(): void {
    this.ctx.close();
  }
}

/** Decompresses the header blocks one side of a connection receives. */
export class HeaderDecompressor {
  private readonly ctx = new ZlibContext(zlib.createInflate({ dictionary: SPDY3_DICTIONARY }));

  async decompress(block: Buffer): Promise<SpdyHeaders> {
    return decodeHeaderBlock(await this.ctx.run(block));
  }

  close(): void {
    this.ctx.close();
  }
}

/** The first value of a header, or undefined. */
export function headerValue(headers: SpdyHeaders, name: string): string | undefined {
  return headers.get(name.toLowerCase())?.[0];
}
