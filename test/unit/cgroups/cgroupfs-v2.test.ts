/**
 * The cgroupfs driver's cgroup v2 paths, on a copy of fixtures/cgroups/v2-kubelet-node through
 * the imitation in test/helpers/cgroups-simfs.ts: this machine is v1 hybrid, where no cgroup2
 * hierarchy has controllers to write for real. The real v1 paths are in
 * test/integration/cgroups/cgroupfs.test.ts.
 */
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { type CgroupDriver, type CgroupFs, createCgroupDriver, type VmmLimits } from '../../../src/cgroups/index.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { SimulatedCgroup2Fs } from '../../helpers/cgroups-simfs.js';

const FIXTURE = path.resolve('fixtures/cgroups/v2-kubelet-node');
const MiB = 1024 * 1024;
const limits: VmmLimits = { cpuQuotaMillicores: 1500, cpuRequestMillicores: 750, memoryLimitBytes: 640 * MiB };
const pod = 'kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-acbdcedfe0f1';
const sandboxId = 'cd'.repeat(32);
const leaf = `kata-ts-${sandboxId}`;
// A live process of ours, so that the driver's /proc checks pass; the imitation never moves it.
const pid = process.pid;

let root: string;
let sim: SimulatedCgroup2Fs;
let driver: CgroupDriver;

const read = async (rel: string) => (await fsp.readFile(path.join(root, rel), 'utf8')).trim();
const exists = async (rel: string) =>
  fsp.stat(path.join(root, rel)).then(
    () => true,
    () => false,
  );

async function errorOf(p: Promise<unknown>): Promise<KataError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(KataError);
  return err as KataError;
}

beforeEach(async () => {
  const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-cgroups-v2-'));
  root = path.join(tmp, 'cgroup');
  await fsp.cp(FIXTURE, root, { recursive: true });
  sim = new SimulatedCgroup2Fs(root);
  driver = createCgroupDriver('cgroupfs', { cgroupRoot: root, dbusAddress: null, logger: silentLogger(), fs: sim });
});

afterEach(async () => {
  await fsp.rm(path.dirname(root), { recursive: true, force: true });
});

describe('cgroupfs driver, cgroup v2 (cgroup v2 simulated on a directory tree: this machine is hybrid)', () => {
  it('detects v2 and places below the kubelet pod cgroup without touching the kubelet tree', async () => {
    const record = await driver.place({ sandboxId, cgroupParent: `/${pod}`, pid, limits });
    expect(record).toMatchObject({ driver: 'cgroupfs', mode: 'v2', createdParents: [] });
    expect(record.paths).toEqual({ unified: path.join(await fsp.realpath(root), pod, leaf) });
    expect(await read(`${pod}/${leaf}/cgroup.procs`)).toBe(String(pid));
    expect(await read(`${pod}/${leaf}/cpu.max`)).toBe('150000 100000');
    expect(await read(`${pod}/${leaf}/cpu.weight`)).toBe('80');
    expect(await read(`${pod}/${leaf}/memory.max`)).toBe(String(640 * MiB));
    // The leaf enables nothing (it holds the VMM); nothing above it was written.
    expect(await read(`${pod}/${leaf}/cgroup.subtree_control`)).toBe('');
    expect(sim.writes.every((w) => w.startsWith(`${pod}/${leaf}/`))).toBe(true);

    const resized = await driver.update(record, { cpuQuotaMillicores: 0, cpuRequestMillicores: 1000, memoryLimitBytes: 0 });
    expect(await read(`${pod}/${leaf}/cpu.max`)).toBe('max 100000');
    expect(await read(`${pod}/${leaf}/cpu.weight`)).toBe('100');
    expect(await read(`${pod}/${leaf}/memory.max`)).toBe('max');

    // The VMM exits (the imitation empties cgroup.procs the way the kernel would).
    await fsp.writeFile(path.join(root, pod, leaf, 'cgroup.procs'), '');
    await driver.remove(resized);
    expect(await exists(`${pod}/${leaf}`)).toBe(false);
    expect(await exists(pod)).toBe(true);
  });

  it("gives a parent of its own (the pool's) cpu.weight for its shares, and refuses one at the root", async () => {
    const pool = { cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 };
    const record = await driver.place({ sandboxId, cgroupParent: '/kata-ts-pool', pid, limits: pool, parentCpuShares: 2 });
    expect(await read('kata-ts-pool/cpu.weight')).toBe('1');
    expect(await read(`kata-ts-pool/${leaf}/cpu.weight`)).toBe('1');
    expect(record.createdParents).toEqual([path.join(await fsp.realpath(root), 'kata-ts-pool')]);
    const root0 = await errorOf(driver.place({ sandboxId, cgroupParent: '/', pid, limits: pool, parentCpuShares: 2 }));
    expect(root0.reason).toBe('CGROUP_PARENT_INVALID');
  });

  it('places the other processes of a sandbox (virtiofsd) in the same cgroup, after the VMM', async () => {
    const other = process.ppid; // another live process; the imitation moves nobody
    await driver.place({ sandboxId, cgroupParent: `/${pod}`, pid, extraPids: [other], limits });
    const procsWrites = sim.writes.filter((w) => w.startsWith(`${pod}/${leaf}/cgroup.procs`));
    expect(procsWrites.map((w) => w.split('=')[1])).toEqual([String(pid), String(other)]);
    const bad = await errorOf(driver.place({ sandboxId: 'ef'.repeat(32), cgroupParent: `/${pod}`, pid, extraPids: [0], limits }));
    expect(bad.reason).toBe('CGROUP_PID_INVALID');
  });

  it('creates missing parents, enabling cpu, memory and pids only in the ones it created', async () => {
    const parent = 'kubepods/burstable/podnew/extra';
    const record = await driver.place({ sandboxId, cgroupParent: `/${parent}`, pid, limits });
    const real = await fsp.realpath(root);
    expect(record.createdParents).toEqual([path.join(real, 'kubepods/burstable/podnew'), path.join(real, parent)]);
    expect(await read('kubepods/burstable/podnew/cgroup.subtree_control')).toBe('cpu memory pids');
    expect(await read(`${parent}/cgroup.subtree_control`)).toBe('cpu memory pids');
    expect(await read(`${parent}/${leaf}/cgroup.controllers`)).toBe('cpu memory pids');
    expect(await read(`${parent}/${leaf}/cpu.max`)).toBe('150000 100000');
    expect(sim.writes.filter((w) => w.includes('subtree_control')).map((w) => w.split('=')[0])).toEqual([
      'kubepods/burstable/podnew/cgroup.subtree_control',
      `${parent}/cgroup.subtree_control`,
    ]);
    await fsp.writeFile(path.join(root, parent, leaf, 'cgroup.procs'), '');
    await driver.remove(record);
    expect(await exists('kubepods/burstable/podnew')).toBe(false);
    expect(await exists('kubepods/burstable')).toBe(true);
  });

  it('refuses to nest below a cgroup it did not create that does not delegate cpu and memory, changing nothing', async () => {
    const before = await read('batch/cgroup.subtree_control');
    const err = await errorOf(driver.place({ sandboxId, cgroupParent: '/batch/jobs', pid, limits }));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_CONTROLLERS_NOT_DELEGATED']);
    expect(err.message).toContain('cpu and memory');
    expect(await read('batch/cgroup.subtree_control')).toBe(before);
    expect(await exists('batch/jobs')).toBe(false);
    expect(sim.writes).toEqual([]);
  });

  it('an empty cgroup_parent places directly below the root', async () => {
    const record = await driver.place({ sandboxId, cgroupParent: '', pid, limits });
    expect(record.paths.unified).toBe(path.join(await fsp.realpath(root), leaf));
    expect(await read(`${leaf}/memory.max`)).toBe(String(640 * MiB));
  });

  it('rolls back everything it created when the kernel refuses a limit (refusal injected)', async () => {
    const failing: CgroupFs = {
      mkdir: (d) => sim.mkdir(d),
      rmdir: (d) => sim.rmdir(d),
      readFile: (f) => sim.readFile(f),
      realpath: (p) => sim.realpath(p),
      fsMagic: (p) => sim.fsMagic(p),
      writeFile: async (file, value) => {
        if (file.endsWith('memory.max')) throw Object.assign(new Error('busy'), { code: 'EBUSY' });
        return sim.writeFile(file, value);
      },
    };
    const d = createCgroupDriver('cgroupfs', { cgroupRoot: root, dbusAddress: null, logger: silentLogger(), fs: failing });
    const err = await errorOf(d.place({ sandboxId, cgroupParent: '/kubepods/burstable/podnew', pid, limits }));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_BUSY']);
    expect(await exists('kubepods/burstable/podnew')).toBe(false);
  });
});
