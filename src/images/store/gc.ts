import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { digestHex } from '../digest.js';
import type { BlobStore } from './blobs.js';
import type { LeaseSet } from './mutex.js';
import { type ImageRecord, referencedBlobs } from './records.js';

export interface GcResult {
  blobsRemoved: number;
  rootfsRemoved: number;
  tempRemoved: number;
}

export interface GcOptions {
  blobs: BlobStore;
  rootfsDir: string;
  records: readonly ImageRecord[];
  leases: LeaseSet;
  /**
   * Also remove temp files of interrupted transfers and unpacks. Only at start-up: later, a
   * running pull owns them.
   */
  includeTemp: boolean;
  logger: Logger;
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
 * Delete every blob and root filesystem no image record references and no running pull leases:
 * what a crashed or failed pull left, and what RemoveImage freed. Layers shared by several
 * images stay until the last of them goes.
 */
export async function collectGarbage(opts: GcOptions): Promise<GcResult> {
  const keepBlobs = new Set<string>();
  const keepRootfs = new Set<string>();
  for (const record of opts.records) {
    for (const d of referencedBlobs(record)) keepBlobs.add(d);
    keepRootfs.add(digestHex(record.id));
  }
  const result: GcResult = { blobsRemoved: 0, rootfsRemoved: 0, tempRemoved: 0 };
  if (opts.includeTemp) result.tempRemoved += await opts.blobs.cleanIngest();

  for (const digest of await opts.blobs.list()) {
    if (keepBlobs.has(digest) || opts.leases.has(digest)) continue;
    await opts.blobs.remove(digest);
    result.blobsRemoved++;
  }
  for (const name of await listDir(opts.rootfsDir)) {
    if (name.startsWith('.tmp-')) {
      if (!opts.includeTemp) continue;
      result.tempRemoved++;
    } else {
      if (keepRootfs.has(name) || opts.leases.has(`rootfs:${name}`)) continue;
      result.rootfsRemoved++;
    }
    await fsp.rm(path.join(opts.rootfsDir, name), { recursive: true, force: true });
  }
  if (result.blobsRemoved + result.rootfsRemoved + result.tempRemoved > 0) {
    opts.logger.info({ ...result }, 'image store garbage collected');
  }
  return result;
}
