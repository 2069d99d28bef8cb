import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { digestHex } from '../digest.js';
import type { LayerStore } from '../layers.js';
import type { BlobStore } from './blobs.js';
import type { LeaseSet } from './mutex.js';
import { type ImageRecord, referencedBlobs } from './records.js';

export interface GcResult {
  blobsRemoved: number;
  rootfsRemoved: number;
  layersRemoved: number;
  tempRemoved: number;
}

export interface GcOptions {
  blobs: BlobStore;
  rootfsDir: string;
  layers: LayerStore;
  records: readonly ImageRecord[];
  leases: LeaseSet;
  /** Layer directories (diff id hex) a container's overlay stacks: kept whatever the records say. */
  layersInUse: ReadonlySet<string>;
  /**
   * Also remove temp files of interrupted transfers and unpacks. Only at start-up: later, a
   * running pull owns them.
   */
  includeTemp: boolean;
  logger: Logger;
}

/** What the store holds, by name, for the planner. */
export interface StoreListing {
  blobs: readonly string[];
  rootfs: readonly string[];
  layers: readonly string[];
}

/** What a collection removes (names as listed). */
export interface GcPlan {
  blobs: string[];
  rootfs: string[];
  layers: string[];
}

/**
 * What garbage collection removes (pure): every blob, flat tree and layer directory no image
 * record references, no running pull leases (`<digest>`, `rootfs:<hex>`, `layer:<hex>`) and, for
 * layers, no container's overlay stacks; temp names (`.tmp-*`, `.probe-*`) only when `includeTemp`
 * (at start-up; later a running pull owns them). A layer shared by several images stays until the
 * last of them goes; a layer a running container stacks stays even after its image went.
 */
export function planGarbage(
  listing: StoreListing,
  records: readonly ImageRecord[],
  keep: { leased: (key: string) => boolean; layersInUse: ReadonlySet<string>; includeTemp: boolean },
): GcPlan {
  const keepBlobs = new Set<string>();
  const keepRootfs = new Set<string>();
  const keepLayers = new Set<string>(keep.layersInUse);
  for (const record of records) {
    for (const d of referencedBlobs(record)) keepBlobs.add(d);
    if (record.unpacked === 'flat') keepRootfs.add(digestHex(record.id));
    else for (const l of record.layers) keepLayers.add(digestHex(l.diffId));
  }
  const isTemp = (n: string): boolean => n.startsWith('.tmp-') || n.startsWith('.probe-');
  const sweep = (names: readonly string[], kept: Set<string>, lease: (n: string) => string): string[] =>
    names.filter((n) => (isTemp(n) ? keep.includeTemp : !kept.has(n) && !keep.leased(lease(n))));
  return {
    blobs: listing.blobs.filter((d) => !keepBlobs.has(d) && !keep.leased(d)),
    rootfs: sweep(listing.rootfs, keepRootfs, (n) => `rootfs:${n}`),
    layers: sweep(listing.layers, keepLayers, (n) => `layer:${n}`),
  };
}

async function listDir(dir: string): Promise<string[]> {
  try {
    return await fsp.readdir(dir);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return [];
    throw err;
  }
}

/**
 * Delete what planGarbage picks: what a crashed or failed pull left, and what RemoveImage freed.
 */
export async function collectGarbage(opts: GcOptions): Promise<GcResult> {
  const result: GcResult = { blobsRemoved: 0, rootfsRemoved: 0, layersRemoved: 0, tempRemoved: 0 };
  if (opts.includeTemp) result.tempRemoved += await opts.blobs.cleanIngest();
  const plan = planGarbage(
    { blobs: await opts.blobs.list(), rootfs: await listDir(opts.rootfsDir), layers: await opts.layers.list() },
    opts.records,
    { leased: (k) => opts.leases.has(k), layersInUse: opts.layersInUse, includeTemp: opts.includeTemp },
  );
  const temp = (n: string): boolean => n.startsWith('.');
  for (const digest of plan.blobs) {
    await opts.blobs.remove(digest as `sha256:${string}`);
    result.blobsRemoved++;
  }
  for (const name of plan.rootfs) {
    await fsp.rm(path.join(opts.rootfsDir, name), { recursive: true, force: true });
    if (temp(name)) result.tempRemoved++;
    else result.rootfsRemoved++;
  }
  for (const name of plan.layers) {
    await opts.layers.remove(name);
    if (temp(name)) result.tempRemoved++;
    else result.layersRemoved++;
  }
  if (result.blobsRemoved + result.rootfsRemoved + result.layersRemoved + result.tempRemoved > 0) {
    opts.logger.info({ ...result }, 'image store garbage collected');
  }
  return result;
}
