/**
 * The identities confined QEMUs run as (hypervisor.vmmIdentities): one number per sandbox, used as
 * its uid and gid, leased node-wide so that the daemon and every shim (each with its own state
 * dir) never hand the same one to two pods.
 *
 * A lease is a file `<leaseDir>/<number>` created exclusively (O_EXCL), holding the sandbox id and
 * the absolute path of the sandbox record that holds it. The record is written before the lease
 * is taken and the lease released after the record is gone, so a lease whose record file no
 * longer exists is stale (a crash between the two steps, a shim's state dir lost with /run at a
 * reboot). Taking one over renames it aside first and puts it back if what was moved is not what
 * was judged stale, as the state-dir lock does.
 *
 * A released number is quarantined, not handed out at once: its lease file becomes a release mark
 * (`{"releasedAtMs": ...}`), and the number goes to no pod until `quarantineMs` have passed and
 * nothing of it is left on the host, checked at every allocation: no process with it as a uid or
 * gid (a helper that outlived its QEMU would otherwise be the next pod's), no SysV IPC object of
 * it (shared memory outlives its creator). The same check guards a stale lease (its QEMU may still
 * run although the record is gone) and a number without any file (a lease dir emptied by a reboot).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, exhausted } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { KataConfig, VmmIdentityConfig } from '../../config/types.js';
import type { VmmIdentity } from '../../hypervisor/index.js';
import { readUidResidue, type UidResidue } from './identity-residue.js';

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

function releaseText(atMs: number): string {
  return `${JSON.stringify({ releasedAtMs: atMs })}\n`;
}

/** A lease file's content: a holder, a release mark, or neither (torn or foreign). */
type LeaseContent = { kind: 'held'; owner: LeaseOwner } | { kind: 'released'; atMs: number } | { kind: 'unknown' };

function parseLease(text: string): LeaseContent {
  try {
    const doc = JSON.parse(text) as { sandboxId?: unknown; record?: unknown; releasedAtMs?: unknown };
    if (typeof doc.sandboxId === 'string' && typeof doc.record === 'string') {
      return { kind: 'held', owner: { sandboxId: doc.sandboxId, recordFile: doc.record } };
    }
    if (typeof doc.releasedAtMs === 'number' && Number.isFinite(doc.releasedAtMs)) return { kind: 'released', atMs: doc.releasedAtMs };
  } catch {
    // a torn or foreign file: not a lease anyone holds
  }
  return { kind: 'unknown' };
}

function heldBy(content: LeaseContent, owner: LeaseOwner): boolean {
  return content.kind === 'held' && content.owner.sandboxId === owner.sandboxId && content.owner.recordFile === owner.recordFile;
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

/** Where the residue of an identity is read, and the clock of the quarantine (tests pass their own). */
export interface VmmIdentitiesOptions {
  /** /proc by default: processes (`<pid>/status`) and `sysvipc/{shm,msg,sem}`. */
  procRoot?: string;
  /** Date.now by default. */
  nowMs?: () => number;
}

export class VmmIdentities {
  private readonly procRoot: string;
  private readonly nowMs: () => number;

  constructor(
    private readonly config: VmmIdentityConfig,
    private readonly logger: Logger,
    options: VmmIdentitiesOptions = {},
  ) {
    this.procRoot = options.procRoot ?? '/proc';
    this.nowMs = options.nowMs ?? Date.now;
  }

  /** The lease file of `id`. */
  leaseFile(id: number): string {
    return path.join(this.config.leaseDir, String(id));
  }

  /** What of the range's ids is left on the host now (processes, SysV IPC objects). */
  residue(): Promise<UidResidue> {
    const { firstId, count } = this.config;
    return readUidResidue(this.procRoot, firstId, firstId + count - 1);
  }

  /**
   * Take the lowest number of the range that is free for `owner`: nothing of it left on the host,
   * and no lease file, a release mark older than the quarantine, or a stale lease (taken over).
   * RESOURCE_EXHAUSTED when every number is held or quarantined.
   */
  async acquire(owner: LeaseOwner): Promise<VmmIdentity> {
    const { firstId, count, leaseDir } = this.config;
    await fsp.mkdir(leaseDir, { recursive: true, mode: 0o700 });
    const files = new Set((await fsp.readdir(leaseDir)).filter((n) => /^[0-9]+$/.test(n)).map(Number));
    // One snapshot for the whole range: a process can only come to hold an id from one that
    // already does (or from root: this runtime), so nothing appears that the snapshot missed.
    const residue = await this.residue();
    const text = leaseText(owner);
    const now = this.nowMs();
    let left = 0;
    for (let id = firstId; id < firstId + count; id++) {
      if (residue.has(id)) {
        left++;
        continue;
      }
      if (files.has(id) && !(await this.freeToTake(id, now))) continue;
      if (await this.create(id, text)) {
        if (left > 0) this.logger.debug({ skipped: left }, 'VMM identities skipped: processes or IPC objects of theirs are left');
        return { uid: id, gid: id };
      }
    }
    throw exhausted(
      'VMM_IDENTITIES_EXHAUSTED',
      `all ${count} VMM identities from ${firstId} are held by sandbox records or quarantined (leases in ${leaseDir}; ${left} with processes or IPC objects left).`,
    );
  }

  /**
   * Give `id` back, only if its lease is `owner`'s (idempotent: a missing lease is fine): the
   * lease becomes a release mark, and the number rests in quarantine.
   */
  async release(id: number, owner: LeaseOwner): Promise<void> {
    const file = this.leaseFile(id);
    const text = await readText(file);
    if (text === undefined) return;
    const content = parseLease(text);
    if (content.kind === 'released') return;
    if (!heldBy(content, owner)) {
      this.logger.warn({ id, lease: file, holder: content }, 'VMM identity lease belongs to another sandbox; left alone');
      return;
    }
    await this.markReleased(id, text);
  }

  /**
   * Hand the lease of `id` from `from` to `to` (a pooled VM's identity, taken by the pod that
   * claims it; docs/pool.md). Refuses when `from` does not hold it.
   */
  async transfer(id: number, from: LeaseOwner, to: LeaseOwner): Promise<void> {
    const file = this.leaseFile(id);
    if (!heldBy(parseLease((await readText(file)) ?? ''), from)) {
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
      const text = (await readText(path.join(this.config.leaseDir, name))) ?? '';
      if (heldBy(parseLease(text), owner)) {
        await this.markReleased(Number(name), text);
        released.push(Number(name));
      }
    }
    return released;
  }

  /**
   * After a restart: the record says `owner` holds `id`; make the lease say so too. A missing
   * lease (the lease dir was emptied, e.g. a tmpfs after a reboot) is written again, and so is a
   * release mark or a stale lease (the record wins: its QEMU runs as that number, so no residue
   * check here); one that names another live record is reported (two records claim one identity:
   * something edited them).
   */
  async reassert(id: number, owner: LeaseOwner): Promise<LeaseCheck> {
    await fsp.mkdir(this.config.leaseDir, { recursive: true, mode: 0o700 });
    for (let attempt = 0; attempt < 3; attempt++) {
      const text = await readText(this.leaseFile(id));
      if (text === undefined) {
        if (await this.create(id, leaseText(owner))) return 'restored';
        continue;
      }
      const content = parseLease(text);
      if (heldBy(content, owner)) return 'held';
      if (content.kind === 'held' && (await exists(content.owner.recordFile))) return 'held-by-another';
      await this.moveAside(id, text);
    }
    return 'held-by-another';
  }

  /**
   * Release marks whose quarantine is over and whose number left nothing on the host, removed: the
   * number is then as if never used. Allocation does not need this (it judges marks itself); it
   * lets a node (or a test run) leave an empty lease dir once every pod is gone.
   */
  async sweep(): Promise<number[]> {
    const names = await fsp.readdir(this.config.leaseDir).catch(() => [] as string[]);
    const residue = await this.residue();
    const now = this.nowMs();
    const swept: number[] = [];
    for (const name of names.filter((n) => /^[0-9]+$/.test(n))) {
      const id = Number(name);
      // Outside the range the residue was not read: not this configuration's to judge.
      if (id < this.config.firstId || id >= this.config.firstId + this.config.count) continue;
      const text = await readText(this.leaseFile(id));
      if (text === undefined || residue.has(id)) continue;
      const content = parseLease(text);
      if (content.kind === 'released' && now - content.atMs >= this.config.quarantineMs && (await this.moveAside(id, text))) swept.push(id);
    }
    return swept;
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
   * Whether `id`, which has a lease file and nothing left on the host, may be taken now: its file
   * removed when it is a release mark past the quarantine, a stale lease (its record file gone) or
   * unreadable; kept when a record holds it or its quarantine is running.
   */
  private async freeToTake(id: number, now: number): Promise<boolean> {
    const file = this.leaseFile(id);
    const text = await readText(file);
    if (text === undefined) return true;
    const content = parseLease(text);
    if (content.kind === 'released' && now - content.atMs < this.config.quarantineMs) return false;
    if (content.kind === 'held' && (await exists(content.owner.recordFile))) return false;
    if (!(await this.moveAside(id, text))) return false;
    if (content.kind !== 'released') {
      this.logger.warn({ id, lease: file, holder: content }, 'taking over a VMM identity lease whose sandbox record is gone');
    }
    return true;
  }

  /**
   * Remove `id`'s lease file if it still holds `expected` (true then, or when it vanished
   * meanwhile). Renamed aside first; put back with link(2), which never overwrites, when what was
   * moved is not what was judged (another process took the number meanwhile).
   */
  private async moveAside(id: number, expected: string): Promise<boolean> {
    const file = this.leaseFile(id);
    const aside = `${file}.aside-${process.pid}`;
    try {
      await fsp.rename(file, aside);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return true;
      throw err;
    }
    const moved = await readText(aside);
    if (moved !== expected) {
      await fsp.link(aside, file).catch(() => undefined);
      await fsp.rm(aside, { force: true });
      return false;
    }
    await fsp.rm(aside, { force: true });
    return true;
  }

  /**
   * The lease `expected` of `id` turned into a release mark. The lease is moved aside first so
   * that a number another taker meanwhile took over (its record was already gone) is not
   * overwritten; the mark is created exclusively for the same reason.
   */
  private async markReleased(id: number, expected: string): Promise<void> {
    if (!(await this.moveAside(id, expected))) return;
    if (!(await this.create(id, releaseText(this.nowMs())))) {
      this.logger.warn({ id, lease: this.leaseFile(id) }, 'VMM identity was taken again while being released; its new lease is left alone');
    }
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
  record: {
    id: string;
    confinement: { identity: { uid: number } | null } | null;
    tpm?: { identity: { uid: number } | null } | null;
  },
  log: Logger,
): Promise<void> {
  const owner = leaseOwnerOf(deps.store, record.id);
  const identities = identitiesOf(deps, log);
  const uid = record.confinement?.identity?.uid;
  if (uid !== undefined) await identities.release(uid, owner);
  const tpmUid = record.tpm?.identity?.uid;
  if (tpmUid !== undefined) await identities.release(tpmUid, owner);
  // A crash between taking a lease and recording it (QEMU's, or a vtpm pod's swtpm's, taken
  // after QEMU's was recorded): found by its owner.
  if (uid === undefined || (record.tpm == null && record.confinement !== null)) await identities.releaseAllOf(owner);
}

/** At start: every recorded identity's lease is there again and names its record. */
export async function reassertIdentity(
  deps: IdentityDeps,
  record: {
    id: string;
    confinement: { identity: { uid: number } | null } | null;
    tpm?: { identity: { uid: number } | null } | null;
  },
  log: Logger,
): Promise<void> {
  for (const uid of [record.confinement?.identity?.uid, record.tpm?.identity?.uid]) {
    if (uid === undefined) continue;
    const check = await identitiesOf(deps, log).reassert(uid, leaseOwnerOf(deps.store, record.id));
    if (check === 'restored') log.warn({ uid }, 'VMM identity lease was missing; written again from the record');
    else if (check === 'held-by-another') log.error({ uid }, 'VMM identity lease names another live sandbox record');
  }
}
