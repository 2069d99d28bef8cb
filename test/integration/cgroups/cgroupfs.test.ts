/**
 * The cgroupfs driver writing REAL cgroups (v1 hybrid on these machines) inside a private tree
 * the test creates below its own cgroup in every hierarchy and removes afterwards, also on
 * failure. The driver's cgroup root is a directory of links to those private cgroups, so every
 * directory it creates is inside the private tree while the files it writes are the kernel's.
 */
import type { ChildProcess } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { realCgroupFs } from '../../../src/cgroups/fsops.js';
import {
  type CgroupDriver,
  type CgroupFs,
  createCgroupDriver,
  detectCgroupMode,
  type PlacementRecord,
  type VmmLimits,
} from '../../../src/cgroups/index.js';
import { planLimits } from '../../../src/cgroups/limits.js';
import { parseProcCgroup } from '../../../src/cgroups/procfs.js';
import { silentLogger } from '../../../src/common/logger.js';
import { assertMachineClean } from '../../helpers/cgroups-machine.js';
import {
  createPrivateCgroups,
  hierarchy,
  killOwned,
  linkRoot,
  mkdirEverywhere,
  type PrivateCgroups,
  removePrivateCgroups,
  startOwnedSleep,
  treeDeepestFirst,
} from '../../helpers/cgroups-private.js';
import { rejection } from '../../helpers/kata-error.js';

const MiB = 1024 * 1024;
const limits: VmmLimits = { cpuQuotaMillicores: 1500, cpuRequestMillicores: 750, memoryLimitBytes: 640 * MiB };
const podRel = 'kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-acbdcedfe0f1';
const sandboxId = 'ab'.repeat(32);
const leafName = `kata-ts-${sandboxId}`;
/** Hierarchies the driver places the VMM in (v1 controllers, the named systemd one, cgroup2). */
const PLACED = ['cpu', 'cpuacct', 'cpuset', 'memory', 'pids', 'systemd', 'unified'];

let pc: PrivateCgroups;
let root: string;
let owned: ChildProcess[];
let driver: CgroupDriver;

function makeDriver(fs?: CgroupFs): CgroupDriver {
  return createCgroupDriver('cgroupfs', { cgroupRoot: root, dbusAddress: null, logger: silentLogger(), ...(fs ? { fs } : {}) });
}

async function sleeper(): Promise<ChildProcess> {
  const child = await startOwnedSleep(pc, 'home');
  owned.push(child);
  return child;
}

/** hierarchy mount name -> path in /proc/<pid>/cgroup. */
async function procPaths(pid: number): Promise<Record<string, string>> {
  const entries = parseProcCgroup(await fsp.readFile(`/proc/${pid}/cgroup`, 'utf8'));
  const out: Record<string, string> = {};
  for (const h of pc.hierarchies) {
    const e = entries.find((x) => x.hierarchyId === h.own.hierarchyId);
    if (e) out[h.name] = e.path;
  }
  return out;
}

const read = async (file: string) => (await fsp.readFile(file, 'utf8')).trim();

/** Directories below the private cgroups other than the `home` of the test's processes. */
async function createdDirs(): Promise<string[]> {
  const out: string[] = [];
  for (const h of pc.hierarchies) {
    for (const d of await treeDeepestFirst(h.dir)) if (d !== h.dir && !d.startsWith(path.join(h.dir, 'home'))) out.push(d);
  }
  return out;
}

async function expectAllHome(pid: number): Promise<void> {
  const paths = await procPaths(pid);
  for (const h of pc.hierarchies) expect(paths[h.name], h.name).toBe(`${h.procPath}/home`);
}

beforeEach(async () => {
  owned = [];
  pc = await createPrivateCgroups();
  root = await linkRoot(pc);
  driver = makeDriver();
});

afterEach(async () => {
  for (const child of owned) await killOwned(child);
  const left = await removePrivateCgroups(pc);
  await fsp.rm(root, { recursive: true, force: true });
  expect(left).toEqual([]);
});

afterAll(async () => {
  await assertMachineClean();
});

describe('cgroup mode detection (real)', () => {
  it('detects hybrid on this machine and through the private link root', async () => {
    expect(await detectCgroupMode('/sys/fs/cgroup')).toBe('hybrid');
    expect(await detectCgroupMode(root)).toBe('hybrid');
  });
});

describe('cgroupfs driver on real cgroup v1 hybrid', () => {
  it('creates <parent>/kata-ts-<id> in each hierarchy, writes the limits, joins the pid; resize; teardown leaves nothing', async () => {
    const vmm = await sleeper();
    const pid = vmm.pid as number;
    const record = await driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid, limits });

    expect(record).toMatchObject({ driver: 'cgroupfs', mode: 'hybrid', cgroupParent: `/${podRel}`, limits });
    expect(Object.keys(record.paths).sort()).toEqual([...PLACED].sort());
    // The pid is in the expected directory of each hierarchy, and nowhere else moved.
    const paths = await procPaths(pid);
    for (const h of pc.hierarchies) {
      if (PLACED.includes(h.name)) {
        expect(paths[h.name], h.name).toBe(`${h.procPath}/${podRel}/${leafName}`);
        expect(record.paths[h.name]).toBe(path.join(h.dir, podRel, leafName));
      } else {
        expect(paths[h.name], h.name).toBe(`${h.procPath}/home`);
      }
    }
    // The kubelet had not made the pod's parents: the driver made them and says so.
    expect(record.createdParents).toHaveLength(3 * PLACED.length);
    // Limit files hold the planned values.
    const plan = planLimits(limits);
    const cpu = record.paths.cpu as string;
    expect(await read(path.join(cpu, 'cpu.cfs_period_us'))).toBe('100000');
    expect(await read(path.join(cpu, 'cpu.cfs_quota_us'))).toBe(String(plan.quotaUs));
    expect(plan.quotaUs).toBe(150_000);
    expect(await read(path.join(cpu, 'cpu.shares'))).toBe('768');
    expect(await read(path.join(record.paths.memory as string, 'memory.limit_in_bytes'))).toBe(String(640 * MiB));
    // cpuset copied from the parent level by level.
    const cpuset = hierarchy(pc, 'cpuset');
    for (const f of ['cpuset.cpus', 'cpuset.mems']) {
      expect(await read(path.join(record.paths.cpuset as string, f))).toBe(await read(path.join(cpuset.dir, f)));
    }
    expect(await read(path.join(record.paths.pids as string, 'pids.current'))).toBe('1');
    expect(driver.describe(record)).toMatchObject({
      cgroupDriver: 'cgroupfs',
      cgroupMode: 'hybrid',
      'cgroupPath.memory': record.paths.memory,
    });

    // Resize, including lifting the CPU quota.
    const resized = await driver.update(record, { cpuQuotaMillicores: 0, cpuRequestMillicores: 2000, memoryLimitBytes: 1024 * MiB });
    expect(resized.limits).toEqual({ cpuQuotaMillicores: 0, cpuRequestMillicores: 2000, memoryLimitBytes: 1024 * MiB });
    expect(await read(path.join(cpu, 'cpu.cfs_quota_us'))).toBe('-1');
    expect(await read(path.join(cpu, 'cpu.shares'))).toBe('2048');
    expect(await read(path.join(record.paths.memory as string, 'memory.limit_in_bytes'))).toBe(String(1024 * MiB));

    // Teardown after the process is gone: nothing left but the test's own `home`.
    await killOwned(vmm);
    await driver.remove(resized);
    expect(await createdDirs()).toEqual([]);
    await driver.remove(resized); // idempotent
  });

  it('keeps parents the kubelet made (not recorded, not removed)', async () => {
    await mkdirEverywhere(pc, podRel);
    const vmm = await sleeper();
    const record = await driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits });
    expect(record.createdParents).toEqual([]);
    await killOwned(vmm);
    await driver.remove(record);
    for (const h of pc.hierarchies) {
      expect(await fsp.stat(path.join(h.dir, podRel)).then(() => true)).toBe(true);
      expect(
        await fsp.stat(path.join(h.dir, podRel, leafName)).then(
          () => true,
          () => false,
        ),
      ).toBe(false);
    }
  });

  it('places four VMMs at once whose parents share levels none had yet (one driver, and two drivers as two shims would)', async () => {
    // Seen with 4 clones placed within tens of ms: one placement made `kubepods`, another found it
    // and read its cpuset.cpus before the first had copied it in (CGROUP_CPUSET_EMPTY).
    const drivers = [driver, driver, makeDriver(), makeDriver()];
    const vmms = await Promise.all(drivers.map(() => sleeper()));
    const records = await Promise.all(
      drivers.map((d, i) =>
        d.place({ sandboxId: String(i + 1).repeat(64), cgroupParent: `/kubepods/burstable/pod${i}`, pid: vmms[i]!.pid as number, limits }),
      ),
    );
    const cpuset = hierarchy(pc, 'cpuset');
    for (const [i, record] of records.entries()) {
      const leaf = record.paths.cpuset!;
      expect(await read(path.join(leaf, 'cpuset.cpus'))).toBe(await read(path.join(cpuset.dir, 'cpuset.cpus')));
      expect((await procPaths(vmms[i]!.pid as number)).cpuset).toBe(
        `${cpuset.procPath}/kubepods/burstable/pod${i}/kata-ts-${String(i + 1).repeat(64)}`,
      );
    }
    for (const vmm of vmms) await killOwned(vmm);
    for (const record of records) await driver.remove(record);
  });

  it('placementFor finds a placement that was made but never recorded (crash recovery), without claiming the parents', async () => {
    await mkdirEverywhere(pc, podRel);
    const vmm = await sleeper();
    const record = await driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits });
    const found = await driver.placementFor(sandboxId, `/${podRel}`);
    expect(found.paths).toEqual(record.paths);
    expect(found.createdParents).toEqual([]);
    await killOwned(vmm);
    await driver.remove(found);
    for (const h of pc.hierarchies) {
      expect(await fsp.stat(path.join(h.dir, podRel)).then(() => true)).toBe(true);
      expect(
        await fsp.stat(path.join(h.dir, podRel, leafName)).then(
          () => true,
          () => false,
        ),
      ).toBe(false);
    }
    await driver.remove(await driver.placementFor(sandboxId, `/${podRel}`)); // nothing there: fine
  });

  it('places directly below the root for an empty cgroup_parent (crictl)', async () => {
    const vmm = await sleeper();
    const record = await driver.place({ sandboxId, cgroupParent: '', pid: vmm.pid as number, limits });
    expect(record.paths.memory).toBe(path.join(hierarchy(pc, 'memory').dir, leafName));
    expect(record.createdParents).toEqual([]);
    await killOwned(vmm);
    await driver.remove(record);
    expect(await createdDirs()).toEqual([]);
  });

  it('refuses to remove while the VMM still runs, and changes nothing', async () => {
    const vmm = await sleeper();
    const record = await driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits });
    const err = await rejection(driver.remove(record));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_BUSY']);
    expect((await procPaths(vmm.pid as number)).memory).toBe(`${hierarchy(pc, 'memory').procPath}/${podRel}/${leafName}`);
    await killOwned(vmm);
    await driver.remove(record);
    expect(await createdDirs()).toEqual([]);
  });

  it('rolls back fully when the kernel refuses a quota above the parent pod quota', async () => {
    await mkdirEverywhere(pc, podRel);
    await fsp.writeFile(path.join(hierarchy(pc, 'cpu').dir, podRel, 'cpu.cfs_quota_us'), '50000'); // the pod: 500m
    const vmm = await sleeper();
    const err = await rejection(driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits }));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_WRITE_REFUSED']);
    expect(err.message).toContain('cpu.cfs_quota_us');
    await expectAllHome(vmm.pid as number);
    expect((await createdDirs()).filter((d) => d.endsWith(leafName))).toEqual([]);
  });

  it('rolls back fully when a parent it must copy from has no CPUs (empty cpuset)', async () => {
    // A bare mkdir in v1 cpuset leaves cpuset.cpus empty: nothing could ever join below it.
    await fsp.mkdir(path.join(hierarchy(pc, 'cpuset').dir, 'kubepods'));
    const vmm = await sleeper();
    const err = await rejection(driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits }));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_CPUSET_EMPTY']);
    await expectAllHome(vmm.pid as number);
    // Only the test's own empty cpuset parent remains.
    expect(await createdDirs()).toEqual([path.join(hierarchy(pc, 'cpuset').dir, 'kubepods')]);
  });

  it('moves the VMM back and removes everything when joining fails half-way (join failure injected)', async () => {
    // The real kernel interface, except that joining cgroup2 - the last hierarchy joined - fails
    // after every v1 join and the named systemd one succeeded.
    const unifiedDir = hierarchy(pc, 'unified').dir;
    const failing: CgroupFs = {
      ...realCgroupFs,
      async writeFile(file, value) {
        if (file.startsWith(unifiedDir) && file.endsWith(path.join(leafName, 'cgroup.procs'))) {
          throw Object.assign(new Error('injected'), { code: 'EIO' });
        }
        return realCgroupFs.writeFile(file, value);
      },
    };
    const vmm = await sleeper();
    const err = await rejection(makeDriver(failing).place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits }));
    expect([err.kind, err.reason]).toEqual(['internal', 'CGROUP_IO_FAILED']);
    expect(err.message).toContain(path.join(leafName, 'cgroup.procs'));
    await expectAllHome(vmm.pid as number);
    expect(await createdDirs()).toEqual([]);
  });

  it('refuses a systemd slice, a dead pid, and a stale directory holding a process; creates nothing', async () => {
    const vmm = await sleeper();
    const pid = vmm.pid as number;
    const slice = await rejection(driver.place({ sandboxId, cgroupParent: '/kubepods.slice/kubepods-besteffort.slice', pid, limits }));
    expect([slice.kind, slice.reason]).toEqual(['precondition', 'CGROUP_PARENT_STYLE_MISMATCH']);
    expect(slice.message).toMatch(/systemd slice.*cgroupfs.*path/);
    expect(() => driver.validateParent('kubepods-burstable-podx.slice')).toThrow(/cgroup driver is cgroupfs/);

    const other = await sleeper();
    const otherPid = other.pid as number;
    await killOwned(other);
    const dead = await rejection(driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: otherPid, limits }));
    expect([dead.kind, dead.reason]).toEqual(['precondition', 'CGROUP_PID_GONE']);
    expect(await createdDirs()).toEqual([]);

    // A leftover leaf that still holds a process is not ours to reuse.
    const first = await driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid, limits });
    const second = await sleeper();
    const exists = await rejection(driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: second.pid as number, limits }));
    expect([exists.kind, exists.reason]).toEqual(['exists', 'CGROUP_EXISTS']);
    await expectAllHome(second.pid as number);
    expect((await procPaths(pid)).cpu).toBe(`${hierarchy(pc, 'cpu').procPath}/${podRel}/${leafName}`);
    await killOwned(vmm);
    await driver.remove(first);
    expect(await createdDirs()).toEqual([]);
  });

  it('reuses an empty directory left by a crashed attempt and removes it at teardown', async () => {
    await mkdirEverywhere(pc, `${podRel}/${leafName}`);
    const vmm = await sleeper();
    const record: PlacementRecord = await driver.place({ sandboxId, cgroupParent: `/${podRel}`, pid: vmm.pid as number, limits });
    expect((await procPaths(vmm.pid as number)).memory).toBe(`${hierarchy(pc, 'memory').procPath}/${podRel}/${leafName}`);
    await killOwned(vmm);
    await driver.remove(record);
    for (const h of pc.hierarchies.filter((x) => PLACED.includes(x.name))) {
      expect(
        await fsp.stat(path.join(h.dir, podRel, leafName)).then(
          () => true,
          () => false,
        ),
      ).toBe(false);
    }
  });
});
