/**
 * The identities confined QEMUs run as (hypervisor.vmmIdentities): one number per sandbox, used as
 * its uid and gid, leased node-wide so that the daemon and every shim (each with its own state
 * dir) never hand the same one to two pods.
 *
 * A lease is a file `<leaseDir>/<number>` created exclusively (O_EXCL), holding the sandbox id and
 * the absolute path of the sandbox record that holds it. The record is written before the lease
 * is taken and the lease released after the record is gone, so a lease whose record file no
 * longer exists is stale (a crash between the two steps, a shim's state dir lost with /run at a
 * reboot) and is taken over: never while a record holds it. Taking one over renames it aside first
 * and puts it back if what was moved is not what was judged stale, as the state-dir lock does.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, exhausted } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { KataConfig, VmmIdentityConfig } from '../../config/types.js';
import type { VmmIdentity } from '../../hypervisor/index.js';

/** Who holds a lease: the sandbox and the file of its record. */
export interface LeaseOwner {
  sandboxId: string;
  /** Absolute path of the sandbox's record file (RecordStore directory + `<id>.json`). */
  recordFile: string;
}

/** What recovery found for a recorded identity. */
export type LeaseCheck = 'held' | 'restored' | 'held-by-another';

/** The lease owner of sandbox `id` whose records `store` keeps. */
export function leaseOwnerOf(store: { directory: string }, id: string): LeaseOwner {
  return { sandboxId: id, recordFile: path.join(store.directory, `${id}.json`) };
}

function leaseText(owner: LeaseOwner): string {
  return `${JSON.stringify({ sandboxId: owner.sandboxId, record: owner.recordFile })}\n`;
}

function parseLease(text: string): LeaseOwner | undefined {
  try {
    const doc = JSON.parse(text) as { sandboxId?: unknown; record?: unknown };
    if (typeof doc.sandboxId === 'string' && typeof doc.record === 'string') return { sandboxId: doc.sandboxId, recordFile: doc.record };
  } catch {
    // a torn or foreign file: not a lease anyone holds
  }
  return undefined;
}

async function exists(file: string): Promise<boolean> {
  try {
    await fsp.stat(file);
    return true;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return false;
    throw err;
  }
}

async function readText(file: string): Promise<string | undefined> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

export class VmmIdentities {
  constructor(
    private readonly config: VmmIdentityConfig,
    private readonly logger: Logger,
  ) {}

  /** The lease file of `id`. */
  leaseFile(id: number): string {
    return path.join(this.config.leaseDir, String(id));
  }

  /**
   * Take the lowest free number of the range for `owner` (no lease, or a stale one, taken over).
   * RESOURCE_EXHAUSTED when a live record holds every number.
   */
  async acquire(owner: LeaseOwner): Promise<VmmIdentity> {
    const { firstId, count, leaseDir } = this.config;
    await fsp.mkdir(leaseDir, { recursive: true, mode: 0o700 });
    const taken = new Set((await fsp.readdir(leaseDir)).filter((n) => /^[0-9]+$/.test(n)).map(Number));
    const text = leaseText(owner);
    // The lowest number no record holds: one without a lease, or one whose lease is stale.
    for (let id = firstId; id < firstId + count; id++) {
      if (taken.has(id) && !(await this.takeOverIfStale(id))) continue;
      if (await this.create(id, text)) return { uid: id, gid: id };
    }
    throw exhausted(
      'VMM_IDENTITIES_EXHAUSTED',
      `all ${count} VMM identities from ${firstId} are held by sandbox records (leases in ${leaseDir}).`,
    );
  }

  /** Give `id` back, only if its lease is `owner`'s (idempotent: a missing lease is fine). */
  async release(id: number, owner: LeaseOwner): Promise<void> {
    const file = this.leaseFile(id);
    const text = await readText(file);
    if (text === undefined) return;
    const holder = parseLease(text);
    if (holder?.sandboxId !== owner.sandboxId || holder.recordFile !== owner.recordFile) {
      this.logger.warn({ id, lease: file, holder }, 'VMM identity lease belongs to another sandbox; left alone');
      return;
    }
    await fsp.rm(file, { force: true });
  }

  /**
   * Hand the lease of `id` from `from` to `to` (a pooled VM's identity, taken by the pod that
   * claims it; docs/pool.md). Refuses when `from` does not hold it.
   */
  async transfer(id: number, from: LeaseOwner, to: LeaseOwner): Promise<void> {
    const file = this.leaseFile(id);
    const holder = parseLease((await readText(file)) ?? '');
    if (holder?.sandboxId !== from.sandboxId || holder.recordFile !== from.recordFile) {
      throw new Error(`VMM identity ${id}'s lease ${file} is not held by pooled VM ${from.sandboxId}`);
    }
    const tmp = `${file}.${process.pid}.tmp`;
    await fsp.writeFile(tmp, leaseText(to), { mode: 0o600 });
    await fsp.rename(tmp, file);
  }

  /** Every lease naming `owner` released (a creation cut short before its record named the identity). */
  async releaseAllOf(owner: LeaseOwner): Promise<number[]> {
    const released: number[] = [];
    let names: string[];
    try {
      names = await fsp.readdir(this.config.leaseDir);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return released;
      throw err;
    }
    for (const name of names.filter((n) => /^[0-9]+$/.test(n))) {
      const holder = parseLease((await readText(path.join(this.config.leaseDir, name))) ?? '');
      if (holder?.sandboxId === owner.sandboxId && holder.recordFile === owner.recordFile) {
        await fsp.rm(path.join(this.config.leaseDir, name), { force: true });
        released.push(Number(name));
      }
    }
    return released;
  }

  /**
   * After a restart: the record says `owner` holds `id`; make the lease say so too. A missing
   * lease (the lease dir was emptied, e.g. a tmpfs after a reboot) is written again; one that
   * names another live record is reported (two records claim one identity: something edited them).
   */
  async reassert(id: number, owner: LeaseOwner): Promise<LeaseCheck> {
    await fsp.mkdir(this.config.leaseDir, { recursive: true, mode: 0o700 });
    for (let attempt = 0; attempt < 3; attempt++) {
      const text = await readText(this.leaseFile(id));
      if (text === undefined) {
        if (await this.create(id, leaseText(owner))) return 'restored';
        continue;
      }
      const holder = parseLease(text);
      if (holder?.sandboxId === owner.sandboxId && holder.recordFile === owner.recordFile) return 'held';
      if (!(await this.takeOverIfStale(id))) return 'held-by-another';
    }
    return 'held-by-another';
  }

  /** Create the lease file exclusively; false when it exists. */
  private async create(id: number, text: string): Promise<boolean> {
    try {
      await fsp.writeFile(this.leaseFile(id), text, { flag: 'wx', mode: 0o600 });
      return true;
    } catch (err) {
      if (errnoCode(err) === 'EEXIST') return false;
      throw err;
    }
  }

  /**
   * Remove `id`'s lease if its record file is gone (true then, or when the lease vanished
   * meanwhile). Renamed aside first; put back with link(2), which never overwrites, when what was
   * moved is not what was judged stale (another process took the number meanwhile).
   */
  private async takeOverIfStale(id: number): Promise<boolean> {
    const file = this.leaseFile(id);
    const text = await readText(file);
    if (text === undefined) return true;
    const holder = parseLease(text);
    if (holder !== undefined && (await exists(holder.recordFile))) return false;
    const aside = `${file}.stale-${process.pid}`;
    try {
      await fsp.rename(file, aside);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return true;
      throw err;
    }
    const moved = await readText(aside);
    if (moved !== text) {
      await fsp.link(aside, file).catch(() => undefined);
      await fsp.rm(aside, { force: true });
      return false;
    }
    await fsp.rm(aside, { force: true });
    this.logger.warn({ id, lease: file, holder }, 'taking over a VMM identity lease whose sandbox record is gone');
    return true;
  }
}

/** What the sandbox-level helpers below need. */
interface IdentityDeps {
  config: KataConfig;
  store: { directory: string };
  identities?: VmmIdentities;
}

function identitiesOf(deps: IdentityDeps, log: Logger): VmmIdentities {
  return deps.identities ?? new VmmIdentities(deps.config.hypervisor.vmmIdentities, log);
}

/** RemovePodSandbox (and a rolled-back creation): the record's identity given back; nothing without one. */
export async function releaseIdentity(
  deps: IdentityDeps,
  record: { id: string; confinement: { identity: { uid: number } | null } | null },
  log: Logger,
): Promise<void> {
  const owner = leaseOwnerOf(deps.store, record.id);
  const identities = identitiesOf(deps, log);
  const uid = record.confinement?.identity?.uid;
  if (uid !== undefined) await identities.release(uid, owner);
  // A crash between taking the lease and recording it: found by its owner.
  else await identities.releaseAllOf(owner);
}

/** At start: every recorded identity's lease is there again and names its record. */
export async function reassertIdentity(
  deps: IdentityDeps,
  record: { id: string; confinement: { identity: { uid: number } | null } | null },
  log: Logger,
): Promise<void> {
  const uid = record.confinement?.identity?.uid;
  if (uid === undefined) return;
  const check = await identitiesOf(deps, log).reassert(uid, leaseOwnerOf(deps.store, record.id));
  if (check === 'restored') log.warn({ uid }, 'VMM identity lease was missing; written again from the record');
  else if (check === 'held-by-another') log.error({ uid }, 'VMM identity lease names another live sandbox record');
}
