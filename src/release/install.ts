/**
 * The release commands' effects on disk: read the layout, copy a release (into
 * `releases/.incoming-<id>-<pid>`, renamed to `releases/<id>` once complete, so a release dir is
 * complete or absent), flip `current` and the bin links (a temporary symlink renamed over the old
 * one: readers see the old or the new target, never none), remove releases.
 */
import { randomBytes } from 'node:crypto';
import { constants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, precondition } from '../common/errors.js';
import { fsyncDir } from '../common/fsutil.js';
import { BIN_LINKS, INCOMING_PREFIX, RELEASE_INFO_FILE, type ReleasePaths, validateReleaseId } from './layout.js';
import type { InstallStep, LayoutState, LinkState } from './plan.js';
import type { SourceTree } from './tree.js';
import './reasons.js';

async function linkState(p: string): Promise<LinkState> {
  try {
    const st = await fsp.lstat(p);
    if (!st.isSymbolicLink()) return { kind: 'other' };
    return { kind: 'link', target: await fsp.readlink(p) };
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return { kind: 'missing' };
    throw err;
  }
}

/** The complete releases under releases/ (sorted); [] when there is no such dir yet. */
export async function listReleaseIds(paths: ReleasePaths): Promise<string[]> {
  let names: string[];
  try {
    names = await fsp.readdir(paths.releasesDir);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return [];
    throw err;
  }
  const out: string[] = [];
  for (const name of names.sort()) {
    if (name.startsWith('.')) continue;
    try {
      validateReleaseId(name);
    } catch {
      continue;
    }
    if ((await fsp.stat(path.join(paths.releasesDir, name)).catch(() => undefined))?.isDirectory()) out.push(name);
  }
  return out;
}

export async function readLayout(paths: ReleasePaths): Promise<LayoutState> {
  const bins: Record<string, LinkState> = {};
  for (const { name } of BIN_LINKS) bins[name] = await linkState(path.join(paths.binDir, name));
  return { releases: await listReleaseIds(paths), current: await linkState(paths.current), bins };
}

/** Throws RELEASE_PREFIX_NOT_WRITABLE unless `dir` (or its nearest existing parent) can be written. */
export async function checkWritable(dir: string, flag: string): Promise<void> {
  let probe = dir;
  for (;;) {
    try {
      await fsp.access(probe, constants.W_OK | constants.X_OK);
      return;
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') {
        throw precondition('RELEASE_PREFIX_NOT_WRITABLE', `${flag} ${dir} is not writable (${probe}: ${errnoCode(err) ?? 'denied'}).`);
      }
    }
    const up = path.dirname(probe);
    if (up === probe) throw precondition('RELEASE_PREFIX_NOT_WRITABLE', `${flag} ${dir} cannot be created.`);
    probe = up;
  }
}

/** Replace (or create) symlink `p` -> `target` atomically. */
async function swapSymlink(p: string, target: string): Promise<void> {
  await fsp.mkdir(path.dirname(p), { recursive: true });
  const tmp = path.join(path.dirname(p), `.${path.basename(p)}.${randomBytes(6).toString('hex')}.tmp`);
  await fsp.symlink(target, tmp);
  try {
    await fsp.rename(tmp, p);
  } catch (err) {
    await fsp.rm(tmp, { force: true });
    throw err;
  }
  await fsyncDir(path.dirname(p));
}

export interface CopyProgress {
  files: number;
  bytes: number;
  totalFiles: number;
  totalBytes: number;
}

/** What a release says about itself (RELEASE.json). */
export interface ReleaseInfo {
  id: string;
  version: string;
  contentSha256: string;
  /** The tree it was copied from. */
  from: string;
  /** ISO 8601. */
  installedAt: string;
}

export async function readReleaseInfo(paths: ReleasePaths, id: string): Promise<ReleaseInfo | undefined> {
  try {
    const v = JSON.parse(await fsp.readFile(path.join(paths.releasesDir, id, RELEASE_INFO_FILE), 'utf8')) as Partial<ReleaseInfo>;
    if (typeof v.id !== 'string' || typeof v.version !== 'string' || typeof v.installedAt !== 'string') return undefined;
    return v as ReleaseInfo;
  } catch {
    return undefined;
  }
}

/** Copy `tree` to `releases/<id>` (complete, then renamed into place). False when another install got there first. */
async function copyRelease(
  paths: ReleasePaths,
  tree: SourceTree,
  info: ReleaseInfo,
  onProgress: (p: CopyProgress) => void,
): Promise<boolean> {
  await fsp.mkdir(paths.releasesDir, { recursive: true, mode: 0o755 });
  const staging = path.join(paths.releasesDir, `${INCOMING_PREFIX}${info.id}-${process.pid}`);
  await fsp.rm(staging, { recursive: true, force: true });
  await fsp.mkdir(staging, { mode: 0o755 });
  const progress: CopyProgress = { files: 0, bytes: 0, totalFiles: tree.files, totalBytes: tree.bytes };
  try {
    for (const e of tree.entries) {
      const to = path.join(staging, e.rel);
      if (e.kind === 'dir') await fsp.mkdir(to, { recursive: true, mode: e.mode & 0o777 });
      else if (e.kind === 'symlink') await fsp.symlink(e.target ?? '', to);
      else {
        await fsp.copyFile(path.join(tree.root, e.rel), to);
        await fsp.chmod(to, e.mode & 0o777);
        progress.files++;
        progress.bytes += e.size;
        onProgress(progress);
      }
    }
    // Directories made before their files may have been given modes without write: fix them now.
    for (const e of tree.entries) if (e.kind === 'dir') await fsp.chmod(path.join(staging, e.rel), e.mode & 0o777);
    await fsp.writeFile(path.join(staging, RELEASE_INFO_FILE), `${JSON.stringify(info, null, 2)}\n`, { mode: 0o644 });
    try {
      await fsp.rename(staging, path.join(paths.releasesDir, info.id));
    } catch (err) {
      if (errnoCode(err) === 'ENOTEMPTY' || errnoCode(err) === 'EEXIST') {
        await fsp.rm(staging, { recursive: true, force: true });
        return false;
      }
      throw err;
    }
    await fsyncDir(paths.releasesDir);
    return true;
  } catch (err) {
    await fsp.rm(staging, { recursive: true, force: true });
    throw err;
  }
}

export interface ExecuteOptions {
  tree?: SourceTree;
  info?: ReleaseInfo;
  onStep?: (step: InstallStep) => void;
  onProgress?: (p: CopyProgress) => void;
}

/**
 * Do the planned steps in order: the copy, then `current`, then the links. A failure after the
 * copy leaves the complete release dir (a later install or prune deals with it) and the links as
 * they were or already switched: every step alone leaves a working layout.
 */
export async function executeInstall(paths: ReleasePaths, steps: readonly InstallStep[], options: ExecuteOptions = {}): Promise<void> {
  for (const step of steps) {
    options.onStep?.(step);
    if (step.kind === 'copy') {
      if (options.tree === undefined || options.info === undefined) throw new Error('copy planned without a source tree');
      await copyRelease(paths, options.tree, options.info, options.onProgress ?? (() => undefined));
    } else if (step.kind === 'current') await swapSymlink(paths.current, step.target);
    else await swapSymlink(step.path, step.target);
  }
}

/** Remove release `id`'s dir: renamed aside first, so that it is gone from the list at once, then deleted. */
export async function removeRelease(paths: ReleasePaths, id: string): Promise<void> {
  validateReleaseId(id);
  const dir = path.join(paths.releasesDir, id);
  const aside = path.join(paths.releasesDir, `.removing-${id}-${process.pid}`);
  await fsp.rename(dir, aside);
  await fsp.rm(aside, { recursive: true, force: true });
}

/**
 * Copies left by an install that did not finish (`.incoming-<id>-<pid>` whose pid is gone) and
 * removals cut short (`.removing-*`): safe to delete.
 */
export async function abandonedDirs(paths: ReleasePaths): Promise<string[]> {
  const names = await fsp.readdir(paths.releasesDir).catch(() => [] as string[]);
  const out: string[] = [];
  for (const name of names.sort()) {
    const m = /^\.(incoming|removing)-.*-([0-9]+)$/.exec(name);
    if (m === null) continue;
    const pid = Number(m[2]);
    // An install still copying (its pid lives; a reused pid only delays the cleanup) is left alone.
    if (
      pid !== process.pid &&
      (await fsp.access(`/proc/${pid}`).then(
        () => true,
        () => false,
      ))
    )
      continue;
    out.push(path.join(paths.releasesDir, name));
  }
  return out;
}
