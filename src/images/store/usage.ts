import { type BigIntStats, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../../common/errors.js';
import { epochNs } from '../../common/time.js';
import type { ImageFsInfoResponseMessage } from '../cri-types.js';

export interface DiskUsage {
  /** Allocated bytes (st_blocks * 512), each inode counted once. */
  usedBytes: number;
  inodesUsed: number;
}

/**
 * What `du` would say for `root`: allocated blocks rather than apparent sizes (sparse files,
 * small-file overhead), hard-linked inodes counted once. Files vanishing during the walk
 * (a concurrent GC) are skipped.
 */
export async function diskUsage(root: string): Promise<DiskUsage> {
  const seen = new Set<string>();
  let usedBytes = 0;
  const stack = [root];
  while (stack.length > 0) {
    const p = stack.pop() as string;
    let st: BigIntStats;
    try {
      st = await fsp.lstat(p, { bigint: true });
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') continue;
      throw err;
    }
    const key = `${st.dev}:${st.ino}`;
    if (seen.has(key)) continue;
    seen.add(key);
    usedBytes += Number(st.blocks) * 512;
    if (st.isDirectory()) {
      let names: string[] = [];
      try {
        names = await fsp.readdir(p);
      } catch (err) {
        if (errnoCode(err) !== 'ENOENT') throw err;
      }
      for (const n of names) stack.push(path.join(p, n));
    }
  }
  return { usedBytes, inodesUsed: seen.size };
}

/** The ImageFsInfo answer for a store rooted at `root` (its own mountpoint id; containers share it). */
export async function imageFsUsage(root: string): Promise<ImageFsInfoResponseMessage> {
  const usage = await diskUsage(root);
  return {
    image_filesystems: [
      {
        timestamp: epochNs().toString(),
        fs_id: { mountpoint: root },
        used_bytes: { value: String(usage.usedBytes) },
        inodes_used: { value: String(usage.inodesUsed) },
      },
    ],
    container_filesystems: [],
  };
}
