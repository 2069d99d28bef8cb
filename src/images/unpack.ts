import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { type Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tarStream from 'tar-stream';
import { errnoCode, exhausted, internal, invalid, isKataError } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { abortReason, throwIfAborted } from './abort.js';
import { type Compression, decompressorFor, sniffFile } from './decompress.js';
import type { Digest } from './digest.js';
import { type ApplyLayerOptions, LayerApplier, type LayerStats } from './unpack-applier.js';

export type { ApplyLayerOptions, LayerStats } from './unpack-applier.js';

/** Marks an error thrown by our own file-system work (as opposed to a corrupt stream). */
class FsStepError extends Error {
  constructor(readonly inner: unknown) {
    super('fs step failed');
  }
}

/**
 * Apply an uncompressed tar stream onto `root`. Refusals (escapes, malformed entries) are INVALID
 * naming the layer and the entry; a corrupt stream is INVALID IMAGE_LAYER_CORRUPT; a diff_id
 * mismatch is INVALID IMAGE_LAYER_DIFF_ID_MISMATCH. The tree may be half-written on error: callers
 * unpack into a temporary directory and discard it.
 */
export async function applyLayer(root: string, tar: Readable, opts: ApplyLayerOptions): Promise<LayerStats> {
  const applier = new LayerApplier(root, opts);
  const hash = createHash('sha256');
  let tarBytes = 0;
  const hasher = new Transform({
    transform(chunk: Buffer, _enc, done) {
      hash.update(chunk);
      tarBytes += chunk.length;
      done(null, chunk);
    },
  });
  const extract = tarStream.extract();
  // tar-stream's extractor is a streamx Writable; node's pipeline drives it like a node stream.
  const sink = extract as unknown as NodeJS.WritableStream;
  const feeding = pipeline(tar, hasher, sink, opts.signal === undefined ? {} : { signal: opts.signal });
  feeding.catch(() => undefined);
  try {
    for await (const entry of extract) {
      throwIfAborted(opts.signal);
      try {
        await applier.entry(entry.header, entry);
      } catch (err) {
        throw isKataError(err) ? err : new FsStepError(err);
      }
    }
    await feeding;
    try {
      await applier.finish();
    } catch (err) {
      throw new FsStepError(err);
    }
  } catch (err) {
    tar.destroy();
    extract.destroy(err instanceof Error ? err : undefined);
    await feeding.catch(() => undefined);
    throw classifyUnpackError(err, opts);
  }
  const diffId: Digest = `sha256:${hash.digest('hex')}`;
  if (opts.expectedDiffId !== undefined && diffId !== opts.expectedDiffId) {
    throw invalid(
      'IMAGE_LAYER_DIFF_ID_MISMATCH',
      `layer ${opts.layer} unpacks to ${diffId}, not the config's diff_id ${opts.expectedDiffId}`,
      {
        details: { layer: opts.layer, expected: opts.expectedDiffId, actual: diffId },
      },
    );
  }
  return { ...applier.stats, tarBytes, diffId };
}

function classifyUnpackError(err: unknown, opts: ApplyLayerOptions): Error {
  if (opts.signal?.aborted === true) return abortReason(opts.signal, `unpacking layer ${opts.layer}`);
  if (isKataError(err)) return err;
  if (err instanceof FsStepError) {
    if (errnoCode(err.inner) === 'ENOSPC')
      return exhausted('IMAGE_STORE_FULL', `no space left to unpack layer ${opts.layer}`, { cause: err.inner });
    return internal('IMAGE_UNPACK_FAILED', `layer ${opts.layer} could not be unpacked`, { cause: err.inner });
  }
  return invalid('IMAGE_LAYER_CORRUPT', `layer ${opts.layer} is not a readable (compressed) tar archive`, {
    cause: err,
    details: { layer: opts.layer },
  });
}

/** Apply a stored layer blob (gzip, zstd or plain tar, told apart by its magic bytes). */
export async function applyLayerFile(
  root: string,
  blobFile: string,
  opts: ApplyLayerOptions,
): Promise<LayerStats & { compression: Compression }> {
  const compression = await sniffFile(blobFile);
  const decompressor = decompressorFor(compression);
  const source = createReadStream(blobFile);
  // The decompressor's errors (corrupt gzip/zstd) reach applyLayer through this pipe.
  const decompressed = source.pipe(decompressor);
  source.on('error', (err) => decompressor.destroy(err));
  const stats = await applyLayer(root, decompressed, opts);
  return { ...stats, compression };
}

export interface UnpackLayer {
  digest: Digest;
  diffId: Digest;
  /** The stored blob. */
  file: string;
}

/**
 * Build `<rootfsParent>/<name>` from `layers`, bottom first, in a temporary sibling that is
 * renamed into place only when every layer applied: a crash or a refusal never leaves a
 * half-built root filesystem under the final name.
 */
export async function unpackImage(
  rootfsParent: string,
  name: string,
  layers: UnpackLayer[],
  opts: { signal?: AbortSignal; logger?: Logger },
): Promise<{ path: string; layers: LayerStats[] }> {
  const final = path.join(rootfsParent, name);
  await fsp.mkdir(rootfsParent, { recursive: true, mode: 0o700 });
  const tmp = path.join(rootfsParent, `.tmp-${name}-${randomBytes(6).toString('hex')}`);
  await fsp.mkdir(tmp, { mode: 0o755 });
  const stats: LayerStats[] = [];
  try {
    for (const layer of layers) {
      throwIfAborted(opts.signal);
      const s = await applyLayerFile(tmp, layer.file, {
        layer: layer.digest,
        expectedDiffId: layer.diffId,
        signal: opts.signal,
        logger: opts.logger,
      });
      stats.push(s);
      opts.logger?.debug({ layer: layer.digest, compression: s.compression, entries: s.entries, whiteouts: s.whiteouts }, 'layer unpacked');
    }
    try {
      await fsp.rename(tmp, final);
    } catch (err) {
      // Another pull of the same image finished first: its tree is identical.
      if (errnoCode(err) !== 'ENOTEMPTY' && errnoCode(err) !== 'EEXIST') throw err;
      await fsp.rm(tmp, { recursive: true, force: true });
    }
  } catch (err) {
    await fsp.rm(tmp, { recursive: true, force: true });
    throw err;
  }
  return { path: final, layers: stats };
}
