import path from 'node:path';
import { raceAbort } from '../common/abort.js';
import { invalid, isKataError } from '../common/errors.js';
import { pathExists } from '../common/fsutil.js';
import type { Logger } from '../common/logger.js';
import { abortReason, throwIfAborted } from './abort.js';
import { type Digest, digestHex } from './digest.js';
import type { LayerStore } from './layers.js';
import type { RootfsMode } from './overlay-probe.js';
import { formatReference, type ImageReference, manifestReferenceOf } from './reference.js';
import type { Credentials } from './registry/auth.js';
import type { ImageSession, RegistryClient } from './registry/client.js';
import {
  type Descriptor,
  type ImageManifest,
  imageUser,
  type Platform,
  parseImageConfig,
  parseManifestDocument,
  selectPlatform,
} from './registry/manifests.js';
import type { BlobStore } from './store/blobs.js';
import type { LeaseSet } from './store/mutex.js';
import type { LayerRecord } from './store/records.js';
import { unpackImage } from './unpack.js';

/** Everything a pull needs from the service. */
export interface PullContext {
  client: RegistryClient;
  blobs: BlobStore;
  /** `<stateDir>/images/rootfs` */
  rootfsDir: string;
  /** `<stateDir>/images/layers` */
  layers: LayerStore;
  /** overlay: each layer unpacked on its own (shared); copy: one flat tree per image. */
  mode: RootfsMode;
  leases: LeaseSet;
  platform: Platform;
  logger: Logger;
  progressIntervalMs: number;
  maxConcurrentDownloads: number;
  /** Blob downloads in flight, shared by concurrent pulls of images with common layers. */
  inflightBlobs: Map<Digest, Promise<void>>;
}

/** A fetched, verified and unpacked image, not yet visible in the index. */
export interface FetchedImage {
  id: Digest;
  /** What the reference resolved to at the registry (an index or a manifest): the repo digest. */
  topDigest: Digest;
  manifestDigest: Digest;
  manifestMediaType: string;
  layers: LayerRecord[];
  sizeBytes: number;
  uid: number | null;
  username: string;
  unpacked: 'layers' | 'flat';
  /** Release the leases protecting this image's blobs from GC; call after committing. */
  release: () => void;
}

/** Nested indexes are legal but rare; two levels cover every real registry layout. */
const MAX_INDEX_DEPTH = 2;

/** Logs bytes and layers done every `intervalMs` while a pull runs. */
class PullProgress {
  bytesDone = 0;
  layersDone = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly startedMs = Date.now();

  constructor(
    private readonly logger: Logger,
    readonly bytesTotal: number,
    readonly layersTotal: number,
  ) {}

  start(intervalMs: number): void {
    this.timer = setInterval(() => this.report('pull progress'), intervalMs);
    this.timer.unref();
  }

  report(msg: string): void {
    this.logger.info(
      {
        bytesDone: this.bytesDone,
        bytesTotal: this.bytesTotal,
        layersDone: this.layersDone,
        layersTotal: this.layersTotal,
        elapsedMs: Date.now() - this.startedMs,
      },
      msg,
    );
  }

  stop(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
  }
}

/**
 * Resolve `ref` at its registry, fetch and verify every blob (manifest(s), config, layers),
 * and unpack the root filesystem. Nothing becomes visible here: the caller commits the record
 * (and then calls `release`). On failure, whatever was stored is left for GC and leases are released.
 */
export async function fetchImage(
  ref: ImageReference,
  credentials: Credentials | undefined,
  ctx: PullContext,
  signal: AbortSignal,
): Promise<FetchedImage> {
  const name = formatReference(ref);
  const logger = ctx.logger.child({ image: name });
  const session = ctx.client.session(ref, credentials);
  const top = await session.getManifest(manifestReferenceOf(ref), signal);
  const documents = [top];
  let doc = parseManifestDocument(top.bytes, top.contentType, `manifest of ${name}`);
  for (let depth = 0; doc.kind === 'index'; depth++) {
    if (depth >= MAX_INDEX_DEPTH)
      throw invalid('IMAGE_MANIFEST_INVALID', `image index of ${name} nests more than ${MAX_INDEX_DEPTH} levels`);
    const chosen = selectPlatform(doc.index, ctx.platform, `image index of ${name}`);
    const fetched = await session.getManifest(chosen.digest, signal);
    if (fetched.bytes.length !== chosen.size) {
      throw invalid(
        'IMAGE_SIZE_MISMATCH',
        `manifest ${chosen.digest} of ${name} has ${fetched.bytes.length} bytes, the index says ${chosen.size}`,
      );
    }
    documents.push(fetched);
    doc = parseManifestDocument(fetched.bytes, fetched.contentType || chosen.mediaType, `manifest ${chosen.digest} of ${name}`);
  }
  const manifest: ImageManifest = doc.manifest;
  const platformManifest = documents[documents.length - 1] ?? top;
  let release = ctx.leases.acquire([
    ...documents.map((d) => d.digest),
    manifest.config.digest,
    ...manifest.layers.map((l) => l.digest),
    `rootfs:${digestHex(manifest.config.digest)}`,
  ]);
  try {
    for (const d of documents) await ctx.blobs.writeVerified(d.digest, d.bytes, `manifest ${d.digest} of ${name}`, signal);
    await ensureBlob(manifest.config, `config ${manifest.config.digest} of ${name}`, session, ctx, signal, undefined);
    const configBytes = await ctx.blobs.read(manifest.config.digest);
    const { config, diffIds } = parseImageConfig(configBytes, manifest.layers.length, `config ${manifest.config.digest} of ${name}`);
    if (config.architecture !== undefined && config.architecture !== ctx.platform.architecture) {
      logger.warn({ architecture: config.architecture }, 'image config names another architecture than the platform pulled for');
    }

    const layersTotalBytes = manifest.layers.reduce((n, l) => n + l.size, 0);
    const progress = new PullProgress(logger, layersTotalBytes, manifest.layers.length);
    progress.start(ctx.progressIntervalMs);
    try {
      await forEachLimited(manifest.layers, ctx.maxConcurrentDownloads, signal, async (layer, layerSignal) => {
        await ensureBlob(layer, `layer ${layer.digest} of ${name}`, session, ctx, layerSignal, progress);
        progress.layersDone++;
      });
    } finally {
      progress.stop();
    }
    progress.report('layers downloaded');

    const id = manifest.config.digest;
    const rootfsName = digestHex(id);
    const chain = manifest.layers.map((l, i) => ({ digest: l.digest, diffId: diffIds[i] as Digest, file: ctx.blobs.pathOf(l.digest) }));
    if (ctx.mode === 'overlay') {
      // Held until the record is committed, like the blobs: a GC meanwhile keeps these layers.
      const releaseLayers = ctx.leases.acquire(chain.map((l) => `layer:${digestHex(l.diffId)}`));
      const releaseBlobs = release;
      release = () => {
        releaseBlobs();
        releaseLayers();
      };
      throwIfAborted(signal);
      const unpacked = await ctx.layers.ensure(chain, { signal, logger });
      logger.info({ layers: chain.length, unpacked }, 'layers unpacked');
    } else if (!(await pathExists(path.join(ctx.rootfsDir, rootfsName)))) {
      throwIfAborted(signal);
      const unpacked = await unpackImage(ctx.rootfsDir, rootfsName, chain, { signal, logger });
      logger.info({ rootfs: unpacked.path, layers: unpacked.layers.length }, 'root filesystem unpacked');
    }
    const user = imageUser(config);
    return {
      id,
      topDigest: top.digest,
      manifestDigest: platformManifest.digest,
      manifestMediaType: manifest.mediaType,
      layers: manifest.layers.map((l, i) => ({
        digest: l.digest,
        sizeBytes: l.size,
        mediaType: l.mediaType,
        diffId: diffIds[i] as Digest,
      })),
      sizeBytes: platformManifest.bytes.length + manifest.config.size + layersTotalBytes,
      uid: user.uid,
      username: user.username,
      unpacked: ctx.mode === 'overlay' ? 'layers' : 'flat',
      release,
    };
  } catch (err) {
    release();
    throw err;
  }
}

/**
 * Make sure a blob is stored: skip it when present, wait for a download another pull already
 * runs, else download it. When someone else's download fails (their credentials, their
 * cancellation) this pull tries once on its own rather than inheriting their error.
 */
async function ensureBlob(
  desc: Descriptor,
  what: string,
  session: ImageSession,
  ctx: PullContext,
  signal: AbortSignal,
  progress: PullProgress | undefined,
): Promise<void> {
  let othersFailed = false;
  for (;;) {
    const running = ctx.inflightBlobs.get(desc.digest);
    if (running !== undefined && !othersFailed) {
      try {
        await raceAbort(running, signal, abortReason);
      } catch (err) {
        throwIfAborted(signal);
        othersFailed = true;
        ctx.logger.debug({ digest: desc.digest, err: (err as Error).message }, 'shared blob download failed; downloading it here');
      }
    }
    if (await ctx.blobs.has(desc.digest, desc.size)) {
      if (progress !== undefined) progress.bytesDone += desc.size;
      return;
    }
    // has() yielded: another pull may have started this very blob meanwhile. Checking and
    // registering below happen in one synchronous step, so at most one download starts.
    if (ctx.inflightBlobs.get(desc.digest) === undefined || othersFailed) break;
  }
  const download = (async () => {
    const res = await session.openBlob(desc.digest, signal);
    await ctx.blobs.ingest(desc.digest, desc.size, res.body, {
      signal,
      what,
      onBytes: (n) => {
        if (progress !== undefined) progress.bytesDone += n;
      },
    });
  })();
  ctx.inflightBlobs.set(desc.digest, download);
  try {
    await download;
  } finally {
    if (ctx.inflightBlobs.get(desc.digest) === download) ctx.inflightBlobs.delete(desc.digest);
  }
}

/**
 * Run `fn` over `items` with at most `limit` at a time. The first failure aborts the others
 * (through the signal they get) and is the error reported.
 */
async function forEachLimited<T>(
  items: T[],
  limit: number,
  signal: AbortSignal,
  fn: (item: T, signal: AbortSignal) => Promise<void>,
): Promise<void> {
  const controller = new AbortController();
  const onAbort = (): void => controller.abort(signal.reason);
  signal.addEventListener('abort', onAbort, { once: true });
  let next = 0;
  let firstError: unknown;
  const worker = async (): Promise<void> => {
    while (firstError === undefined && next < items.length) {
      const item = items[next++] as T;
      try {
        await fn(item, controller.signal);
      } catch (err) {
        if (firstError === undefined) {
          firstError = err;
          controller.abort(isKataError(err) ? err : undefined);
        }
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker));
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
  if (firstError !== undefined) throw firstError;
}
