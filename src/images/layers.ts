import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';
import { pathExists } from '../common/fsutil.js';
import type { Logger } from '../common/logger.js';
import { throwIfAborted } from './abort.js';
import { type Digest, digestHex } from './digest.js';
import { applyLayerFile, type UnpackLayer } from './unpack.js';

/**
 * Layers unpacked once each, for overlay mounts: `<images>/layers/<diff id hex>` holds one layer's
 * own files with overlayfs whiteouts, shared by every image that has the layer. Keyed by the diff
 * id (the uncompressed tar's digest, what the tree is a function of), not the blob digest: the same
 * layer compressed two ways is one directory. A directory is unpacked under `.tmp-` and renamed
 * into place only when complete, so a name that exists is a whole layer.
 */
export class LayerStore {
  constructor(readonly dir: string) {}

  async init(): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  pathOf(diffId: Digest): string {
    return path.join(this.dir, digestHex(diffId));
  }

  has(diffId: Digest): Promise<boolean> {
    return pathExists(this.pathOf(diffId));
  }

  /** Names of the stored layer directories (diff id hex) and of unpacks in progress (`.tmp-*`). */
  async list(): Promise<string[]> {
    try {
      return await fsp.readdir(this.dir);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return [];
      throw err;
    }
  }

  async remove(name: string): Promise<void> {
    await fsp.rm(path.join(this.dir, name), { recursive: true, force: true });
  }

  /**
   * Unpack every layer of `chain` (bottom first) that is not stored yet, each on its own with
   * overlay whiteouts, the ones below as its parents. Returns how many were unpacked.
   */
  async ensure(chain: readonly UnpackLayer[], opts: { signal?: AbortSignal; logger?: Logger }): Promise<number> {
    let unpacked = 0;
    for (const [i, layer] of chain.entries()) {
      throwIfAborted(opts.signal);
      const final = this.pathOf(layer.diffId);
      if (await pathExists(final)) continue;
      const parents = chain
        .slice(0, i)
        .reverse()
        .map((l) => this.pathOf(l.diffId));
      const tmp = path.join(this.dir, `.tmp-${digestHex(layer.diffId)}-${randomBytes(6).toString('hex')}`);
      await fsp.mkdir(tmp, { mode: 0o755 });
      try {
        const s = await applyLayerFile(tmp, layer.file, {
          layer: layer.digest,
          expectedDiffId: layer.diffId,
          signal: opts.signal,
          logger: opts.logger,
          whiteouts: 'overlay',
          parents,
        });
        try {
          await fsp.rename(tmp, final);
        } catch (err) {
          // Another pull unpacked the same layer first: its tree is the same.
          if (errnoCode(err) !== 'ENOTEMPTY' && errnoCode(err) !== 'EEXIST') throw err;
          await fsp.rm(tmp, { recursive: true, force: true });
        }
        unpacked++;
        opts.logger?.debug({ layer: layer.digest, diffId: layer.diffId, entries: s.entries, whiteouts: s.whiteouts }, 'layer unpacked');
      } catch (err) {
        await fsp.rm(tmp, { recursive: true, force: true });
        throw err;
      }
    }
    return unpacked;
  }
}
