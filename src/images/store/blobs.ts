import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { errnoCode, exhausted, internal, invalid, isKataError, unavailable } from '../../common/errors.js';
import { fsyncDir } from '../../common/fsutil.js';
import { abortReason } from '../abort.js';
import { type Digest, digestHex, isDigest } from '../digest.js';

export interface IngestOptions {
  signal: AbortSignal;
  /** Called with each chunk's length as it is written (progress accounting). */
  onBytes?: (n: number) => void;
  /** What the bytes are, for messages: `layer sha256:... of docker.io/library/busybox`. */
  what: string;
}

/**
 * Content-addressed blobs under `<root>/blobs/sha256/<hex>`. Bytes land in `<root>/ingest/` first
 * and are renamed into place only after their size and sha256 matched, so a blob file that
 * exists is always complete and correct; a crash leaves at most a temp file for cleanup.
 */
export class BlobStore {
  readonly blobDir: string;
  readonly ingestDir: string;

  constructor(readonly root: string) {
    this.blobDir = path.join(root, 'blobs', 'sha256');
    this.ingestDir = path.join(root, 'ingest');
  }

  async init(): Promise<void> {
    await fsp.mkdir(this.blobDir, { recursive: true, mode: 0o700 });
    await fsp.mkdir(this.ingestDir, { recursive: true, mode: 0o700 });
  }

  pathOf(digest: Digest): string {
    return path.join(this.blobDir, digestHex(digest));
  }

  /**
   * True when the blob is stored (with the expected size, when given). Only ENOENT means "not
   * stored": an unreadable store (EACCES, EIO, ...) throws, rather than make a pull fetch again
   * and again what it cannot see.
   */
  async has(digest: Digest, expectedSize?: number): Promise<boolean> {
    try {
      const st = await fsp.stat(this.pathOf(digest));
      return expectedSize === undefined || st.size === expectedSize;
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return false;
      throw err;
    }
  }

  async read(digest: Digest): Promise<Buffer> {
    return fsp.readFile(this.pathOf(digest));
  }

  /** Every stored digest (file names that are not sha256 hex are ignored). */
  async list(): Promise<Digest[]> {
    let names: string[];
    try {
      names = await fsp.readdir(this.blobDir);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return [];
      throw err;
    }
    return names.map((n) => `sha256:${n}`).filter(isDigest);
  }

  async remove(digest: Digest): Promise<void> {
    await fsp.rm(this.pathOf(digest), { force: true });
  }

  /** Store bytes already in memory (manifests, configs) under their digest, verified. */
  async writeVerified(digest: Digest, bytes: Uint8Array, what: string, signal: AbortSignal): Promise<void> {
    if (await this.has(digest, bytes.length)) return;
    await this.ingest(digest, bytes.length, Readable.from([Buffer.from(bytes)]), { signal, what });
  }

  /**
   * Stream `source` into the store as `digest`. The sha256 and the byte count are checked while
   * the bytes flow (more bytes than `expectedSize` stops the transfer at once); on any mismatch
   * or failure the temp file is removed and nothing is kept.
   */
  async ingest(digest: Digest, expectedSize: number | undefined, source: Readable, opts: IngestOptions): Promise<void> {
    const tmp = path.join(this.ingestDir, `${digestHex(digest)}.${randomBytes(6).toString('hex')}.partial`);
    const hash = createHash('sha256');
    let bytes = 0;
    const verifier = new Transform({
      transform(chunk: Buffer, _enc, done) {
        bytes += chunk.length;
        if (expectedSize !== undefined && bytes > expectedSize) {
          done(
            invalid('IMAGE_SIZE_MISMATCH', `${opts.what} is longer than its descriptor's ${expectedSize} bytes`, { details: { digest } }),
          );
          return;
        }
        hash.update(chunk);
        opts.onBytes?.(chunk.length);
        done(null, chunk);
      },
    });
    const out = createWriteStream(tmp, { flags: 'wx', mode: 0o600 });
    // Tells a broken transfer (UNAVAILABLE, worth retrying) from a failing disk (INTERNAL).
    let sourceFailed = false;
    source.once('error', () => {
      sourceFailed = true;
    });
    try {
      await pipeline(source, verifier, out, { signal: opts.signal });
      if (expectedSize !== undefined && bytes !== expectedSize) {
        throw invalid('IMAGE_SIZE_MISMATCH', `${opts.what} has ${bytes} bytes, its descriptor says ${expectedSize}`, {
          details: { digest },
        });
      }
      const actual = `sha256:${hash.digest('hex')}`;
      if (actual !== digest) {
        throw invalid('IMAGE_DIGEST_MISMATCH', `${opts.what} has digest ${actual}, not the expected ${digest}`, {
          details: { expected: digest, actual },
        });
      }
      const handle = await fsp.open(tmp, 'r');
      try {
        await handle.sync();
      } finally {
        await handle.close();
      }
      await fsp.rename(tmp, this.pathOf(digest));
      await fsyncDir(this.blobDir);
    } catch (err) {
      source.destroy();
      // The write stream opens its file asynchronously: wait until it is closed, or an open that
      // completes after the rm below would leave the temp file behind.
      out.destroy();
      if (!out.closed) await new Promise<void>((resolve) => out.once('close', () => resolve()));
      await fsp.rm(tmp, { force: true });
      if (opts.signal.aborted) throw abortReason(opts.signal);
      if (isKataError(err)) throw err;
      if (errnoCode(err) === 'ENOSPC')
        throw exhausted('IMAGE_STORE_FULL', `no space left in ${this.root} for ${opts.what}`, { cause: err });
      if (sourceFailed) {
        throw unavailable('IMAGE_REGISTRY_UNREACHABLE', `the transfer of ${opts.what} broke off after ${bytes} bytes`, { cause: err });
      }
      throw internal('IMAGE_STORE_WRITE_FAILED', `${opts.what} could not be written to ${this.root}`, { cause: err });
    }
  }

  /** Remove every temp file of interrupted transfers (only safe when no ingest is running). */
  async cleanIngest(): Promise<number> {
    let names: string[];
    try {
      names = await fsp.readdir(this.ingestDir);
    } catch (err) {
      // No ingest dir yet means nothing to clean; any other failure is the store's to report.
      if (errnoCode(err) === 'ENOENT') return 0;
      throw err;
    }
    await Promise.all(names.map((n) => fsp.rm(path.join(this.ingestDir, n), { recursive: true, force: true })));
    return names.length;
  }
}
