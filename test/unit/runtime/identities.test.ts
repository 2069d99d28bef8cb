/**
 * VMM identity leases (src/runtime/sandbox/identities.ts) on a real lease directory: the lowest
 * free number, distinct numbers for concurrent takers (the daemon and shims share the directory),
 * a lease held while its record exists and taken over once that record is gone, release only by
 * the holder, and recovery writing a lost lease again from the record.
 */
import { chown, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { type LeaseOwner, VmmIdentities } from '../../../src/runtime/sandbox/identities.js';
import { checkVmmSockets } from '../../../src/runtime/sandbox/recover.js';

const FIRST = 2_000_000_000;

describe('VMM identity leases', () => {
  let dir: string;
  let leaseDir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-ids-'));
    leaseDir = path.join(dir, 'leases');
    await mkdir(path.join(dir, 'proc'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  // An empty proc root: other engineers' VMs run as numbers of this range on the same machine, and
  // what is left of a number is the subject of identity-quarantine.test.ts. No quarantine here.
  const ids = (count = 4) =>
    new VmmIdentities({ firstId: FIRST, count, leaseDir, quarantineMs: 0 }, silentLogger(), { procRoot: path.join(dir, 'proc') });
  /** A sandbox whose record file exists (as it does before its lease is taken). */
  async function owner(name: string): Promise<LeaseOwner> {
    const recordFile = path.join(dir, `${name}.json`);
    await writeFile(recordFile, '{}');
    return { sandboxId: name, recordFile };
  }

  it('hands out the lowest free number, uid = gid, and writes who holds it', async () => {
    const a = await owner('a');
    const b = await owner('b');
    expect(await ids().acquire(a)).toEqual({ uid: FIRST, gid: FIRST });
    expect(await ids().acquire(b)).toEqual({ uid: FIRST + 1, gid: FIRST + 1 });
    expect(JSON.parse(await readFile(path.join(leaseDir, String(FIRST)), 'utf8'))).toEqual({ sandboxId: 'a', record: a.recordFile });
    await ids().release(FIRST, a);
    expect(await ids().acquire(await owner('c'))).toEqual({ uid: FIRST, gid: FIRST });
  });

  it('concurrent takers (a daemon and shims) never get the same number; the range running out is RESOURCE_EXHAUSTED', async () => {
    const owners = await Promise.all(['a', 'b', 'c', 'd', 'e', 'f'].map(owner));
    const results = await Promise.allSettled(owners.map((o) => ids(4).acquire(o)));
    const got = results.filter((r) => r.status === 'fulfilled').map((r) => (r as PromiseFulfilledResult<{ uid: number }>).value.uid);
    expect(got.sort()).toEqual([FIRST, FIRST + 1, FIRST + 2, FIRST + 3]);
    const refused = results.filter((r) => r.status === 'rejected').map((r) => (r as PromiseRejectedResult).reason);
    expect(refused).toHaveLength(2);
    for (const err of refused) expect(err).toMatchObject({ kind: 'exhausted', reason: 'VMM_IDENTITIES_EXHAUSTED' });
  });

  it('a lease whose record is gone (a crash, a lost state dir) is taken over; one whose record exists never is', async () => {
    const a = await owner('a');
    const b = await owner('b');
    await ids(2).acquire(a);
    await ids(2).acquire(b);
    await expect(ids(2).acquire(await owner('c'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
    await rm(a.recordFile);
    expect(await ids(2).acquire(await owner('d'))).toEqual({ uid: FIRST, gid: FIRST });
    expect(JSON.parse(await readFile(path.join(leaseDir, String(FIRST)), 'utf8')).sandboxId).toBe('d');
    // A torn or foreign file names no live record either.
    await writeFile(path.join(leaseDir, String(FIRST + 2)), 'garbage');
    expect(await ids(3).acquire(await owner('e'))).toEqual({ uid: FIRST + 2, gid: FIRST + 2 });
    expect((await readdir(leaseDir)).sort()).toEqual([String(FIRST), String(FIRST + 1), String(FIRST + 2)]);
  });

  it('release gives back only the holder’s lease; releaseAllOf finds a lease by its owner', async () => {
    const a = await owner('a');
    const b = await owner('b');
    await ids().acquire(a);
    await ids().release(FIRST, b);
    expect(await readdir(leaseDir)).toEqual([String(FIRST)]);
    await ids().release(FIRST + 3, a); // none: fine
    expect(await ids().releaseAllOf(a)).toEqual([FIRST]);
    // A release mark, not a lease: nothing names `a` any more.
    expect(JSON.parse(await readFile(path.join(leaseDir, String(FIRST)), 'utf8'))).toEqual({ releasedAtMs: expect.any(Number) });
    expect(await ids().releaseAllOf(a)).toEqual([]);
  });

  it('recovery: a lost lease is written again from the record; a lease of another live record is reported, not taken', async () => {
    const a = await owner('a');
    const b = await owner('b');
    expect(await ids().reassert(FIRST + 1, a)).toBe('restored');
    expect(await ids().reassert(FIRST + 1, a)).toBe('held');
    expect(await ids().reassert(FIRST + 1, b)).toBe('held-by-another');
    await rm(a.recordFile);
    expect(await ids().reassert(FIRST + 1, b)).toBe('restored');
    // And the next taker skips it.
    expect(await ids().acquire(await owner('c'))).toEqual({ uid: FIRST, gid: FIRST });
    expect(await ids().acquire(await owner('d'))).toEqual({ uid: FIRST + 2, gid: FIRST + 2 });
  });
});

describe('re-attaching a confined VMM checks its sockets first', () => {
  it('a socket of the VMM passes; a link in its place, or another owner’s socket, is VMM_SOCKET_REPLACED', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-vmmsock-'));
    const server = net.createServer();
    try {
      const qmp = path.join(dir, 'qmp.sock');
      await new Promise<void>((resolve) => server.listen(qmp, resolve));
      const record = (uid: number, qmpSocket: string) => ({
        vmm: { pid: 1, startTimeTicks: 1, workDir: dir, qmpSocket, readySocket: path.join(dir, 'gone.sock'), consoleLog: '', qemuLog: '' },
        confinement: { seccomp: null, identity: { uid, gid: uid, lease: '/x' }, jailDir: null, vmmDir: dir, optOutReason: null },
      });
      await chown(qmp, FIRST, FIRST);
      await expect(checkVmmSockets(record(FIRST, qmp))).resolves.toBeUndefined();
      await expect(checkVmmSockets(record(FIRST + 1, qmp))).rejects.toMatchObject({ reason: 'VMM_SOCKET_REPLACED' });
      const link = path.join(dir, 'link.sock');
      await symlink(qmp, link);
      await expect(checkVmmSockets(record(FIRST, link))).rejects.toMatchObject({
        reason: 'VMM_SOCKET_REPLACED',
        details: { socketKind: 'symlink' },
      });
      // A root QEMU (no identity) is not checked.
      await expect(checkVmmSockets({ ...record(FIRST, link), confinement: null })).resolves.toBeUndefined();
    } finally {
      server.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
