/**
 * A released VMM identity is quarantined (src/runtime/sandbox/identities.ts), proven by attack on
 * the real /proc: a process left running as a released uid (or holding it only as its gid), a SysV
 * shared memory segment and a message queue created as it, each keep the number from the next pod,
 * and a stale lease whose uid still runs a process is not taken over. The numbers are far from the
 * default range (others' VMs run there) and random per run; every process and IPC object is the
 * test's own, ended by its pid or id.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { type LeaseOwner, VmmIdentities } from '../../../src/runtime/sandbox/identities.js';
import { readUidResidue, statusIds, sysvipcOwners } from '../../../src/runtime/sandbox/identity-residue.js';

const execFileAsync = promisify(execFile);
const QUARANTINE_MS = 60_000;

/** A process running `argv` as uid `uid`, gid `gid` (setpriv), whose pid the test ends. */
function runAs(uid: number, gid: number, argv: string[]): ChildProcess {
  return spawn('setpriv', [`--reuid=${uid}`, `--regid=${gid}`, '--clear-groups', '--', ...argv], { stdio: 'ignore' });
}

/** Until /proc/<pid>/status shows `uid` (setpriv has switched and exec'd). */
async function untilRunningAs(pid: number, id: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    if (statusIds(status).includes(id) && /^Name:\s+sleep$/m.test(status)) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`pid ${pid} never ran as ${id}`);
}

async function endProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
  await exited;
}

describe('VMM identity quarantine (real /proc, processes and SysV IPC of the test)', () => {
  let dir: string;
  let leaseDir: string;
  let first: number;
  let clockMs: number;
  const children: ChildProcess[] = [];
  const ipcIds: Array<['-m' | '-q', string]> = [];

  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-idq-'));
    leaseDir = path.join(dir, 'leases');
    // 3e9 + a random million: no account, no VM of the default range (2e9), no other run's.
    first = 3_000_000_000 + Math.floor(Math.random() * 1000) * 1000;
    clockMs = 1_000_000;
  });
  afterEach(async () => {
    for (const child of children.splice(0)) await endProcess(child);
    for (const [flag, id] of ipcIds.splice(0)) await execFileAsync('ipcrm', [flag, id]).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  });

  const ids = (count: number) =>
    new VmmIdentities({ firstId: first, count, leaseDir, quarantineMs: QUARANTINE_MS }, silentLogger(), { nowMs: () => clockMs });
  async function owner(name: string): Promise<LeaseOwner> {
    const recordFile = path.join(dir, `${name}.json`);
    await writeFile(recordFile, '{}');
    return { sandboxId: name, recordFile };
  }
  /** `owner` takes `first`, its record goes and it releases it; the quarantine delay then passes. */
  async function releasedAndRested(): Promise<void> {
    const a = await owner('a');
    expect(await ids(1).acquire(a)).toEqual({ uid: first, gid: first });
    await rm(a.recordFile);
    await ids(1).release(first, a);
    clockMs += QUARANTINE_MS;
  }

  it('a released number rests for quarantineMs; the next pod gets another one meanwhile, and it afterwards', async () => {
    const a = await owner('a');
    expect(await ids(2).acquire(a)).toEqual({ uid: first, gid: first });
    await rm(a.recordFile);
    await ids(2).release(first, a);
    expect(await ids(2).acquire(await owner('b'))).toEqual({ uid: first + 1, gid: first + 1 });
    clockMs += QUARANTINE_MS - 1;
    await expect(ids(2).acquire(await owner('c'))).rejects.toMatchObject({ kind: 'exhausted', reason: 'VMM_IDENTITIES_EXHAUSTED' });
    clockMs += 1;
    expect(await ids(2).acquire(await owner('c'))).toEqual({ uid: first, gid: first });
  });

  it('attack: a process left running as the released uid keeps it from the next pod until it is ended', async () => {
    await releasedAndRested();
    const child = runAs(first, first, ['sleep', '600']);
    children.push(child);
    await untilRunningAs(child.pid!, first);
    expect((await readUidResidue('/proc', first, first)).get(first)).toEqual([{ kind: 'process', id: child.pid }]);
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
    expect(await ids(2).acquire(await owner('b'))).toEqual({ uid: first + 1, gid: first + 1 });
    await endProcess(child);
    expect(await ids(2).acquire(await owner('c'))).toEqual({ uid: first, gid: first });
  });

  it('attack: a process holding the released number only as its gid keeps it too', async () => {
    await releasedAndRested();
    const child = runAs(65_534, first, ['sleep', '600']);
    children.push(child);
    await untilRunningAs(child.pid!, first);
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
    await endProcess(child);
    expect(await ids(1).acquire(await owner('b'))).toEqual({ uid: first, gid: first });
  });

  it('attack: a SysV shared memory segment and a message queue created as the released uid keep it until removed', async () => {
    await releasedAndRested();
    const shm = /id: (\d+)/.exec(
      (await execFileAsync('setpriv', [`--reuid=${first}`, `--regid=${first}`, '--clear-groups', '--', 'ipcmk', '-M', '4096'])).stdout,
    )?.[1];
    expect(shm).toBeDefined();
    ipcIds.push(['-m', shm!]);
    const msg = /id: (\d+)/.exec(
      (await execFileAsync('setpriv', [`--reuid=${first}`, `--regid=${first}`, '--clear-groups', '--', 'ipcmk', '-Q'])).stdout,
    )?.[1];
    expect(msg).toBeDefined();
    ipcIds.push(['-q', msg!]);
    expect(await readUidResidue('/proc', first, first)).toEqual(
      new Map([
        [
          first,
          [
            { kind: 'shm', id: Number(shm) },
            { kind: 'msg', id: Number(msg) },
          ],
        ],
      ]),
    );
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
    await execFileAsync('ipcrm', ['-m', shm!]);
    // The queue alone still holds it.
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
    await execFileAsync('ipcrm', ['-q', msg!]);
    expect(await ids(1).acquire(await owner('b'))).toEqual({ uid: first, gid: first });
  });

  it('attack: a stale lease (record gone, never released) whose uid still runs a process is not taken over', async () => {
    const a = await owner('a');
    await ids(1).acquire(a);
    await rm(a.recordFile); // a crash: the record went, the lease stayed, QEMU lives on
    const child = runAs(first, first, ['sleep', '600']);
    children.push(child);
    await untilRunningAs(child.pid!, first);
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
    expect(JSON.parse(await readFile(path.join(leaseDir, String(first)), 'utf8')).sandboxId).toBe('a');
    await endProcess(child);
    // Nothing of it left: taken over, at once (a stale lease was never released, so no rest).
    expect(await ids(1).acquire(await owner('b'))).toEqual({ uid: first, gid: first });
  });

  it('recovery: a record that still holds a number whose lease became a release mark gets its lease back (no residue check: its QEMU runs as it)', async () => {
    const a = await owner('a');
    await ids(1).acquire(a);
    await ids(1).release(first, a); // as if a second daemon wrongly released it
    const child = runAs(first, first, ['sleep', '600']); // the record's QEMU
    children.push(child);
    await untilRunningAs(child.pid!, first);
    expect(await ids(1).reassert(first, a)).toBe('restored');
    expect(JSON.parse(await readFile(path.join(leaseDir, String(first)), 'utf8')).sandboxId).toBe('a');
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
  });

  it('sweep removes only release marks that rested and left nothing; a number without any file is still checked', async () => {
    await releasedAndRested();
    const child = runAs(first, first, ['sleep', '600']);
    children.push(child);
    await untilRunningAs(child.pid!, first);
    expect(await ids(1).sweep()).toEqual([]);
    await endProcess(child);
    expect(await ids(1).sweep()).toEqual([first]);
    // A lease dir emptied (a reboot's tmpfs) does not make a number with a process free.
    const again = runAs(first, first, ['sleep', '600']);
    children.push(again);
    await untilRunningAs(again.pid!, first);
    await expect(ids(1).acquire(await owner('b'))).rejects.toMatchObject({ reason: 'VMM_IDENTITIES_EXHAUSTED' });
  });
});

describe('identity residue parsers', () => {
  it('reads real, effective, saved and fs uids and gids of a status', () => {
    expect(statusIds('Name:\tx\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\nGroups:\t9\n')).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  });
  it('finds owner columns by the header of each sysvipc table', () => {
    const sem =
      '       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n         0          3   600          1    10    11    12    13          0 1700000000\n';
    expect(sysvipcOwners(sem, 'sem')).toEqual([{ id: 3, owners: [10, 11, 12, 13] }]);
    expect(sysvipcOwners('', 'shm')).toEqual([]);
  });
});
