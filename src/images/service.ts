import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { raceAbort } from '../common/abort.js';
import { errorMessage, invalid, notFound, precondition } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import type { Logger } from '../common/logger.js';
import { abortReason, operationScope } from './abort.js';
import { filterImages, lookupImage, namesFromPull, recordsAfterPull, toImageMessage } from './catalog.js';
import type {
  CallOptions,
  ImageFsInfoResponseMessage,
  ImageSpecInput,
  ImageStatusRequestInput,
  ImageStatusResponseMessage,
  ListImagesRequestInput,
  ListImagesResponseMessage,
  PullImageRequestInput,
  PullImageResponseMessage,
  RemoveImageRequestInput,
  RemoveImageResponseMessage,
} from './cri-types.js';
import { type Digest, digestHex } from './digest.js';
import { LayerStore } from './layers.js';
import { probeOverlay, type RootfsMode, type RootfsModeProbe, rootfsModeFile } from './overlay-probe.js';
import { type FetchedImage, fetchImage, type PullContext } from './pull.js';
import { formatReference, parseReference } from './reference.js';
import { type Credentials, credentialsFromAuthConfig } from './registry/auth.js';
import { RegistryClient } from './registry/client.js';
import { loadRegistriesConfig } from './registry/config.js';
import type { Platform } from './registry/manifests.js';
import type { RootfsSource } from './rootfs.js';
import { BlobStore } from './store/blobs.js';
import { collectGarbage } from './store/gc.js';
import { LeaseSet, Mutex } from './store/mutex.js';
import { type ImageRecord, ImageRecordFile, referencedBlobs } from './store/records.js';
import { imageFsUsage } from './store/usage.js';

export interface ImageServiceOptions {
  /** kata-ts's state directory; images live in `<stateDir>/images`. */
  stateDir: string;
  /** `images.registriesConfigPath`: mirrors and plain-HTTP registries; null = none. */
  registriesConfigPath: string | null;
  logger: Logger;
  /** True while a container uses the image (RemoveImage then answers FAILED_PRECONDITION). */
  isImageInUse: (imageId: string) => boolean;
  /**
   * The layer directories containers' overlays stack now (diff id hex): never collected, even
   * when no image holds them any more. None when absent.
   */
  layersInUse?: () => Iterable<string>;
  /**
   * How containers' root filesystems are made: `auto` (default) probes overlayfs once at init and
   * falls back to `copy` where it does not work; `overlay` and `copy` force one (tests, bench).
   */
  rootfsMode?: RootfsMode | 'auto';
  /** The platform picked from multi-arch indexes; linux/amd64 by default. */
  platform?: Platform;
  /** References whose images are reported pinned (kept by the kubelet's image GC), e.g. the pause image. */
  pinnedImages?: string[];
  /** How often a running pull logs its progress; 10 s by default. */
  progressIntervalMs?: number;
  /** Layers downloaded at once per pull; 3 by default, as containerd. */
  maxConcurrentDownloads?: number;
}

interface SharedPull {
  promise: Promise<ImageRecord>;
  controller: AbortController;
  waiters: number;
  settled: boolean;
}

function specImage(spec: ImageSpecInput | null | undefined, field: string): string {
  const image = (spec?.image ?? '').trim();
  if (image === '') throw invalid('IMAGE_SPEC_EMPTY', `${field} is empty`);
  return image;
}

function credentialsKey(c: Credentials | undefined): string {
  return c === undefined ? 'anonymous' : createHash('sha256').update(JSON.stringify(c)).digest('hex');
}

/**
 * The CRI ImageService's logic over a content-addressed store in `<stateDir>/images`:
 * `blobs/sha256/<hex>` (verified content), `rootfs/<image id hex>` (unpacked trees), `ingest/`
 * (transfers in progress) and `index.json` (the images, written atomically).
 *
 * Methods take the decoded CRI request and `{ signal, deadlineMs }` and return the CRI response
 * object, so gRPC handlers are one-liners. Errors are KataErrors.
 */
export class ImageService {
  readonly root: string;
  readonly rootfsDir: string;
  readonly layers: LayerStore;
  private readonly blobs: BlobStore;
  private modeProbe: RootfsModeProbe = { mode: 'copy', reason: 'ImageService.init() was not called' };
  private readonly recordFile: ImageRecordFile;
  private readonly leases = new LeaseSet();
  private readonly mutex = new Mutex();
  private readonly pulls = new Map<string, SharedPull>();
  private readonly inflightBlobs = new Map<Digest, Promise<void>>();
  private records: ImageRecord[] = [];
  private client: RegistryClient | undefined;
  private pinned = new Set<string>();
  private usageRun: Promise<ImageFsInfoResponseMessage> | undefined;

  constructor(private readonly opts: ImageServiceOptions) {
    this.root = path.join(opts.stateDir, 'images');
    this.rootfsDir = path.join(this.root, 'rootfs');
    this.layers = new LayerStore(path.join(this.root, 'layers'));
    this.blobs = new BlobStore(this.root);
    this.recordFile = new ImageRecordFile(this.root);
  }

  /**
   * Create the store, read the registries file and the index, and clean what a crash left:
   * temp files, unpacks in progress, records whose files are gone, and every blob and root
   * filesystem no record references.
   */
  async init(): Promise<void> {
    await fsp.mkdir(this.root, { recursive: true, mode: 0o700 });
    await this.blobs.init();
    await fsp.mkdir(this.rootfsDir, { recursive: true, mode: 0o700 });
    await this.layers.init();
    const wanted = this.opts.rootfsMode ?? 'auto';
    this.modeProbe =
      wanted === 'auto' ? await probeOverlay(this.layers.dir) : { mode: wanted, reason: wanted === 'copy' ? 'configured' : '' };
    if (this.modeProbe.mode === 'copy') this.opts.logger.warn({ reason: this.modeProbe.reason }, 'container root filesystems are copies');
    // For `doctor` only: a full state disk must not keep the daemon from starting (and finding
    // its pods again), so a failed write is logged, not thrown.
    await writeFileAtomic(rootfsModeFile(this.opts.stateDir), JSON.stringify(this.modeProbe)).catch((err: unknown) =>
      this.opts.logger.warn({ err: errorMessage(err) }, 'the root filesystem mode could not be recorded for doctor'),
    );
    const registries = await loadRegistriesConfig(this.opts.registriesConfigPath);
    this.client = new RegistryClient({ registries, logger: this.opts.logger.child({ component: 'registry' }) });
    this.pinned = new Set();
    for (const ref of this.opts.pinnedImages ?? []) {
      const parsed = parseReference(ref, 'pinnedImages entry');
      this.pinned.add(formatReference(parsed));
    }
    const loaded = await this.recordFile.load();
    const intact: ImageRecord[] = [];
    for (const record of loaded) {
      if (await this.isIntact(record)) intact.push(record);
      else
        this.opts.logger.warn(
          { image: record.id, repoTags: record.repoTags },
          'image record dropped: its blobs or root filesystem are missing',
        );
    }
    this.records = intact;
    if (intact.length !== loaded.length) await this.recordFile.save(this.records);
    await this.collect(true);
    this.opts.logger.info({ images: this.records.length, root: this.root, rootfsMode: this.modeProbe.mode }, 'image store ready');
  }

  /** How containers' root filesystems are made here, and why (decided once, at init). */
  get rootfsMode(): RootfsModeProbe {
    return { ...this.modeProbe };
  }

  private collect(includeTemp: boolean) {
    return collectGarbage({
      blobs: this.blobs,
      rootfsDir: this.rootfsDir,
      layers: this.layers,
      records: this.records,
      leases: this.leases,
      layersInUse: new Set(this.opts.layersInUse?.() ?? []),
      includeTemp,
      logger: this.opts.logger,
    });
  }

  /** Close registry connections. Pulls still running are not waited for. */
  close(): void {
    this.client?.close();
  }

  private async isIntact(record: ImageRecord): Promise<boolean> {
    try {
      if (record.unpacked === 'flat') await fsp.access(path.join(this.rootfsDir, digestHex(record.id)));
      else for (const l of record.layers) await fsp.access(this.layers.pathOf(l.diffId));
      for (const d of [record.id, record.manifestDigest, ...record.layers.map((l) => l.digest)]) {
        if (!(await this.blobs.has(d))) return false;
      }
      return true;
    } catch {
      return false;
    }
  }

  private context(): PullContext {
    if (this.client === undefined) throw new Error('ImageService.init() was not called');
    return {
      client: this.client,
      blobs: this.blobs,
      rootfsDir: this.rootfsDir,
      layers: this.layers,
      mode: this.modeProbe.mode,
      leases: this.leases,
      platform: this.opts.platform ?? { os: 'linux', architecture: 'amd64' },
      logger: this.opts.logger,
      progressIntervalMs: this.opts.progressIntervalMs ?? 10_000,
      maxConcurrentDownloads: this.opts.maxConcurrentDownloads ?? 3,
      inflightBlobs: this.inflightBlobs,
    };
  }

  /**
   * PullImage. Concurrent pulls of the same reference with the same credentials share one
   * download; each caller waits with its own cancellation and deadline, and the shared pull is
   * cancelled only when every caller has gone.
   */
  async pullImage(request: PullImageRequestInput, call: CallOptions = {}): Promise<PullImageResponseMessage> {
    const ref = parseReference(specImage(request.image, 'image.image'), 'image.image');
    const credentials = credentialsFromAuthConfig(request.auth);
    const name = formatReference(ref);
    const key = `${name}|${credentialsKey(credentials)}`;
    const scope = operationScope(call, `PullImage of ${name}`);
    let shared = this.pulls.get(key);
    if (shared === undefined) {
      const controller = new AbortController();
      const annotations = { ...(request.image?.annotations ?? {}) };
      const entry: SharedPull = { controller, waiters: 0, settled: false, promise: Promise.resolve() as never };
      entry.promise = this.runPull(ref, credentials, annotations, controller.signal).finally(() => {
        entry.settled = true;
        this.pulls.delete(key);
      });
      entry.promise.catch(() => undefined);
      this.pulls.set(key, entry);
      shared = entry;
    } else {
      this.opts.logger.info({ image: name }, 'joining a pull of the same image already running');
    }
    shared.waiters++;
    try {
      const record = await raceAbort(shared.promise, scope.signal, abortReason);
      return { image_ref: record.id };
    } finally {
      shared.waiters--;
      if (shared.waiters === 0 && !shared.settled && scope.signal.aborted) shared.controller.abort(scope.signal.reason);
      scope.dispose();
    }
  }

  private async runPull(
    ref: ReturnType<typeof parseReference>,
    credentials: Credentials | undefined,
    annotations: Record<string, string>,
    signal: AbortSignal,
  ): Promise<ImageRecord> {
    const started = Date.now();
    const fetched = await fetchImage(ref, credentials, this.context(), signal);
    try {
      const record = await this.mutex.run(() => this.commit(ref, fetched, annotations));
      this.opts.logger.info(
        { image: formatReference(ref), id: record.id, sizeBytes: record.sizeBytes, durationMs: Date.now() - started },
        'image pulled',
      );
      return record;
    } finally {
      fetched.release();
    }
  }

  /** Make a fetched image visible: add or update its record, move the tag to it, save atomically. */
  private async commit(
    ref: ReturnType<typeof parseReference>,
    fetched: FetchedImage,
    annotations: Record<string, string>,
  ): Promise<ImageRecord> {
    const { records, record } = recordsAfterPull(
      this.records,
      fetched,
      namesFromPull(ref, fetched.topDigest),
      annotations,
      this.pinned,
      new Date(),
    );
    await this.recordFile.save(records);
    this.records = records;
    return record;
  }

  /** The stored image a reference, id, digest or id prefix names (for CreateContainer). */
  resolveImage(ref: string): ImageRecord | undefined {
    return lookupImage(this.records, ref)?.record;
  }

  /** The flat tree of an image unpacked flat (copy mode, older stores); read-only for callers. */
  rootfsFor(imageId: string): string {
    return path.join(this.rootfsDir, digestHex(imageId as Digest));
  }

  /**
   * What a container's root filesystem is made from: the image's layer directories (top first)
   * for an overlay when the store unpacked it in layers and overlays work here, else its flat tree
   * to copy. NOT_FOUND IMAGE_NOT_FOUND for an image the store does not hold; FAILED_PRECONDITION
   * ROOTFS_OVERLAY_UNAVAILABLE for a layered image on a host where overlays stopped working (pull
   * it again to unpack it flat).
   */
  rootfsSourceFor(imageId: string): RootfsSource {
    const record = this.records.find((r) => r.id === imageId);
    if (record === undefined) throw notFound('IMAGE_NOT_FOUND', `image ${imageId} is not in the store`);
    if (record.unpacked === 'flat') return { kind: 'flat', dir: this.rootfsFor(record.id) };
    if (this.modeProbe.mode !== 'overlay') {
      throw precondition(
        'ROOTFS_OVERLAY_UNAVAILABLE',
        `image ${imageId} is unpacked in layers but overlays do not work here (${this.modeProbe.reason}); remove and pull it again`,
      );
    }
    return { kind: 'layers', lowerDirs: [...record.layers].reverse().map((l) => this.layers.pathOf(l.diffId)) };
  }

  /**
   * The `config` object of an image's config blob (User, Env, Entrypoint, Cmd, WorkingDir,
   * StopSignal...), or null when the blob has none; what the OCI spec generator reads.
   */
  async imageConfig(imageId: string): Promise<Record<string, unknown> | null> {
    const blob = JSON.parse((await this.blobs.read(imageId as Digest)).toString('utf8')) as { config?: unknown };
    return typeof blob.config === 'object' && blob.config !== null ? (blob.config as Record<string, unknown>) : null;
  }

  /** Every stored image record (a copy). */
  listRecords(): ImageRecord[] {
    return this.records.map((r) => ({ ...r }));
  }

  /** ImageStatus: a missing image is `{ image: null }`, not an error (CRI). Verbose adds the config. */
  async imageStatus(request: ImageStatusRequestInput, _call: CallOptions = {}): Promise<ImageStatusResponseMessage> {
    const match = lookupImage(this.records, specImage(request.image, 'image.image'));
    if (match === undefined) return { image: null, info: {} };
    const record = match.record;
    const info: Record<string, string> = {};
    if (request.verbose === true) {
      const config = JSON.parse((await this.blobs.read(record.id)).toString('utf8')) as unknown;
      info.info = JSON.stringify({
        id: record.id,
        manifestDigest: record.manifestDigest,
        manifestMediaType: record.manifestMediaType,
        layers: record.layers,
        unpacked: record.unpacked,
        rootfs: record.unpacked === 'flat' ? this.rootfsFor(record.id) : record.layers.map((l) => this.layers.pathOf(l.diffId)),
        pulledAt: record.pulledAt,
        imageSpec: config,
      });
    }
    return { image: toImageMessage(record), info };
  }

  /** ListImages with the optional filter.image.image. */
  async listImages(request: ListImagesRequestInput = {}, _call: CallOptions = {}): Promise<ListImagesResponseMessage> {
    const filter = request.filter?.image?.image ?? '';
    return { images: filterImages(this.records, filter).map(toImageMessage) };
  }

  /**
   * RemoveImage, as the CRI defines it: the image the reference names goes with all its tags
   * and digests (removing `repo:v1` also removes `other:latest` of the same image); a missing
   * image is success (idempotent); an image a container uses is FAILED_PRECONDITION. Blobs and
   * the root filesystem no other image needs are deleted before answering.
   */
  /**
   * RemoveImage. By id or repo digest the whole image goes, with every name (what the kubelet's
   * garbage collector asks, by id). By a tag while the image has other tags, only that tag goes and
   * the image stays (CRI-O's behaviour, and what `crictl rmi <tag>` users expect); by its last
   * tag, the image goes. Idempotent: a name that matches nothing is success.
   */
  async removeImage(request: RemoveImageRequestInput, _call: CallOptions = {}): Promise<RemoveImageResponseMessage> {
    const input = specImage(request.image, 'image.image');
    await this.mutex.run(async () => {
      const match = lookupImage(this.records, input);
      if (match === undefined) return;
      if (match.by !== 'tag' || match.record.repoTags.length <= 1) {
        await this.dropRecord(match.record);
        return;
      }
      const repoTags = match.record.repoTags.filter((t) => t !== match.name);
      const next = this.records.map((r) => (r.id === match.record.id ? { ...r, repoTags } : r));
      await this.recordFile.save(next);
      this.records = next;
    });
    return {};
  }

  /** Must run under the mutex. */
  private async dropRecord(record: ImageRecord): Promise<void> {
    if (this.opts.isImageInUse(record.id)) {
      throw precondition('IMAGE_IN_USE', `image ${record.id} (${record.repoTags.join(', ') || 'untagged'}) is used by a container`);
    }
    const next = this.records.filter((r) => r.id !== record.id);
    await this.recordFile.save(next);
    this.records = next;
    this.opts.logger.info({ id: record.id, repoTags: record.repoTags, blobs: referencedBlobs(record).length }, 'image removed');
    await this.collect(false);
  }

  /** ImageFsInfo: allocated bytes and inodes of `<stateDir>/images` (blobs and unpacked trees). */
  async imageFsInfo(_request: unknown = {}, _call: CallOptions = {}): Promise<ImageFsInfoResponseMessage> {
    // Concurrent callers share one walk of the tree.
    this.usageRun ??= (async () => {
      try {
        return await imageFsUsage(this.root);
      } finally {
        this.usageRun = undefined;
      }
    })();
    return this.usageRun;
  }
}
