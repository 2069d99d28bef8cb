import { open } from 'node:fs/promises';
import { PassThrough, Transform, type TransformCallback } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { Decompress } from 'fzstd';

const GZIP_MAGIC = [0x1f, 0x8b];
const ZSTD_MAGIC = [0x28, 0xb5, 0x2f, 0xfd];

export type Compression = 'gzip' | 'zstd' | 'none';

/** Which compression a layer's first bytes announce (magic numbers are more reliable than media types). */
export function sniffCompression(head: Uint8Array): Compression {
  if (GZIP_MAGIC.every((b, i) => head[i] === b)) return 'gzip';
  if (ZSTD_MAGIC.every((b, i) => head[i] === b)) return 'zstd';
  return 'none';
}

/** Read the first bytes of a stored blob and tell its compression. */
export async function sniffFile(file: string): Promise<Compression> {
  const handle = await open(file, 'r');
  try {
    const head = Buffer.alloc(4);
    const { bytesRead } = await handle.read(head, 0, 4, 0);
    return sniffCompression(head.subarray(0, bytesRead));
  } finally {
    await handle.close();
  }
}

/**
 * zstd decompression on fzstd's streaming decoder (node 20's zlib has no zstd). The decoder
 * calls back synchronously inside push(), so output is pushed within _transform and the
 * Transform's own backpressure applies.
 */
export class ZstdDecompress extends Transform {
  private readonly decoder = new Decompress((data) => {
    // fzstd may hand out views of its window buffer: copy before it is reused.
    if (data.length > 0) this.push(Buffer.from(data));
  });

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    try {
      this.decoder.push(chunk);
      done();
    } catch (err) {
      done(err as Error);
    }
  }

  override _flush(done: TransformCallback): void {
    try {
      this.decoder.push(new Uint8Array(0), true);
      done();
    } catch (err) {
      done(err as Error);
    }
  }
}

/** The Transform that undoes `compression` (a pass-through for plain tar). */
export function decompressorFor(compression: Compression): Transform {
  switch (compression) {
    case 'gzip':
      return createGunzip();
    case 'zstd':
      return new ZstdDecompress();
    case 'none':
      return new PassThrough();
  }
}
