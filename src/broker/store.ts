/**
 * The broker's configuration as files in its state directory: the policy, the reference sets and
 * the resources. The admin commands change them (each change validated first, each file replaced
 * atomically); a running `serve` notices a change by the files' identity (inode, size, mtime) and
 * reloads, keeping what it had when the new file does not validate (and logging why), so an
 * operator's mistake never leaves the broker without a policy.
 */
import { constants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { JWE_MAX_PLAINTEXT_BYTES } from '../attest/jwe.js';
import { formatResourcePath, parseResourcePath } from '../attest/resource-path.js';
import { errnoCode, invalid, notFound } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import type { ReferenceValues } from '../measure/reference-values.js';
import type { DecisionSink } from './decisions.js';
import { type BrokerPolicy, checkPolicy, parsePolicyText } from './policy.js';
import { checkReferenceName, parseReferenceText, referenceFromInput } from './references.js';
import type { BrokerPaths } from './state.js';
import './reasons.js';

/** Largest resource stored (the JWE's plaintext cap). */
export const RESOURCE_MAX_BYTES = JWE_MAX_PLAINTEXT_BYTES;
/** Largest policy or reference file read. */
export const CONFIG_FILE_MAX_BYTES = 4 * 1024 * 1024;
/** Reference sets at most. */
export const MAX_REFERENCE_SETS = 1024;

/** Reads a regular file without following a link, up to `maxBytes`; undefined when missing. */
async function readRegular(file: string, maxBytes: number): Promise<Buffer | undefined> {
  let handle: fsp.FileHandle;
  try {
    handle = await fsp.open(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw invalid('BROKER_STATE_INVALID', `${file} is not a regular file`);
    if (st.size > maxBytes) throw invalid('BROKER_STATE_INVALID', `${file} is ${st.size} bytes, over ${maxBytes}`);
    const buf = Buffer.alloc(st.size);
    const { bytesRead } = await handle.read(buf, 0, st.size, 0);
    return buf.subarray(0, bytesRead);
  } finally {
    await handle.close();
  }
}

function identity(st: { ino: number; size: number; mtimeMs: number }): string {
  return `${st.ino}:${st.size}:${st.mtimeMs}`;
}

// ---- admin side: each operation validates, then writes atomically ----

/** The file of a resource: resources/<repository>/<type>/<tag> (segments cannot be `.` or `..`). */
export function resourceFile(paths: BrokerPaths, resourcePath: string): string {
  const p = parseResourcePath(resourcePath);
  return path.join(paths.resourcesDir, p.repository, p.type, p.tag);
}

/** `resource set`: stores the bytes 0600; never prints them. */
export async function setResource(paths: BrokerPaths, resourcePath: string, data: Buffer): Promise<void> {
  const file = resourceFile(paths, resourcePath);
  if (data.byteLength > RESOURCE_MAX_BYTES)
    throw invalid('BROKER_RESOURCE_INVALID', `resource ${resourcePath} is ${data.byteLength} bytes, over ${RESOURCE_MAX_BYTES}`, {
      details: { field: 'file' },
    });
  await fsp.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
  await writeFileAtomic(file, data, 0o600);
}

/** `resource delete`. */
export async function deleteResource(paths: BrokerPaths, resourcePath: string): Promise<void> {
  const file = resourceFile(paths, resourcePath);
  try {
    await fsp.unlink(file);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') throw notFound('BROKER_RESOURCE_NOT_FOUND', `no resource ${resourcePath}`);
    throw err;
  }
}

/** `resource list`: paths and sizes, never contents. */
export async function listResources(paths: BrokerPaths): Promise<Array<{ path: string; bytes: number }>> {
  const out: Array<{ path: string; bytes: number }> = [];
  const dirs = async (d: string) => (await fsp.readdir(d, { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory());
  for (const repo of await dirs(paths.resourcesDir))
    for (const type of await dirs(path.join(paths.resourcesDir, repo.name))) {
      const typeDir = path.join(paths.resourcesDir, repo.name, type.name);
      for (const tag of await fsp.readdir(typeDir, { withFileTypes: true })) {
        if (!tag.isFile()) continue;
        const p = `${repo.name}/${type.name}/${tag.name}`;
        try {
          parseResourcePath(p);
        } catch {
          continue; // a temporary file of an atomic write, or something not ours
        }
        out.push({ path: p, bytes: (await fsp.stat(path.join(typeDir, tag.name))).size });
      }
    }
  return out.sort((a, b) => (a.path < b.path ? -1 : 1));
}

/** `reference add`: the document checked, stored as references/<name>.json. */
export async function addReference(paths: BrokerPaths, name: string, input: unknown, source: string): Promise<ReferenceValues> {
  checkReferenceName(name);
  const doc = referenceFromInput(input, source);
  const existing = await listReferenceNames(paths);
  if (!existing.includes(name) && existing.length >= MAX_REFERENCE_SETS)
    throw invalid('BROKER_REFERENCE_INVALID', `the broker holds ${MAX_REFERENCE_SETS} reference sets already`);
  await writeFileAtomic(path.join(paths.referencesDir, `${name}.json`), `${JSON.stringify(doc, null, 2)}\n`, 0o600);
  return doc;
}

/** `reference delete`. */
export async function deleteReference(paths: BrokerPaths, name: string): Promise<void> {
  checkReferenceName(name);
  try {
    await fsp.unlink(path.join(paths.referencesDir, `${name}.json`));
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') throw notFound('BROKER_REFERENCE_NOT_FOUND', `no reference set ${name}`);
    throw err;
  }
}

/** The names of the stored reference sets, sorted. */
export async function listReferenceNames(paths: BrokerPaths): Promise<string[]> {
  const entries = await fsp.readdir(paths.referencesDir).catch(() => [] as string[]);
  return entries
    .filter((f) => f.endsWith('.json'))
    .map((f) => f.slice(0, -'.json'.length))
    .filter((n) => {
      try {
        checkReferenceName(n);
        return true;
      } catch {
        return false;
      }
    })
    .sort();
}

/** Reads one stored reference set. */
export async function readReference(paths: BrokerPaths, name: string): Promise<ReferenceValues> {
  checkReferenceName(name);
  const file = path.join(paths.referencesDir, `${name}.json`);
  const buf = await readRegular(file, CONFIG_FILE_MAX_BYTES);
  if (buf === undefined) throw notFound('BROKER_REFERENCE_NOT_FOUND', `no reference set ${name}`);
  return parseReferenceText(buf.toString('utf8'), file);
}

/** `policy set`: checked, then replaces policy.json. */
export async function setPolicy(paths: BrokerPaths, doc: unknown): Promise<BrokerPolicy> {
  const policy = checkPolicy(doc);
  await writeFileAtomic(paths.policy, `${JSON.stringify(policy, null, 2)}\n`, 0o600);
  return policy;
}

/** The stored policy (`policy show`). */
export async function readPolicy(paths: BrokerPaths): Promise<BrokerPolicy> {
  const buf = await readRegular(paths.policy, CONFIG_FILE_MAX_BYTES);
  if (buf === undefined) throw invalid('BROKER_POLICY_INVALID', `${paths.policy} is missing; run kata-ts broker init`);
  return parsePolicyText(buf.toString('utf8'), paths.policy);
}

// ---- serve side: the live configuration ----

/**
 * What a running broker judges with, reloaded when the files change. `refresh` is called before
 * each request is decided (a stat of the policy and a listing of references/: cheap at the sizes
 * allowed), so an admin change is in force from the next request on.
 */
export class LiveConfig {
  private policyValue: BrokerPolicy;
  private policyId = '';
  private readonly refs = new Map<string, { id: string; doc: ReferenceValues }>();
  private readonly rejected = new Map<string, string>();
  private refreshing: Promise<void> | null = null;

  constructor(
    private readonly paths: BrokerPaths,
    private readonly log: DecisionSink,
    initialPolicy: BrokerPolicy,
  ) {
    this.policyValue = initialPolicy;
  }

  /** Loads everything once; a bad policy at start is an error (serve refuses to start), bad references are skipped and logged. */
  static async load(paths: BrokerPaths, log: DecisionSink): Promise<LiveConfig> {
    const live = new LiveConfig(paths, log, await readPolicy(paths));
    const st = await fsp.stat(paths.policy);
    live.policyId = identity(st);
    await live.refresh();
    return live;
  }

  get policy(): BrokerPolicy {
    return this.policyValue;
  }

  get references(): ReadonlyMap<string, ReferenceValues> {
    return new Map([...this.refs].map(([n, r]) => [n, r.doc]));
  }

  /**
   * Re-reads what changed. Concurrent requests share one pass (a request arriving meanwhile waits
   * for it), so a change is loaded and logged once.
   */
  refresh(): Promise<void> {
    if (this.refreshing === null) {
      this.refreshing = (async () => {
        try {
          await this.refreshPolicy();
          await this.refreshReferences();
        } finally {
          this.refreshing = null;
        }
      })();
    }
    return this.refreshing;
  }

  private async refreshPolicy(): Promise<void> {
    let st: Awaited<ReturnType<typeof fsp.lstat>>;
    try {
      st = await fsp.lstat(this.paths.policy);
    } catch (err) {
      if (this.policyId !== 'missing')
        this.log.record({ event: 'config', outcome: 'kept', what: 'policy', why: `policy.json cannot be read: ${String(err)}` });
      this.policyId = 'missing';
      return;
    }
    const id = identity(st);
    if (id === this.policyId) return;
    this.policyId = id;
    try {
      this.policyValue = await readPolicy(this.paths);
      this.log.record({ event: 'config', outcome: 'reloaded', what: 'policy', resources: this.policyValue.resources.length });
    } catch (err) {
      this.log.record({ event: 'config', outcome: 'kept', what: 'policy', why: (err as Error).message });
    }
  }

  private async refreshReferences(): Promise<void> {
    const names = await listReferenceNames(this.paths);
    for (const gone of [...this.refs.keys()].filter((n) => !names.includes(n))) {
      this.refs.delete(gone);
      this.rejected.delete(gone);
      this.log.record({ event: 'config', outcome: 'reloaded', what: 'reference', name: gone, removed: true });
    }
    for (const name of names) {
      const file = path.join(this.paths.referencesDir, `${name}.json`);
      let id: string;
      try {
        id = identity(await fsp.lstat(file));
      } catch {
        continue; // deleted since the listing
      }
      const held = this.refs.get(name);
      if (held?.id === id || this.rejected.get(name) === id) continue;
      try {
        const doc = await readReference(this.paths, name);
        this.refs.set(name, { id, doc });
        this.rejected.delete(name);
        this.log.record({ event: 'config', outcome: 'reloaded', what: 'reference', name, tee: doc.tee });
      } catch (err) {
        // The last good version (if any) stays in force; this file's identity is remembered so
        // the refusal is logged once, not at every request.
        this.rejected.set(name, id);
        this.log.record({ event: 'config', outcome: 'kept', what: 'reference', name, why: (err as Error).message });
      }
    }
  }

  /** A resource's bytes, or undefined when there is none. */
  async readResource(resourcePath: string): Promise<Buffer | undefined> {
    return readRegular(resourceFile(this.paths, formatResourcePath(parseResourcePath(resourcePath))), RESOURCE_MAX_BYTES);
  }
}
