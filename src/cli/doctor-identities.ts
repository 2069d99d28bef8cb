/**
 * `doctor`'s check of the VMM identity range (hypervisor.vmmIdentities) against the host's own
 * ids: a confined QEMU runs as a number of that range, so an account or group with it, or a
 * subordinate range of /etc/subuid or /etc/subgid covering it (a rootless container's user
 * namespace maps its ids there), would share files, signals and IPC with that QEMU. Every overlap
 * is a failure naming the entry. Also counts the leases: held, and quarantined after release.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';
import type { VmmIdentityConfig } from '../config/types.js';

/** The check as doctor prints it (a DoctorCheck; declared here, since doctor.ts imports this file). */
export interface IdentityRangeCheck {
  name: 'vmm-identity-range';
  verdict: 'ok' | 'fail';
  message: string;
}

/** One entry of the host's id files that falls in (or overlaps) the range. */
export interface IdentityOverlap {
  file: 'passwd' | 'group' | 'subuid' | 'subgid';
  /** Line number (1-based) in the file. */
  line: number;
  /** The entry as `name (ids)`. */
  entry: string;
}

const idIn = (first: number, last: number, field: string | undefined): boolean =>
  field !== undefined && /^[0-9]+$/.test(field) && Number(field) >= first && Number(field) <= last;

/**
 * Entries of passwd, group, subuid and subgid texts whose ids meet [first, last]: a passwd
 * account by its uid or primary gid, a group by its gid, a subordinate range `name:start:count`
 * when [start, start + count) overlaps. Comments and malformed lines are skipped. Pure.
 */
export function identityOverlaps(texts: Partial<Record<IdentityOverlap['file'], string>>, first: number, last: number): IdentityOverlap[] {
  const out: IdentityOverlap[] = [];
  for (const file of ['passwd', 'group', 'subuid', 'subgid'] as const) {
    const lines = (texts[file] ?? '').split('\n');
    lines.forEach((raw, i) => {
      const line = raw.trim();
      if (line === '' || line.startsWith('#')) return;
      const f = line.split(':');
      if (file === 'passwd' && (idIn(first, last, f[2]) || idIn(first, last, f[3]))) {
        out.push({ file, line: i + 1, entry: `${f[0]} (uid ${f[2]}, gid ${f[3]})` });
      } else if (file === 'group' && idIn(first, last, f[2])) {
        out.push({ file, line: i + 1, entry: `${f[0]} (gid ${f[2]})` });
      } else if ((file === 'subuid' || file === 'subgid') && /^[0-9]+$/.test(f[1] ?? '') && /^[0-9]+$/.test(f[2] ?? '')) {
        const start = Number(f[1]);
        const end = start + Number(f[2]) - 1;
        if (Number(f[2]) > 0 && start <= last && end >= first) out.push({ file, line: i + 1, entry: `${f[0]} (${start}-${end})` });
      }
    });
  }
  return out;
}

async function readOrEmpty(file: string): Promise<string> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch (err) {
    // A host without subordinate ids (no shadow-utils) has nothing there to overlap.
    if (errnoCode(err) === 'ENOENT') return '';
    throw err;
  }
}

/** Lease files of the lease dir: held by a sandbox, and release marks (quarantine). */
async function leaseCounts(leaseDir: string): Promise<{ held: number; quarantined: number }> {
  const names = await fsp.readdir(leaseDir).catch(() => [] as string[]);
  let held = 0;
  let quarantined = 0;
  for (const name of names.filter((n) => /^[0-9]+$/.test(n))) {
    const text = await fsp.readFile(path.join(leaseDir, name), 'utf8').catch(() => '');
    if (text.includes('"releasedAtMs"')) quarantined++;
    else held++;
  }
  return { held, quarantined };
}

/**
 * The `vmm-identity-range` check: fail naming every entry of `<etcRoot>/{passwd,group,subuid,
 * subgid}` that overlaps the range, ok otherwise; the message counts held and quarantined leases.
 */
export async function identityRangeCheck(ids: VmmIdentityConfig, etcRoot = '/etc'): Promise<IdentityRangeCheck> {
  const last = ids.firstId + ids.count - 1;
  const texts = {
    passwd: await readOrEmpty(path.join(etcRoot, 'passwd')),
    group: await readOrEmpty(path.join(etcRoot, 'group')),
    subuid: await readOrEmpty(path.join(etcRoot, 'subuid')),
    subgid: await readOrEmpty(path.join(etcRoot, 'subgid')),
  };
  const overlaps = identityOverlaps(texts, ids.firstId, last);
  const leases = await leaseCounts(ids.leaseDir);
  const range = `uids/gids ${ids.firstId}-${last}: ${leases.held} leased, ${leases.quarantined} in quarantine (${ids.quarantineMs} ms and until nothing of them is left) in ${ids.leaseDir}`;
  if (overlaps.length === 0)
    return { name: 'vmm-identity-range', verdict: 'ok', message: `${range}; no account, group or subordinate range of ${etcRoot} in it` };
  const named = overlaps.map((o) => `${path.join(etcRoot, o.file)}:${o.line} ${o.entry}`);
  return {
    name: 'vmm-identity-range',
    verdict: 'fail',
    message: `${range}; a confined QEMU would share ids with ${named.join(', ')}: move hypervisor.vmmIdentities.firstId past them`,
  };
}
