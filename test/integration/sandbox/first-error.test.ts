/**
 * The first error of a failed RunPodSandbox is the one answered: a placement the kernel refuses
 * (the pod's cgroup parent has a smaller CPU quota than the VMM needs) is FAILED_PRECONDITION
 * CGROUP_WRITE_REFUSED, never the exit of the VMM's process that the failed start ends (placed
 * while kata-ts-jailer holds the start, before QEMU runs). Real cgroupfs under the test's private root.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

describe('a failed RunPodSandbox answers its first error', () => {
  let rt: TestRuntime;
  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime();
    await rt.start();
  });
  afterAll(async () => {
    await rt?.cleanup();
  });

  it(
    'a cgroup refusal while the VMM waits to start is FAILED_PRECONDITION, and nothing of QEMU ran',
    async () => {
      const config = podConfig(rt, 'tight');
      const parent = (config.linux as { cgroup_parent: string }).cgroup_parent;
      // The kubelet's pod cgroup, made before the pod, with 0.05 CPU: the VMM's quota cannot fit.
      const cpuDir = path.join('/sys/fs/cgroup/cpu', parent);
      await fsp.mkdir(cpuDir, { recursive: true });
      await fsp.writeFile(path.join(cpuDir, 'cpu.cfs_quota_us'), '5000');
      const err = await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config }), status.FAILED_PRECONDITION, 'CGROUP_WRITE_REFUSED');
      expect(err.details).toContain('cpu.cfs_quota_us');
      // The VMM's process was started for it and placed while its jailer held the start: the
      // refusal ended it there, before anything of QEMU ran (it never reported a start).
      const lines = await rt.logLines();
      expect(lines.some((l) => l.msg === 'sandbox creation failed; rolling back')).toBe(true);
      expect(lines.some((l) => l.msg === 'QEMU started (paused)')).toBe(false);
      expect(lines.some((l) => l.msg === 'request refused' && l.rpc === 'RunPodSandbox' && l.reason === 'CGROUP_WRITE_REFUSED')).toBe(true);
      const left = await leftovers(rt, { vmmCgroupsOnly: true });
      expect(left).toEqual({ processes: [], workDirs: [], records: [], cgroups: [] });
    },
    scaledMs(120_000),
  );
});
