/**
 * `doctor`'s identity-range check (src/cli/doctor-identities.ts) on etc trees of the test's own:
 * an account, a group, a subordinate uid or gid range overlapping hypervisor.vmmIdentities is a
 * failure naming the file, line and entry; entries beside the range, comments and a host without
 * subuid/subgid are fine; held and quarantined leases are counted apart.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { identityOverlaps, identityRangeCheck } from '../../../src/cli/doctor-identities.js';

const FIRST = 2_000_000_000;
const LAST = FIRST + 65_535;

describe('identityOverlaps (pure)', () => {
  it('finds accounts by uid or primary gid, groups by gid, subordinate ranges that meet the range', () => {
    const texts = {
      passwd: `root:x:0:0:root:/root:/bin/bash\nq:x:${FIRST + 5}:100::/:/bin/false\nr:x:1000:${LAST}::/:/bin/false\nafter:x:${LAST + 1}:1::/:/x\n`,
      group: `# comment\nwheel:x:10:\nvmm:x:${FIRST}:\n`,
      subuid: `alice:100000:65536\nbob:${FIRST - 10}:11\ncarol:${FIRST - 10}:10\n`,
      subgid: `dave:${LAST}:1\nbroken:x:y\nzero:${FIRST}:0\n`,
    };
    expect(identityOverlaps(texts, FIRST, LAST)).toEqual([
      { file: 'passwd', line: 2, entry: `q (uid ${FIRST + 5}, gid 100)` },
      { file: 'passwd', line: 3, entry: `r (uid 1000, gid ${LAST})` },
      { file: 'group', line: 3, entry: `vmm (gid ${FIRST})` },
      { file: 'subuid', line: 2, entry: `bob (${FIRST - 10}-${FIRST})` },
      { file: 'subgid', line: 1, entry: `dave (${LAST}-${LAST})` },
    ]);
  });
});

describe('identityRangeCheck (etc and lease dir of the test)', () => {
  let dir: string;
  let etc: string;
  let leaseDir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-doctor-ids-'));
    etc = path.join(dir, 'etc');
    leaseDir = path.join(dir, 'leases');
    await mkdir(etc);
    await mkdir(leaseDir);
    await writeFile(path.join(etc, 'passwd'), 'root:x:0:0:root:/root:/bin/bash\n');
    await writeFile(path.join(etc, 'group'), 'root:x:0:\n');
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const ids = () => ({ firstId: FIRST, count: 65_536, leaseDir, quarantineMs: 30_000 });

  it('ok without subuid/subgid files, counting held and quarantined leases apart', async () => {
    await writeFile(path.join(leaseDir, String(FIRST)), JSON.stringify({ sandboxId: 'a', record: '/r/a.json' }));
    await writeFile(path.join(leaseDir, String(FIRST + 1)), JSON.stringify({ releasedAtMs: 1 }));
    const check = await identityRangeCheck(ids(), etc);
    expect(check).toEqual({
      name: 'vmm-identity-range',
      verdict: 'ok',
      message: `uids/gids ${FIRST}-${LAST}: 1 leased, 1 in quarantine (30000 ms and until nothing of them is left) in ${leaseDir}; no account, group or subordinate range of ${etc} in it`,
    });
  });

  it('fails naming every overlapping entry with its file and line', async () => {
    await writeFile(path.join(etc, 'subuid'), `alice:100000:65536\nrootless:${FIRST + 100}:65536\n`);
    await writeFile(path.join(etc, 'subgid'), `rootless:${FIRST + 100}:65536\n`);
    const check = await identityRangeCheck(ids(), etc);
    expect(check.verdict).toBe('fail');
    expect(check.message).toContain(`${path.join(etc, 'subuid')}:2 rootless (${FIRST + 100}-${FIRST + 100 + 65_535})`);
    expect(check.message).toContain(`${path.join(etc, 'subgid')}:1 rootless`);
    expect(check.message).not.toContain('alice');
    expect(check.message).toContain('hypervisor.vmmIdentities.firstId');
  });
});
