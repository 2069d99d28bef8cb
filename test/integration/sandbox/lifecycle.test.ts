/**
 * Pod sandboxes are real VMs: the whole lifecycle through the CRI socket of a real `kata-ts serve`
 * process, with real QEMU (TCG here), a real guest kernel and initramfs, and the cgroupfs driver
 * writing real cgroups under a private parent. Two boots in this file.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PodSandboxStatus__Output } from '../../../src/generated/runtime/v1/PodSandboxStatus.js';
import { readProcStat } from '../../../src/hypervisor/index.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { untilMatches } from '../../helpers/poll.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';

interface Info {
  pid: number;
  phase: string;
  accel: { accel: string };
  cgroup: Record<string, string>;
  shape: { vcpus: number; memoryMiB: number; maxVcpus: number; maxMemoryMiB: number };
  qmp: { vcpus: number; baseMemoryMiB: number; pluggedMemoryMiB: number };
  guest: { vcpus: number; memoryKiB: number };
  exit: { reason: string; logTail: string } | null;
  plan: { source: string; vm: { vcpus: number; memoryMiB: number }; host: { memoryLimitBytes: number; cpuQuotaMillicores: number } };
}

const KEP4112 = (cpu: string, memory: string) => ({
  pod_resources: {
    containers: [
      {
        name: 'app',
        type: 'REGULAR_CONTAINER',
        kubernetes_resources: { requests: { cpu: { string: cpu }, memory: { string: memory } }, limits: {} },
      },
    ],
  },
});

async function sandboxStatus(rt: TestRuntime, id: string): Promise<{ res: { status: PodSandboxStatus__Output }; info: Info }> {
  const res = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
  return { res: { status: res.status! }, info: JSON.parse(res.info.info!) as Info };
}

/** A live process (a zombie awaiting its reaper counts as gone). */
function alive(pid: number): boolean {
  const stat = readProcStat(pid);
  return stat !== undefined && stat.state !== 'Z' && stat.state !== 'X';
}

describe('pod sandbox lifecycle with real QEMU', () => {
  let rt: TestRuntime;
  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime();
    await rt.start();
  });
  afterAll(async () => {
    if (process.env.KEEP_TEST_RUNTIME !== undefined) await rt?.stop();
    else await rt?.cleanup();
  });

  it('run -> READY with QMP and guest agreeing with the plan -> list -> restart keeps it -> stop -> remove leaves nothing', async () => {
    const config = podConfig(rt, 'web', KEP4112('1500m', '300Mi'));
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({
      config,
      runtime_handler: 'kata-ts',
    });
    expect(id).toMatch(/^[0-9a-f]{64}$/);

    const { res, info } = await sandboxStatus(rt, id);
    expect(res.status).toMatchObject({
      id,
      state: 'SANDBOX_READY',
      metadata: { name: 'web' },
      labels: { app: 'web' },
      runtime_handler: 'kata-ts',
    });
    expect(res.status.linux!.namespaces!.options).toMatchObject({ network: 'POD', pid: 'CONTAINER', ipc: 'POD' });
    expect(info.plan.source).toBe('pod_resources');
    // 1500m of workload + 250m guest overhead -> 2 vCPUs; the plan, QEMU and the guest kernel agree.
    expect(info.plan.vm.vcpus).toBe(2);
    expect(info.qmp.vcpus).toBe(info.plan.vm.vcpus);
    expect(info.guest.vcpus).toBe(info.plan.vm.vcpus);
    expect(info.qmp.baseMemoryMiB).toBe(info.plan.vm.memoryMiB);
    expect(info.plan.vm.memoryMiB).toBeGreaterThanOrEqual(300 + 160);
    expect(info.guest.memoryKiB).toBeGreaterThan(0);
    expect(info.guest.memoryKiB).toBeLessThanOrEqual(info.plan.vm.memoryMiB * 1024);
    expect(['kvm', 'tcg']).toContain(info.accel.accel);

    // The VMM runs in its cgroup under the pod's parent, with the planned limits written.
    const memoryDir = path.join('/sys/fs/cgroup/memory', rt.cgroupParent((config.metadata as { uid: string }).uid), `kata-ts-${id}`);
    expect((await fsp.readFile(path.join(memoryDir, 'cgroup.procs'), 'utf8')).split('\n')).toContain(String(info.pid));
    const limit = Number((await fsp.readFile(path.join(memoryDir, 'memory.limit_in_bytes'), 'utf8')).trim());
    expect(limit).toBe(Math.floor(info.plan.host.memoryLimitBytes / 4096) * 4096);

    // List with each CRI filter.
    const list = async (filter: object) => (await rt.cri.runtime.ListPodSandbox({ filter })).items.map((s) => s.id);
    expect(await list({})).toEqual([id]);
    expect(await list({ id: id.slice(0, 13) })).toEqual([id]);
    expect(await list({ state: { state: 'SANDBOX_READY' } })).toEqual([id]);
    expect(await list({ state: { state: 'SANDBOX_NOTREADY' } })).toEqual([]);
    expect(await list({ label_selector: { app: 'web' } })).toEqual([id]);
    expect(await list({ label_selector: { app: 'db' } })).toEqual([]);

    // The same pod attempt again while it exists.
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config, runtime_handler: 'kata-ts' }), status.ALREADY_EXISTS, 'SANDBOX_EXISTS');

    // Restart the daemon: the sandbox is found again, same QEMU, still READY, nothing started twice.
    const daemonBefore = rt.pid();
    await rt.restart();
    expect(rt.pid()).not.toBe(daemonBefore);
    const after = await sandboxStatus(rt, id);
    expect(after.res.status.state).toBe('SANDBOX_READY');
    expect(after.info.pid).toBe(info.pid);
    expect(after.info.qmp.vcpus).toBe(2);
    expect(alive(info.pid)).toBe(true);

    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
    expect(alive(info.pid)).toBe(false);
    const stopped = await sandboxStatus(rt, id);
    expect(stopped.res.status.state).toBe('SANDBOX_NOTREADY');
    expect(stopped.info.exit?.reason).toBe('stopped');
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }); // idempotent
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }); // idempotent
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }); // nothing left to reclaim: no error
    await expectGrpcError(rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id }), status.NOT_FOUND, 'SANDBOX_NOT_FOUND');
    expect(await leftovers(rt)).toEqual({ processes: [], workDirs: [], records: [], cgroups: [] });
  });

  it('a QEMU killed from outside makes the sandbox NOTREADY within a second, with the exit logged', async () => {
    const config = podConfig(rt, 'victim');
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config, runtime_handler: '' });
    const { info } = await sandboxStatus(rt, id);
    expect(info.plan.source).toBe('handler_defaults');
    process.kill(info.pid, 'SIGKILL');
    const killedAt = Date.now();
    const res = await untilMatches(
      'the sandbox to turn NOTREADY',
      () => sandboxStatus(rt, id),
      (s) => s.res.status.state === 'SANDBOX_NOTREADY',
      5000,
    );
    expect(res.res.status.state).toBe('SANDBOX_NOTREADY');
    // "within a second" is the requirement; the exact time is measured in bench/, not asserted here.
    void killedAt;
    const persisted = await untilMatches(
      "the sandbox's exit to be recorded",
      () => sandboxStatus(rt, id),
      (s) => s.info.exit !== null,
      5000,
    );
    expect(persisted.info.exit).toMatchObject({ reason: 'unexpected' });
    const logged = (await rt.logLines()).find((l) => l.msg === 'VM exited on its own; sandbox is NOTREADY');
    expect(logged).toMatchObject({ sandboxId: id, pid: info.pid });
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
    expect(await leftovers(rt)).toEqual({ processes: [], workDirs: [], records: [], cgroups: [] });
  });

  it('a sandbox placed under cgroupfs is still torn down by cgroupfs after the config switches the daemon to systemd', async () => {
    const config = podConfig(rt, 'switch');
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config });
    const { info } = await sandboxStatus(rt, id);
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    // The test runtime's pool parent is a cgroupfs path; under systemd the pool takes its default slice.
    const { cgroupParent: _cgroupfsPoolParent, ...pool } = (cfg.pool ?? {}) as Record<string, unknown>;
    await fsp.writeFile(rt.configPath, JSON.stringify({ ...cfg, cgroupDriver: 'systemd', pool }));
    try {
      await rt.restart();
      // New placements would use systemd (and there is no systemd here); the existing one is cgroupfs's.
      expect(await rt.cri.runtime.RuntimeConfig({})).toEqual({ linux: { cgroup_driver: 'SYSTEMD' } });
      expect((await sandboxStatus(rt, id)).info.pid).toBe(info.pid);
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
      expect((await sandboxStatus(rt, id)).res.status.state).toBe('SANDBOX_NOTREADY');
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
      expect(await leftovers(rt)).toEqual({ processes: [], workDirs: [], records: [], cgroups: [] });
    } finally {
      await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
      await rt.restart();
    }
  });
});
