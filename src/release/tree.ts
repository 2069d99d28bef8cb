/**
 * What a release holds, read from a built kata-ts tree (a checkout after `npm run build`, or a
 * release dir): `package.json`, `bin/`, `dist/`, `proto/` (the CRI server loads its .proto files
 * at run time), and the production part of `node_modules` (the packages `dependencies` and
 * `optionalDependencies` reach, resolved as node resolves them, nested copies included; no dev
 * tools, no `.bin`). Its content hash names the release: the same tree always gets the same id.
 */
import { createHash } from 'node:crypto';
import { createReadStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid } from '../common/errors.js';
import './reasons.js';

/** The top-level parts copied as they are. */
export const TREE_PARTS = ['package.json', 'bin', 'dist', 'proto'] as const;
/** Files a tree must have to be a built kata-ts. */
export const REQUIRED_FILES = [
  'package.json',
  'bin/kata-ts.js',
  'bin/containerd-shim-kata-ts-v2',
  'dist/cli/entry.js',
  'dist/shim/main.js',
  // The jailer every confined QEMU starts through (scripts/build-native.sh).
  'dist/native/kata-ts-jailer',
  // containerd's port-forward into a pod's guest (src/shim/port-forward.ts; scripts/build-native.sh).
  'dist/native/kata-ts-portfwd',
  // A pod's ttrpc relay in front of the node shim server (docs/shim.md#the-relay; scripts/build-native.sh).
  'dist/native/kata-ts-shim-relay',
  // What containerd execs as the shim (layout.ts BIN_LINKS; docs/shim.md, "The start fast path").
  'dist/native/kata-ts-shim-start',
];

export interface TreeEntry {
  /** Relative to the tree's root, '/'-separated. */
  rel: string;
  kind: 'dir' | 'file' | 'symlink';
  /** Permission bits. */
  mode: number;
  /** Bytes (files). */
  size: number;
  /** The link's target (symlinks). */
  target?: string;
}

export interface SourceTree {
  /** The tree's real directory. */
  root: string;
  /** package.json's `name` and `version`. */
  version: string;
  /** Sorted by rel; parents before children. */
  entries: TreeEntry[];
  files: number;
  bytes: number;
}

interface PackageJson {
  name?: unknown;
  version?: unknown;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
}

async function readPackageJson(file: string): Promise<PackageJson | undefined> {
  try {
    return JSON.parse(await fsp.readFile(file, 'utf8')) as PackageJson;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return undefined;
    throw err;
  }
}

function depNames(pkg: PackageJson): string[] {
  return [...Object.keys(pkg.dependencies ?? {}), ...Object.keys(pkg.optionalDependencies ?? {})];
}

/**
 * The production packages' directories (relative, e.g. `node_modules/@grpc/grpc-js`), found as
 * node resolves a require from each package: its own node_modules first, then each parent's.
 * `hasPackage(rel)` says whether `<rel>/package.json` exists and returns it. A dependency found
 * nowhere is skipped when optional, else it is an error (the tree is not installed).
 */
export async function productionPackages(
  rootPkg: PackageJson,
  readPkg: (rel: string) => Promise<PackageJson | undefined>,
): Promise<string[]> {
  const found = new Set<string>();
  const queue: Array<{ from: string; pkg: PackageJson }> = [{ from: '', pkg: rootPkg }];
  while (queue.length > 0) {
    const { from, pkg } = queue.shift()!;
    const optional = new Set(Object.keys(pkg.optionalDependencies ?? {}));
    for (const name of depNames(pkg)) {
      let dir = from;
      let hit: { rel: string; pkg: PackageJson } | undefined;
      for (;;) {
        const rel = path.posix.join(dir, 'node_modules', name);
        const p = await readPkg(rel);
        if (p !== undefined) {
          hit = { rel, pkg: p };
          break;
        }
        if (dir === '') break;
        const up = path.posix.dirname(dir);
        dir = up === '.' ? '' : up;
      }
      if (hit === undefined) {
        if (optional.has(name)) continue;
        throw invalid(
          'RELEASE_SOURCE_INCOMPLETE',
          `the dependency ${name} (of ${from === '' ? 'kata-ts' : from}) is not installed; run npm ci.`,
        );
      }
      if (found.has(hit.rel)) continue;
      found.add(hit.rel);
      queue.push({ from: hit.rel, pkg: hit.pkg });
    }
  }
  return [...found].sort();
}

/** Walk `dir` (relative `rel`), appending entries; `skip(rel)` prunes a subtree. */
async function walk(root: string, rel: string, out: TreeEntry[], skip: (rel: string) => boolean): Promise<void> {
  const abs = path.join(root, rel);
  const st = await fsp.lstat(abs);
  if (st.isSymbolicLink()) {
    out.push({ rel, kind: 'symlink', mode: 0o777, size: 0, target: await fsp.readlink(abs) });
    return;
  }
  if (st.isFile()) {
    out.push({ rel, kind: 'file', mode: st.mode & 0o7777, size: st.size });
    return;
  }
  if (!st.isDirectory()) return; // sockets, FIFOs: not part of a program
  out.push({ rel, kind: 'dir', mode: st.mode & 0o7777, size: 0 });
  for (const name of (await fsp.readdir(abs)).sort()) {
    const child = path.posix.join(rel, name);
    if (!skip(child)) await walk(root, child, out, skip);
  }
}

/** Read a built tree: check it is complete, list what a release copies of it. */
export async function readSourceTree(dir: string): Promise<SourceTree> {
  let root: string;
  try {
    root = await fsp.realpath(dir);
  } catch {
    throw invalid('RELEASE_SOURCE_INCOMPLETE', `--from ${dir} does not exist.`);
  }
  for (const rel of REQUIRED_FILES) {
    try {
      await fsp.access(path.join(root, rel));
    } catch {
      throw invalid(
        'RELEASE_SOURCE_INCOMPLETE',
        `${root} is not a built kata-ts: ${rel} is missing${rel.startsWith('dist/') ? ' (run npm run build)' : ''}.`,
      );
    }
  }
  const pkg = (await readPackageJson(path.join(root, 'package.json'))) ?? {};
  if (pkg.name !== 'kata-ts' || typeof pkg.version !== 'string') {
    throw invalid('RELEASE_SOURCE_INCOMPLETE', `${root}/package.json is not kata-ts's (name "kata-ts" and a version).`);
  }
  // node_modules may itself be a symlink (a git worktree sharing one): its packages are read through it.
  const packages = await productionPackages(pkg, (rel) => readPackageJson(path.join(root, rel, 'package.json')));
  const entries: TreeEntry[] = [];
  for (const part of TREE_PARTS) await walk(root, part, entries, () => false);
  if (packages.length > 0) entries.push({ rel: 'node_modules', kind: 'dir', mode: 0o755, size: 0 });
  const wanted = new Set(packages);
  // Scope directories (`node_modules/@grpc`) and intermediate `node_modules` dirs of nested packages.
  const parents = new Set<string>();
  for (const rel of packages) {
    for (let d = path.posix.dirname(rel); d !== 'node_modules' && d !== '.'; d = path.posix.dirname(d)) {
      if (!wanted.has(d)) parents.add(d);
    }
  }
  for (const d of [...parents].sort()) entries.push({ rel: d, kind: 'dir', mode: 0o755, size: 0 });
  for (const rel of packages) {
    // A package's own node_modules holds its nested dependencies: those come as packages of their own.
    await walk(root, rel, entries, (child) => child === `${rel}/node_modules` || path.posix.basename(child) === '.bin');
  }
  const unique = new Map(entries.map((e) => [e.rel, e]));
  const sorted = [...unique.values()].sort((a, b) => (a.rel < b.rel ? -1 : a.rel > b.rel ? 1 : 0));
  const files = sorted.filter((e) => e.kind === 'file');
  return { root, version: pkg.version, entries: sorted, files: files.length, bytes: files.reduce((n, e) => n + e.size, 0) };
}

async function fileSha256(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** The tree's content hash: every entry's kind, path, mode and content (file digest or link target). */
export async function treeSha256(tree: SourceTree, onFile?: (done: number) => void): Promise<string> {
  const hash = createHash('sha256');
  let done = 0;
  for (const e of tree.entries) {
    let body = '';
    if (e.kind === 'file') {
      body = await fileSha256(path.join(tree.root, e.rel));
      onFile?.(++done);
    } else if (e.kind === 'symlink') body = e.target ?? '';
    hash.update(`${e.kind}\0${e.rel}\0${e.mode.toString(8)}\0${body}\n`);
  }
  return hash.digest('hex');
}
