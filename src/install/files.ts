/**
 * The installer's reads and writes: the planner's input gathered from disk (the config, the files
 * its imports resolve to, the install record) and a plan carried out, atomically per file and
 * rolled back as a whole when a step fails.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid } from '../common/errors.js';
import { isDirectory, writeFileAtomic } from '../common/fsutil.js';
import './reasons.js';
import { parseContainerdConfig } from './document.js';
import type { FileChange, InstallInput, InstallPlan, InstallRecord, UninstallInput } from './plan.js';
import type { ContainerdVersion } from './version.js';

export const DEFAULT_CONTAINERD_CONFIG = '/etc/containerd/config.toml';

/** Where the install record and the backup live by default: beside the config (no `*.toml` glob matches them). */
export function defaultStatePath(configPath: string): string {
  return `${configPath}.kata-ts-install.json`;
}
export function defaultBackupPath(configPath: string): string {
  return `${configPath}.kata-ts-backup`;
}

/** A file's text, or null when it does not exist; INVALID_ARGUMENT when its bytes are not UTF-8 (they could not be kept byte for byte). */
export async function readTextFile(file: string): Promise<string | null> {
  let raw: Buffer;
  try {
    raw = await fsp.readFile(file);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return null;
    throw err;
  }
  const text = raw.toString('utf8');
  if (!Buffer.from(text, 'utf8').equals(raw)) throw invalid('CONTAINERD_CONFIG_INVALID', `${file} is not UTF-8 text`);
  return text;
}

function globRegExp(base: string): RegExp {
  const body = base
    .replace(/[.+^${}()|\\]/g, '\\$&')
    .replace(/\*/g, '[^/]*')
    .replace(/\?/g, '[^/]');
  return new RegExp(`^${body}$`);
}

/** An import as containerd resolves it: relative to the importing file's directory; a glob matches in its directory, sorted. */
async function resolveImport(parent: string, pattern: string, root: string | undefined): Promise<{ dir: string; files: string[] }> {
  const abs = path.isAbsolute(pattern) ? path.normalize(pattern) : path.join(path.dirname(parent), pattern);
  const dir = path.dirname(abs);
  if (!/[*?[]/.test(abs)) return { dir, files: [abs] };
  const re = globRegExp(path.basename(abs));
  const names = await fsp.readdir(underRoot(root, dir)).catch(() => [] as string[]);
  return {
    dir,
    files: names
      .filter((n) => re.test(n))
      .sort()
      .map((n) => path.join(dir, n)),
  };
}

/** The config's imports followed as containerd does (breadth first, each file once), with their text. */
export async function readImports(
  configPath: string,
  configText: string,
  root?: string,
): Promise<{ imported: Array<{ path: string; text: string }>; dirs: string[] }> {
  const imported: Array<{ path: string; text: string }> = [];
  const dirs: string[] = [];
  const seen = new Set([configPath]);
  const pending: Array<{ parent: string; text: string }> = [{ parent: configPath, text: configText }];
  while (pending.length > 0) {
    const { parent, text } = pending.shift()!;
    let imports: string[];
    try {
      imports = parseContainerdConfig(parent, text).imports;
    } catch {
      continue; // the planner refuses the invalid file itself, naming it
    }
    for (const pattern of imports) {
      const { dir, files } = await resolveImport(parent, pattern, root);
      if (!dirs.includes(dir)) dirs.push(dir);
      for (const file of files) {
        if (seen.has(file)) continue;
        seen.add(file);
        const t = await readTextFile(underRoot(root, file));
        if (t === null) continue;
        imported.push({ path: file, text: t });
        pending.push({ parent: file, text: t });
      }
    }
  }
  return { imported, dirs };
}

/** The install record, validated; null when there is none. */
export async function readInstallRecord(statePath: string): Promise<InstallRecord | null> {
  const text = await readTextFile(statePath);
  if (text === null) return null;
  let r: unknown;
  try {
    r = JSON.parse(text);
  } catch {
    r = undefined;
  }
  const ok =
    typeof r === 'object' &&
    r !== null &&
    (r as InstallRecord).format === 1 &&
    typeof (r as InstallRecord).configPath === 'string' &&
    Array.isArray((r as InstallRecord).files) &&
    Array.isArray((r as InstallRecord).tables) &&
    Array.isArray((r as InstallRecord).createdDirs) &&
    (r as InstallRecord).files.every(
      (f) =>
        typeof f.path === 'string' &&
        typeof f.sha256 === 'string' &&
        (f.change === 'created' || (f.change === 'edited' && typeof f.backupPath === 'string' && typeof f.appended === 'string')),
    );
  if (!ok) throw invalid('INSTALL_STATE_INVALID', `${statePath} is not a kata-ts install record (format 1)`);
  return r as InstallRecord;
}

export interface InstallPaths {
  configPath: string;
  statePath: string;
  backupPath: string;
  /**
   * Where the host's filesystem is ('' or '/': here). Every path above, in the config and in the
   * record is the host's own; files are read and written below this root (a DaemonSet pod with the
   * host at /host: the config's absolute `imports` still name the host's directories).
   */
  root?: string;
}

/** `p`, a host path, as this process reaches it below `root`. */
export function underRoot(root: string | undefined, p: string): string {
  return root === undefined || root === '' || root === '/' ? p : path.join(root, p);
}

export async function gatherInstallInput(paths: InstallPaths, version: ContainerdVersion): Promise<InstallInput> {
  const { root } = paths;
  const configText = await readTextFile(underRoot(root, paths.configPath));
  const { imported, dirs } = configText === null ? { imported: [], dirs: [] } : await readImports(paths.configPath, configText, root);
  const existingDirs: string[] = [];
  for (const d of dirs) if (await isDirectory(underRoot(root, d))) existingDirs.push(d);
  return {
    configPath: paths.configPath,
    statePath: paths.statePath,
    backupPath: paths.backupPath,
    configText,
    imported,
    existingDirs,
    version,
    record: await readInstallRecord(underRoot(root, paths.statePath)),
  };
}

export async function gatherUninstallInput(paths: InstallPaths): Promise<UninstallInput> {
  const { root } = paths;
  const record = await readInstallRecord(underRoot(root, paths.statePath));
  const files: Record<string, string | null> = {};
  for (const f of record?.files ?? []) {
    files[f.path] = await readTextFile(underRoot(root, f.path));
    if (f.change === 'edited') files[f.backupPath] = await readTextFile(underRoot(root, f.backupPath));
  }
  return { statePath: paths.statePath, record, files };
}

/** Write `text` atomically, keeping an existing file's mode and owner. */
async function writeKeepingOwner(file: string, text: string, mode: number | undefined): Promise<void> {
  const st = await fsp.stat(file).catch(() => undefined);
  const m = st === undefined ? (mode ?? 0o600) : st.mode & 0o7777;
  await writeFileAtomic(file, text, m);
  await fsp.chmod(file, m);
  if (st !== undefined) await fsp.chown(file, st.uid, st.gid);
}

/** Carry a plan out, in order; any failure undoes the steps before it and is thrown. Returns notes (e.g. a directory left because not empty). */
export async function executePlan(plan: InstallPlan, root?: string): Promise<string[]> {
  const undo: Array<() => Promise<void>> = [];
  const notes: string[] = [];
  try {
    for (const c of plan.changes) await apply({ ...c, path: underRoot(root, c.path) }, undo, notes);
  } catch (err) {
    for (const u of undo.reverse()) await u().catch(() => undefined);
    throw err;
  }
  return notes;
}

async function apply(c: FileChange, undo: Array<() => Promise<void>>, notes: string[]): Promise<void> {
  switch (c.op) {
    case 'mkdir':
      await fsp.mkdir(c.path, { mode: 0o755 });
      undo.push(() => fsp.rmdir(c.path));
      return;
    case 'write': {
      const previous = await readTextFile(c.path);
      await writeKeepingOwner(c.path, c.text, c.mode);
      undo.push(() => (previous === null ? fsp.rm(c.path, { force: true }) : writeKeepingOwner(c.path, previous, undefined)));
      return;
    }
    case 'remove': {
      const previous = await readTextFile(c.path);
      const st = await fsp.stat(c.path).catch(() => undefined);
      await fsp.rm(c.path, { force: true });
      if (previous !== null) undo.push(() => writeKeepingOwner(c.path, previous, st === undefined ? undefined : st.mode & 0o7777));
      return;
    }
    case 'rmdir':
      try {
        await fsp.rmdir(c.path);
      } catch (err) {
        const code = errnoCode(err);
        if (code === 'ENOTEMPTY' || code === 'EEXIST') notes.push(`left ${c.path}: other files are in it`);
        else if (code !== 'ENOENT') throw err;
      }
      return;
  }
}
