/** CreateContainer's rollback pieces: every undo step runs and every failure is logged; a resize is undone. */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import type { CgroupDriver, PlacementRecord } from '../../../src/cgroups/index.js';
import type { Logger } from '../../../src/common/logger.js';
import type { VmProcess } from '../../../src/hypervisor/index.js';
import { resizeCheckpoint, revertResize } from '../../../src/runtime/resize/index.js';
import { RollbackSteps } from '../../../src/runtime/rollback.js';
import type { SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { SandboxHandle } from '../../../src/runtime/sandbox/types.js';

const MiB = 1024 * 1024;

function capturingLogger(): { logger: Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return { logger, lines };
}

describe('RollbackSteps', () => {
  it('runs every step newest first, logs each failure by name and never throws', async () => {
    const { logger, lines } = capturingLogger();
    const ran: string[] = [];
    const steps = new RollbackSteps(logger);
    steps.push('remove root filesystem', async () => void ran.push('rootfs'));
    steps.push('unplug hot-plugged devices', async () => {
      ran.push('unplug');
      throw new Error('device_del timed out');
    });
    steps.push('resize back', async () => void ran.push('resize'));
    expect(steps.has('unplug hot-plugged devices')).toBe(true);
    await expect(steps.run()).resolves.toBeUndefined();
    expect(ran).toEqual(['resize', 'unplug', 'rootfs']);
    const failures = lines.filter((l) => l.msg === 'rollback step failed');
    expect(failures.map((l) => [l.step, l.err])).toEqual([['unplug hot-plugged devices', 'device_del timed out']]);
  });
});

/** A sandbox that booted with 512 MiB and was grown to 1024 MiB and 2 vCPUs, as a handle with fakes behind it. */
function grownSandbox(options: { failQom?: boolean; failCgroup?: boolean } = {}) {
  const qomSets: Array<[string, string, number]> = [];
  const cgroupUpdates: PlacementRecord['limits'][] = [];
  const placement = {
    driver: 'cgroupfs',
    cgroupParent: '/kubepods',
    mode: 'v2',
    paths: {},
    limits: { memoryLimitBytes: 1120 * MiB, cpuQuotaMillicores: 2100, cpuRequestMillicores: 600 },
  } as PlacementRecord;
  const record = {
    id: 'sb1',
    shape: { vcpus: 1, maxVcpus: 4, memoryMiB: 512, maxMemoryMiB: 2048, hugepages: [], kernelParams: [] },
    plan: { sizing: { vm: { memoryMiB: 512 } } },
    placement: { ...placement, limits: { memoryLimitBytes: 608 * MiB, cpuQuotaMillicores: 1100, cpuRequestMillicores: 600 } },
  } as unknown as SandboxRecord;
  const vm = {
    qmp: {
      qomSet: async (path: string, prop: string, value: number) => {
        if (options.failQom) throw new Error('QMP gone');
        qomSets.push([path, prop, value]);
      },
    },
  } as unknown as VmProcess;
  const driver = {
    update: async (p: PlacementRecord, limits: PlacementRecord['limits']) => {
      if (options.failCgroup) throw new Error('EBUSY');
      cgroupUpdates.push(limits);
      return { ...p, limits };
    },
  } as unknown as CgroupDriver;
  const handle: SandboxHandle = { record, vm, agent: undefined, persist: async () => {}, cgroupsFor: () => driver };
  const checkpoint = resizeCheckpoint(handle);
  // What applyResize did: limits raised, memory grown, one vCPU plugged.
  record.placement = placement;
  record.shape = { ...record.shape, vcpus: 2, memoryMiB: 1024 };
  return { handle, checkpoint, record, qomSets, cgroupUpdates };
}

describe('revertResize', () => {
  it('sets memory and cgroup limits back; the plugged vCPU stays and is said so', async () => {
    const { logger, lines } = capturingLogger();
    const { handle, checkpoint, record, qomSets, cgroupUpdates } = grownSandbox();
    await revertResize(handle, checkpoint, logger);
    expect(qomSets.map(([, prop, value]) => [prop, value])).toEqual([['requested-size', 0]]);
    expect(cgroupUpdates).toEqual([{ memoryLimitBytes: 608 * MiB, cpuQuotaMillicores: 1100, cpuRequestMillicores: 600 }]);
    expect([record.shape.vcpus, record.shape.memoryMiB]).toEqual([2, 512]);
    expect(record.placement?.limits.memoryLimitBytes).toBe(608 * MiB);
    expect(lines.some((l) => String(l.msg).includes('vCPUs stay') && l.vcpus === 2 && l.before === 1)).toBe(true);
  });

  it('logs each step it could not undo with the numbers, and does not throw', async () => {
    const { logger, lines } = capturingLogger();
    const { handle, checkpoint, record } = grownSandbox({ failQom: true, failCgroup: true });
    await expect(revertResize(handle, checkpoint, logger)).resolves.toBeUndefined();
    const failed = lines.filter((l) => String(l.msg).startsWith('rollback step failed'));
    expect(failed.map((l) => [l.fromMemoryMiB, l.toMemoryMiB, l.err])).toContainEqual([1024, 512, 'QMP gone']);
    expect(failed.some((l) => l.err === 'EBUSY' && (l.toLimits as { cpuQuotaMillicores: number }).cpuQuotaMillicores === 1100)).toBe(true);
    // The record still says what the VM has.
    expect(record.shape.memoryMiB).toBe(1024);
  });
});
