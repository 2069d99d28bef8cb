/**
 * The start stamp: `<shim.stateRoot>/start-stamp`, what a Node `start` leaves for the native fast
 * path (native/shim-start.c, docs/shim.md "The start fast path"). The fast path cannot validate
 * the kata-ts config against its schema, so it answers only while the config file is the very
 * one a Node `start` loaded successfully: the stamp names the code tree that judged it (the
 * package root, links resolved: another release's schema may judge otherwise; the front compares
 * its own tree), that file and its identity (device, inode, size, mtime and ctime in nanoseconds;
 * any write changes the ctime) and the state root it resolved to. The text is compared byte for byte by the C side, so its layout is fixed here.
 */
import fs, { promises as fsp } from 'node:fs';
import path from 'node:path';
import { writeFileAtomic } from '../common/fsutil.js';
import { packageRoot } from '../common/paths.js';
import { DEFAULT_CONFIG_PATH } from '../config/defaults.js';
import { resolveConfig } from '../config/load.js';
import type { LoadedConfig } from '../config/types.js';
import { crossFieldProblems } from '../config/validate.js';

/** The stamp's file name, directly under the state root. */
export const START_STAMP_FILE = 'start-stamp';
/** The stamp's first line; native/shim-start.c's STAMP_MAGIC. */
export const START_STAMP_MAGIC = 'kata-ts shim start stamp 2';

/** Which file a config came from, as (l)stat told it: what native/shim-start.c compares. */
export interface ConfigIdentity {
  dev: bigint;
  ino: bigint;
  size: bigint;
  mtimeNs: bigint;
  ctimeNs: bigint;
}

const NS_PER_S = 1_000_000_000n;

/** `<seconds>.<nine digits of nanoseconds>`, as the C side prints a timespec. */
function timespecText(ns: bigint): string {
  return `${ns / NS_PER_S}.${(ns % NS_PER_S).toString().padStart(9, '0')}`;
}

/**
 * The stamp's text for a config loaded by the code at `codeRoot` from `configPath` with
 * `identity` (both null: no config file, the built-in defaults) that resolved to `stateRoot` (pure). Null when a path holds a
 * newline (the stamp is line-based; such a config simply never takes the fast path).
 */
export function startStampText(
  codeRoot: string,
  configPath: string | null,
  identity: ConfigIdentity | null,
  stateRoot: string,
): string | null {
  if ([codeRoot, stateRoot, configPath ?? ''].some((p) => p.includes('\n'))) return null;
  const head = `${START_STAMP_MAGIC}\ncode ${codeRoot}\n`;
  if (configPath === null || identity === null) return `${head}config -\nstateRoot ${stateRoot}\n`;
  const { dev, ino, size, mtimeNs, ctimeNs } = identity;
  return `${head}config ${configPath}\nidentity ${dev} ${ino} ${size} ${timespecText(mtimeNs)} ${timespecText(ctimeNs)}\nstateRoot ${stateRoot}\n`;
}

/** The config file's identity now (following symbolic links, as reading it does); undefined when it cannot be stat'ed. */
export function configIdentity(configPath: string): ConfigIdentity | undefined {
  try {
    const st = fs.statSync(configPath, { bigint: true });
    return { dev: st.dev, ino: st.ino, size: st.size, mtimeNs: st.mtimeNs, ctimeNs: st.ctimeNs };
  } catch {
    return undefined;
  }
}

/** This code tree: the package root, links resolved; undefined when it cannot be resolved. */
function codeRoot(): string | undefined {
  try {
    return fs.realpathSync(packageRoot());
  } catch {
    return undefined;
  }
}

function sameIdentity(a: ConfigIdentity, b: ConfigIdentity): boolean {
  return a.dev === b.dev && a.ino === b.ino && a.size === b.size && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs;
}

/**
 * After a successful `start`: record that the config at `configPath` (null: none, the defaults),
 * whose identity was `before` when it was read, is accepted, when it is still that file now (an
 * edit meanwhile leaves no stamp). Written only when the text changes, atomically; a failure to
 * write is no failure of `start` (the next one simply goes through Node again).
 */
export async function recordStartStamp(stateRoot: string, configPath: string | null, before: ConfigIdentity | undefined): Promise<void> {
  let identity: ConfigIdentity | null = null;
  if (configPath !== null) {
    const now = configIdentity(configPath);
    if (before === undefined || now === undefined || !sameIdentity(before, now)) return;
    identity = now;
  }
  const root = codeRoot();
  if (root === undefined) return;
  const text = startStampText(root, configPath, identity, stateRoot);
  if (text === null) return;
  const file = path.join(stateRoot, START_STAMP_FILE);
  try {
    if (fs.readFileSync(file, 'utf8') === text) return;
  } catch {
    // none yet
  }
  try {
    await writeFileAtomic(file, text, 0o600);
  } catch {
    // The state root may not exist yet for a start that failed early; the next start writes it.
  }
}

/**
 * The config at `explicitPath` (else the default file) without the schema's validation, when this
 * code tree's stamp names the file exactly as it is (identity before and after reading it): a Node
 * `start` of this code accepted these very bytes, so loadConfig() would give the same config.
 * Undefined in every other case (no file, no stamp, another tree's, the file changed, anything
 * unexpected): the caller loads it the full way.
 */
export async function loadStampedConfig(explicitPath: string | undefined): Promise<LoadedConfig | undefined> {
  const file = explicitPath ?? DEFAULT_CONFIG_PATH;
  try {
    const before = configIdentity(file);
    const root = codeRoot();
    if (before === undefined || root === undefined) return undefined;
    const doc: unknown = JSON.parse(await fsp.readFile(file, 'utf8'));
    if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) return undefined;
    const after = configIdentity(file);
    if (after === undefined || !sameIdentity(before, after)) return undefined;
    const config = resolveConfig(doc as Record<string, unknown>);
    const want = startStampText(root, file, after, config.shim.stateRoot);
    if (want === null || (await fsp.readFile(path.join(config.shim.stateRoot, START_STAMP_FILE), 'utf8')) !== want) return undefined;
    // Never reached for a config loadConfig refused (it was stamped), but cheap to hold to.
    if (crossFieldProblems(config).length > 0) return undefined;
    return { config, path: file };
  } catch {
    return undefined;
  }
}
