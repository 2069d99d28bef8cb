/**
 * The release layout on a node (docs/operations.md, "Installing on a node and upgrading"):
 *
 *     <prefix>/releases/<id>/     one complete kata-ts: package.json, bin/, dist/, proto/, the
 *                                 production node_modules, RELEASE.json; present only complete
 *     <prefix>/current            a relative symlink to releases/<id>: the release new processes run
 *     <binDir>/kata-ts            a relative symlink to <prefix>/current/bin/kata-ts.js
 *     <binDir>/containerd-shim-kata-ts-v2, containerd-shim-kata-ts-cvm-v2
 *                                 relative symlinks to <prefix>/current/dist/native/kata-ts-shim-start,
 *                                 the native start front (docs/shim.md, "The start fast path"),
 *                                 which hands what it does not answer to bin/<the link's name> of
 *                                 the release it resolves to
 *
 * A process started through a link runs the release `current` named at that moment: node
 * resolves its main script's symlinks, so every module it loads later (a lazy `import()`) comes
 * from that release's real directory, whatever `current` says by then. The shim's children
 * (`serve`, `cleanup`) are started from that real directory too (see `selfScript`).
 *
 * Pure: paths and names only; nothing here touches the disk except `runningRelease`.
 */
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { invalid } from '../common/errors.js';
import { packageRoot } from '../common/paths.js';
import './reasons.js';

export const DEFAULT_PREFIX = '/opt/kata-ts';
export const DEFAULT_BIN_DIR = '/usr/local/bin';
export const RELEASES_DIR = 'releases';
export const CURRENT_LINK = 'current';
/** What a release says about itself, at its root (written by the install, not part of its hash). */
export const RELEASE_INFO_FILE = 'RELEASE.json';
/** A release being copied: `releases/.incoming-<id>-<pid>`, renamed to `releases/<id>` once complete. */
export const INCOMING_PREFIX = '.incoming-';

/** The native start front both shim names link to (scripts/build-native.sh builds it into dist/native). */
export const SHIM_START_FRONT = 'dist/native/kata-ts-shim-start';

/** The programs linked into the bin dir: link name -> the file it runs, relative to the release's root. */
export const BIN_LINKS: ReadonlyArray<{ name: string; target: string }> = [
  { name: 'kata-ts', target: 'bin/kata-ts.js' },
  { name: 'containerd-shim-kata-ts-v2', target: SHIM_START_FRONT },
  { name: 'containerd-shim-kata-ts-cvm-v2', target: SHIM_START_FRONT },
];

const ID = /^[A-Za-z0-9][A-Za-z0-9._+-]*$/;
const ID_MAX_CHARS = 100;
/** How many hex digits of the content hash name a release. */
export const HASH_CHARS = 12;

/** Throws RELEASE_ID_INVALID unless `id` can name a release directory. */
export function validateReleaseId(id: string): void {
  if (id.length === 0 || id.length > ID_MAX_CHARS || !ID.test(id) || id.startsWith(INCOMING_PREFIX)) {
    throw invalid(
      'RELEASE_ID_INVALID',
      `release id "${id}" is not valid: it must be 1-${ID_MAX_CHARS} letters, digits, ".", "_", "+" or "-", starting with a letter or digit.`,
    );
  }
}

/** `<version>-<first HASH_CHARS hex digits of the content hash>`; the version's odd characters become "_". */
export function releaseId(version: string, contentSha256: string): string {
  if (!/^[0-9a-f]{64}$/.test(contentSha256))
    throw invalid('RELEASE_ID_INVALID', `content hash "${contentSha256}" is not a sha256 hex digest.`);
  const v = version.replace(/[^A-Za-z0-9._+-]/g, '_').replace(/^[^A-Za-z0-9]+/, '') || 'unversioned';
  const id = `${v.slice(0, ID_MAX_CHARS - HASH_CHARS - 1)}-${contentSha256.slice(0, HASH_CHARS)}`;
  validateReleaseId(id);
  return id;
}

export interface ReleasePaths {
  prefix: string;
  binDir: string;
  releasesDir: string;
  current: string;
}

/** The layout's paths; both roots must be absolute. */
export function releasePaths(prefix: string, binDir: string): ReleasePaths {
  for (const [flag, p] of [
    ['--prefix', prefix],
    ['--bin-dir', binDir],
  ] as const) {
    if (!path.isAbsolute(p)) throw invalid('RELEASE_PATH_INVALID', `${flag} must be an absolute path, got "${p}".`);
  }
  const root = path.resolve(prefix);
  return { prefix: root, binDir: path.resolve(binDir), releasesDir: path.join(root, RELEASES_DIR), current: path.join(root, CURRENT_LINK) };
}

/** What `current` holds for release `id` (relative, so the prefix may be seen under another root, as /host in a DaemonSet). */
export function currentTarget(id: string): string {
  return path.join(RELEASES_DIR, id);
}

/** The release id a `current` link target names, or undefined when it names something else. */
export function releaseOfCurrentTarget(target: string): string | undefined {
  const parts = path
    .normalize(target)
    .split(path.sep)
    .filter((p) => p !== '');
  const at = parts.lastIndexOf(RELEASES_DIR);
  if (at < 0 || at !== parts.length - 2) return undefined;
  return parts[at + 1];
}

/** A bin link's target: relative from the bin dir to `<prefix>/current/<target>` (valid under any common root). */
export function binLinkTarget(paths: ReleasePaths, target: string): string {
  return path.relative(paths.binDir, path.join(paths.current, target));
}

/** Which release a kata-ts tree is: its id when it is `<...>/releases/<id>`, else null (a checkout). */
export interface CodeRelease {
  /** null: not a release dir (a developer checkout). */
  id: string | null;
  /** The tree's real directory. */
  dir: string;
}

/** The release of the tree at real directory `dir`. */
export function releaseOfDir(dir: string): CodeRelease {
  const parent = path.basename(path.dirname(dir));
  const name = path.basename(dir);
  return { id: parent === RELEASES_DIR && ID.test(name) ? name : null, dir };
}

/** The release the running code comes from (its package root, symlinks resolved). */
export function runningRelease(): CodeRelease {
  return releaseOfDir(realpathSync(packageRoot()));
}

/**
 * The script to run this program again with, from the running code's own release: the running
 * tree's `bin/<the name it was started as>`, so that a child runs the code of its parent even
 * when `current` moved meanwhile, and keeps the name (the shim's handler is its binary's name).
 * Undefined when the tree has no such script.
 */
export function selfScript(invokedAs: string, treeDir: string, exists: (p: string) => boolean): string | undefined {
  const own = path.join(treeDir, 'bin', path.basename(invokedAs));
  return exists(own) ? own : undefined;
}
