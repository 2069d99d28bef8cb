/**
 * The VMM cgroup's task limit (pids.max, systemd TasksMax): the pure planner, the default margin
 * as the sum of what it is made of, and the cgroupfs driver writing it on cgroup v2 (simulated on
 * a directory tree, as in test/unit/cgroups/cgroupfs-v2.test.ts: this machine is v1 hybrid; the
 * real v1 pids controller, with a process forking against the limit, is in
 * test/integration/cgroups/vmm-pids.test.ts).
 */
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createCgroupDriver, describeRecord, VMM_PIDS_MARGIN_PARTS, vmmPidsMax } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { DEFAULT_VMM_PIDS_MARGIN } from '../../../src/config/defaults.js';
import { SimulatedCgroup2Fs } from '../../helpers/cgroups-simfs.js';

const FIXTURE = path.resolve('fixtures/cgroups/v2-kubelet-node');
const limits = { cpuQuotaMillicores: 1000, cpuRequestMillicores: 500, memoryLimitBytes: 512 * 1024 * 1024 };
const sandboxId = 'a1'.repeat(32);

describe('vmmPidsMax (pure)', () => {
  it('is one task per vCPU the VM may grow to, one per iothread, and the margin', () => {
    expect(vmmPidsMax(1, 0, DEFAULT_VMM_PIDS_MARGIN)).toBe(193);
    expect(vmmPidsMax(8, 2, 100)).toBe(110);
  });
  it('the default margin is what QEMU, virtiofsd and the launch helpers run, plus headroom', () => {
    expect(Object.values(VMM_PIDS_MARGIN_PARTS).reduce((a, b) => a + b, 0)).toBe(DEFAULT_VMM_PIDS_MARGIN);
  });
  it('refuses inputs that are not whole non-negative numbers, naming the field', () => {
    expect(() => vmmPidsMax(-1, 0, 10)).toThrow(
      expect.objectContaining({ reason: 'CGROUP_LIMITS_INVALID', details: { field: 'maxVcpus', value: -1 } }),
    );
    expect(() => vmmPidsMax(1, 0.5, 10)).toThrow(expect.objectContaining({ details: { field: 'iothreads', value: 0.5 } }));
  });
});

describe('cgroupfs driver writes pids.max on cgroup v2 (simulated tree)', () => {
  let root: string;
  beforeEach(async () => {
    const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-pids-v2-'));
    root = path.join(tmp, 'cgroup');
    await fsp.cp(FIXTURE, root, { recursive: true });
  });
  afterEach(async () => {
    await fsp.rm(path.dirname(root), { recursive: true, force: true });
  });
  const driver = () =>
    createCgroupDriver('cgroupfs', { cgroupRoot: root, dbusAddress: null, logger: silentLogger(), fs: new SimulatedCgroup2Fs(root) });

  it('in the VMM leaf, before the VMM joins; recorded and described', async () => {
    const pidsMax = vmmPidsMax(2, 0, DEFAULT_VMM_PIDS_MARGIN);
    const record = await driver().place({ sandboxId, cgroupParent: '/kubepods/burstable/podpids', pid: process.pid, limits, pidsMax });
    expect(record.pidsMax).toBe(194);
    const leaf = record.paths.unified!;
    expect((await fsp.readFile(path.join(leaf, 'pids.max'), 'utf8')).trim()).toBe('194');
    expect(describeRecord(record).pidsMax).toBe('194');
  });

  it('a parent that does not enable pids for its children: placed without a limit of its own, and the record says so', async () => {
    // kata-ts never changes a parent it did not create; this one enables only cpu and memory.
    await fsp.writeFile(path.join(root, 'kubepods', 'burstable', 'cgroup.subtree_control'), 'cpu memory');
    await fsp.mkdir(path.join(root, 'kubepods', 'burstable', 'podnopids'));
    const sim = new SimulatedCgroup2Fs(root);
    await fsp.writeFile(path.join(root, 'kubepods', 'burstable', 'podnopids', 'cgroup.controllers'), 'cpu memory');
    await fsp.writeFile(path.join(root, 'kubepods', 'burstable', 'podnopids', 'cgroup.subtree_control'), 'cpu memory');
    await fsp.writeFile(path.join(root, 'kubepods', 'burstable', 'podnopids', 'cgroup.procs'), '');
    const d = createCgroupDriver('cgroupfs', { cgroupRoot: root, dbusAddress: null, logger: silentLogger(), fs: sim });
    const record = await d.place({ sandboxId, cgroupParent: '/kubepods/burstable/podnopids', pid: process.pid, limits, pidsMax: 50 });
    expect(record.pidsMax).toBeUndefined();
    expect(describeRecord(record).pidsMax).toBe('none');
  });

  it('refuses a task limit of 0 before creating anything', async () => {
    await expect(
      driver().place({ sandboxId, cgroupParent: '/kubepods/burstable/podzero', pid: process.pid, limits, pidsMax: 0 }),
    ).rejects.toMatchObject({ kind: 'invalid', reason: 'CGROUP_LIMITS_INVALID', details: { field: 'pidsMax' } });
    await expect(fsp.stat(path.join(root, 'kubepods', 'burstable', 'podzero'))).rejects.toThrow();
  });
});
