/**
 * A container's private root filesystem, made from its image in one of two ways:
 * - `overlay` (where overlayfs works): an overlay mount of the image's layer directories with an
 *   upper and a work directory of the container's own, at `<dir>/merged`. Constant time and no
 *   disk beyond what the container writes. Mounted by the daemon, so in the runtime's own mount
 *   namespace (docs/security.md): the host's mount table never holds it.
 * - `copy` (the fallback, and images unpacked flat by an older kata-ts): `cp -a --reflink=auto`
 *   of the image's flat tree into `<dir>` itself (see snapshot.ts).
 *
 * Every failure rolls back: no mount, link or directory is left.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { alreadyExists, errnoCode, errorMessage, internal } from '../common/errors.js';
import { pathExists } from '../common/fsutil.js';
import type { Logger } from '../common/logger.js';
import { throwIfAborted } from './abort.js';
import { containerRootfsDirs, planOverlayMount } from './overlay-plan.js';
import { createContainerSnapshot, removeContainerSnapshot } from './snapshot.js';

const run = promisify(execFile);

/** Where a container's root filesystem comes from (ImageService.rootfsSourceFor). */
export type RootfsSource =
  /** The image's layer directories, top layer first. */
  | { kind: 'layers'; lowerDirs: string[] }
  /** An image unpacked flat (copy mode, or a store from before layers). */
  | { kind: 'flat'; dir: string };

/** What a container's record keeps of an overlay root filesystem: enough to mount it again. */
export interface OverlayRootfsRecord {
  /** `<stateDir>/rootfs/<containerId>` */
  dir: string;
  /** The layer directories, top first. */
  lowerDirs: string[];
}

export interface CreatedRootfs {
  /** The container's root filesystem (the overlay's mount point, or the copy). */
  path: string;
  /** null for a copy. */
  overlay: OverlayRootfsRecord | null;
}

/**
 * Make the root filesystem of a container in `dir` (which must not exist): an overlay for a
 * layered image, a copy for a flat one. ALREADY_EXISTS when `dir` exists.
 */
export async function createContainerRootfs(
  source: RootfsSource,
  dir: string,
  opts: { signal?: AbortSignal; logger?: Logger } = {},
): Promise<CreatedRootfs> {
  if (source.kind === 'flat') {
    await createContainerSnapshot(source.dir, dir, opts);
    return { path: dir, overlay: null };
  }
  const plan = planOverlayMount(source.lowerDirs, dir);
  if (await pathExists(dir)) throw alreadyExists('SNAPSHOT_EXISTS', `container root filesystem ${dir} already exists`);
  throwIfAborted(opts.signal);
  await fsp.mkdir(path.dirname(dir), { recursive: true, mode: 0o700 });
  try {
    await prepareDirs(dir, source.lowerDirs);
    await mountOverlay(source.lowerDirs, dir);
  } catch (err) {
    await removeContainerRootfs({ dir, lowerDirs: source.lowerDirs }, opts.logger).catch(() => undefined);
    throw err;
  }
  opts.logger?.debug({ dir, layers: source.lowerDirs.length, options: plan.options }, 'container root filesystem mounted');
  return { path: containerRootfsDirs(dir).merged, overlay: { dir, lowerDirs: [...source.lowerDirs] } };
}

async function prepareDirs(dir: string, lowerDirs: readonly string[]): Promise<void> {
  const d = containerRootfsDirs(dir);
  await fsp.mkdir(dir, { mode: 0o700 });
  // upper's mode is the root directory's in the merged view until written: the top layer's.
  await fsp.mkdir(d.upper, { mode: 0o755 });
  await fsp.mkdir(d.work, { mode: 0o700 });
  await fsp.mkdir(d.merged, { mode: 0o755 });
  await fsp.mkdir(d.links, { mode: 0o700 });
  const { links } = planOverlayMount(lowerDirs, dir);
  for (const l of links) await fsp.symlink(l.target, path.join(dir, l.name));
}

/** Mount the overlay at `<dir>/merged` (links and dirs made). INTERNAL ROOTFS_MOUNT_FAILED with mount's complaint. */
async function mountOverlay(lowerDirs: readonly string[], dir: string): Promise<void> {
  const plan = planOverlayMount(lowerDirs, dir);
  for (const l of lowerDirs) {
    if (!(await pathExists(l)))
      throw internal('IMAGE_LAYER_MISSING', `layer directory ${l} is missing; pull the image again`, { details: { layer: l } });
  }
  try {
    await run(plan.argv[0] as string, plan.argv.slice(1), { cwd: plan.cwd });
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim() || errorMessage(err);
    throw internal('ROOTFS_MOUNT_FAILED', `the overlay for ${dir} could not be mounted: ${stderr}`);
  }
}

/** Whether `p` is a mount point (in this process's mount namespace). */
export async function isMountPoint(p: string): Promise<boolean> {
  try {
    await run('mountpoint', ['-q', '--', p]);
    return true;
  } catch {
    return false;
  }
}

/**
 * After a daemon restart: the overlay of a container whose record names it is mounted again when
 * it is not mounted (the runtime's namespace went, or a crash came between mount and record).
 */
export async function ensureOverlayMounted(rec: OverlayRootfsRecord): Promise<'mounted' | 'remounted'> {
  const d = containerRootfsDirs(rec.dir);
  if (await isMountPoint(d.merged)) return 'mounted';
  if (!(await pathExists(d.upper)) || !(await pathExists(d.work))) {
    throw internal('ROOTFS_MOUNT_FAILED', `the upper directory of ${rec.dir} is gone; the container's writes are lost`);
  }
  await fsp.mkdir(d.merged, { recursive: true, mode: 0o755 });
  await fsp.rm(d.links, { recursive: true, force: true });
  await fsp.mkdir(d.links, { mode: 0o700 });
  for (const l of planOverlayMount(rec.lowerDirs, rec.dir).links) await fsp.symlink(l.target, path.join(rec.dir, l.name));
  await mountOverlay(rec.lowerDirs, rec.dir);
  return 'remounted';
}

/**
 * Unmount an overlay root filesystem and remove its directory (upper, work, links). Idempotent. A
 * busy mount (a bind of it still somewhere) is detached lazily. INTERNAL ROOTFS_UNMOUNT_FAILED when
 * it stays mounted: the directory is then kept (removing an upper under a live mount is not ours).
 */
export async function removeContainerRootfs(rec: OverlayRootfsRecord, logger?: Logger): Promise<void> {
  const d = containerRootfsDirs(rec.dir);
  if (await isMountPoint(d.merged)) {
    await run('umount', ['--', d.merged]).catch(async (err: unknown) => {
      logger?.warn({ dir: rec.dir, err: errorMessage(err) }, 'root filesystem busy; detaching it');
      await run('umount', ['--lazy', '--', d.merged]).catch(() => undefined);
    });
    if (await isMountPoint(d.merged)) {
      throw internal('ROOTFS_UNMOUNT_FAILED', `the root filesystem at ${d.merged} could not be unmounted`);
    }
  }
  await fsp.rm(rec.dir, { recursive: true, force: true });
}

/** Remove a copied root filesystem (a missing one is fine). */
export { removeContainerSnapshot };

/**
 * Container root filesystem dirs under `rootfsDir` that no record names, for recovery to tear
 * down: an overlay left mounted by a create that crashed before its record was written.
 */
export async function orphanRootfsDirs(rootfsDir: string, known: ReadonlySet<string>): Promise<string[]> {
  let names: string[];
  try {
    names = await fsp.readdir(rootfsDir);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return [];
    throw err;
  }
  return names.filter((n) => !known.has(n) && !n.startsWith('.tmp-')).map((n) => path.join(rootfsDir, n));
}
