import { describe, expect, it } from 'vitest';
import { confidentialHandlerProfile, defaultHandlerProfile } from '../../../src/config/defaults.js';
import {
  type AdmissionDemand,
  type BudgetFit,
  containerDemand,
  type FitBudgetInput,
  fitBudget,
  type VmBudgetShape,
  workloadCapacity,
} from '../../../src/runtime/admission/index.js';
import { planSizing } from '../../../src/sizing/shape.js';
import { thrown } from '../../helpers/kata-error.js';

const MiB = 1024 * 1024;
const GUEST = { cpuMillicores: 250, memoryMiB: 160 };
/** 2 vCPUs growable to 6, 1024 MiB growable to 5120: workload capacity 1750m and 864 MiB. */
const HOTPLUG: VmBudgetShape = { vcpus: 2, maxVcpus: 6, memoryMiB: 1024, maxMemoryMiB: 1024 + 4096, hugepages: [] };
const STATIC: VmBudgetShape = { ...HOTPLUG, maxVcpus: 2, maxMemoryMiB: 1024 };
const WITH_POOL: VmBudgetShape = { ...HOTPLUG, hugepages: [{ pageSize: '2Mi', pageSizeBytes: 2 * MiB, count: 4 }] };

const d = (cpuMillicores: number, memoryMiB: number, hugepages: Record<string, number> = {}): AdmissionDemand => ({
  cpuMillicores,
  memoryBytes: memoryMiB * MiB,
  hugepages,
});

function input(shape: VmBudgetShape, admitted: AdmissionDemand[], incoming: AdmissionDemand, confidential = false): FitBudgetInput {
  return { containerName: 'app', shape, handler: { confidential, guestOverhead: GUEST }, admitted, incoming };
}

describe('workloadCapacity', () => {
  it('is the shape minus the guest overhead and the hugepage pools', () => {
    expect(workloadCapacity(HOTPLUG, GUEST)).toEqual({ cpuMillicores: 1750, memoryBytes: 864 * MiB, hugepages: {} });
    expect(workloadCapacity(WITH_POOL, GUEST)).toEqual({ cpuMillicores: 1750, memoryBytes: 856 * MiB, hugepages: { '2Mi': 8 * MiB } });
  });
});

describe('fitBudget: fits or grows', () => {
  const ROWS: [string, FitBudgetInput, BudgetFit][] = [
    ['nothing asked, nothing admitted', input(HOTPLUG, [], d(0, 0)), { fits: true }],
    ['within capacity', input(HOTPLUG, [d(500, 256)], d(1000, 512)), { fits: true }],
    ['exactly the capacity', input(HOTPLUG, [d(500, 256)], d(1250, 608)), { fits: true }],
    [
      'one millicore over: one more vCPU',
      input(HOTPLUG, [d(500, 256)], d(1251, 0)),
      { fits: false, grow: { vcpus: 3, memoryMiB: 1024, addVcpus: 1, addMemoryMiB: 0 } },
    ],
    [
      'one byte over: one 128 MiB block',
      input(HOTPLUG, [d(0, 864)], { cpuMillicores: 0, memoryBytes: 1, hugepages: {} }),
      { fits: false, grow: { vcpus: 2, memoryMiB: 1152, addVcpus: 0, addMemoryMiB: 128 } },
    ],
    [
      'both, in whole vCPUs and whole blocks',
      input(HOTPLUG, [d(1000, 1000)], d(3000, 1000)),
      // ceil((4000 + 250) / 1000) = 5 vCPUs; 2000 + 160 = 2160 MiB -> 1024 + 9 * 128 = 2176 MiB
      { fits: false, grow: { vcpus: 5, memoryMiB: 2176, addVcpus: 3, addMemoryMiB: 1152 } },
    ],
    [
      'up to the planned maximum exactly',
      input(HOTPLUG, [], d(5750, 4960)),
      { fits: false, grow: { vcpus: 6, memoryMiB: 5120, addVcpus: 4, addMemoryMiB: 4096 } },
    ],
    ['hugepages within the pools', input(WITH_POOL, [d(0, 0, { '2Mi': 2 * MiB })], d(0, 856, { '2Mi': 6 * MiB })), { fits: true }],
    ['a confidential VM that has room', input(STATIC, [d(750, 432)], d(1000, 432), true), { fits: true }],
  ];
  it.each(ROWS)('%s', (_name, i, expected) => {
    expect(fitBudget(i)).toEqual(expected);
  });
});

describe('fitBudget: refusals', () => {
  it('refuses beyond the planned vCPUs with the numbers', () => {
    const err = thrown(() => fitBudget(input(HOTPLUG, [d(2000, 0)], d(3751, 0))));
    expect(err.kind).toBe('exhausted');
    expect(err.reason).toBe('ADMISSION_BUDGET_EXCEEDED');
    expect(err.details).toMatchObject({
      container: 'app',
      cpu: { neededMillicores: 5751, availableMillicores: 1750, maxMillicores: 5750, vcpus: 2, maxVcpus: 6, neededVcpus: 7 },
    });
    expect(err.message).toContain('5751m');
    expect(err.message).toContain('5750m');
    expect(err.message).not.toContain('memory needs');
  });

  it('refuses beyond the planned memory with the numbers', () => {
    const err = thrown(() => fitBudget(input(HOTPLUG, [d(0, 4000)], d(0, 961))));
    expect(err.reason).toBe('ADMISSION_BUDGET_EXCEEDED');
    expect(err.details).toMatchObject({
      memory: {
        neededBytes: 4961 * MiB,
        availableBytes: 864 * MiB,
        maxBytes: 4960 * MiB,
        memoryMiB: 1024,
        maxMemoryMiB: 5120,
        neededMemoryMiB: 5248,
      },
    });
    expect(err.message).toContain('4961 MiB');
    expect(err.message).not.toContain('cpu needs');
  });

  it('refuses a VM without headroom (a non-confidential handler configured static)', () => {
    expect(thrown(() => fitBudget(input(STATIC, [], d(1751, 0)))).reason).toBe('ADMISSION_BUDGET_EXCEEDED');
  });

  it('refuses more hugepages than the pools reserved at boot, even with headroom left', () => {
    const err = thrown(() => fitBudget(input(WITH_POOL, [d(0, 0, { '2Mi': 4 * MiB })], d(0, 0, { '2Mi': 6 * MiB }))));
    expect(err.reason).toBe('ADMISSION_BUDGET_EXCEEDED');
    expect(err.details).toMatchObject({ hugepages: { '2Mi': { neededBytes: 10 * MiB, availableBytes: 8 * MiB } } });
    expect(err.message).toContain('hugepages-2Mi');
  });

  it('refuses a hugepage size the VM has no pool for', () => {
    const err = thrown(() => fitBudget(input(WITH_POOL, [], d(0, 0, { '1Gi': 1024 * MiB }))));
    expect(err.reason).toBe('ADMISSION_BUDGET_EXCEEDED');
    expect(err.details).toMatchObject({ hugepages: { '1Gi': { neededBytes: 1024 * MiB, availableBytes: 0 } } });
  });

  it('never grows a confidential VM', () => {
    for (const incoming of [d(1751, 0), d(0, 865), d(2000, 2000)]) {
      const err = thrown(() => fitBudget(input(STATIC, [], incoming, true)));
      expect(err.kind).toBe('exhausted');
      expect(err.reason).toBe('ADMISSION_CONFIDENTIAL_STATIC');
    }
  });

  it('never grows a confidential VM even when its shape claims headroom', () => {
    expect(thrown(() => fitBudget(input(HOTPLUG, [], d(1751, 0), true))).reason).toBe('ADMISSION_CONFIDENTIAL_STATIC');
  });

  it('refuses a confidential VM short only of hugepages as over budget (no handler could grow a pool)', () => {
    expect(
      thrown(() => fitBudget(input({ ...WITH_POOL, maxVcpus: 2, maxMemoryMiB: 1024 }, [], d(0, 0, { '2Mi': 16 * MiB }), true))).reason,
    ).toBe('ADMISSION_BUDGET_EXCEEDED');
  });
});

describe('fitBudget against the sizing planner', () => {
  // A pod sized from LinuxPodSandboxConfig.resources (the sum of its containers) admits those
  // containers, sent with their own linux.resources, without growing.
  const containers = [
    { linux: { resources: { cpu_quota: '50000', cpu_period: '100000', memory_limit_in_bytes: String(300 * MiB) } } },
    { linux: { resources: { cpu_quota: '125000', cpu_period: '100000', memory_limit_in_bytes: String(700 * MiB) } } },
  ];
  const sandboxConfig = {
    linux: { resources: { cpu_quota: '175000', cpu_period: '100000', memory_limit_in_bytes: String(1000 * MiB) } },
  };

  for (const [name, profile] of [
    ['kata-ts', defaultHandlerProfile()],
    ['kata-ts-cvm', confidentialHandlerProfile()],
  ] as const) {
    it(`admits every container of the sized pod without growing (${name})`, () => {
      const plan = planSizing({ config: sandboxConfig, handler: { name, profile }, host: { cpus: 64, memoryMiB: 65536 } });
      expect(plan.source).toBe('linux_resources');
      const demands = containers.map((c) => containerDemand(c));
      const result = fitBudget({
        containerName: 'second',
        shape: plan.vm,
        handler: profile,
        admitted: demands.slice(0, 1),
        incoming: demands[1]!,
      });
      expect(result).toEqual({ fits: true });
    });
  }

  it('grows the hot-plug VM for a third container, within the planned headroom', () => {
    const profile = defaultHandlerProfile();
    const plan = planSizing({ config: sandboxConfig, handler: { name: 'kata-ts', profile }, host: { cpus: 64, memoryMiB: 65536 } });
    const admitted = containers.map((c) => containerDemand(c));
    const result = fitBudget({ containerName: 'third', shape: plan.vm, handler: profile, admitted, incoming: d(1000, 256) });
    expect(result.fits).toBe(false);
    if (!result.fits) {
      expect(result.grow.vcpus).toBeLessThanOrEqual(plan.vm.maxVcpus);
      expect(result.grow.memoryMiB).toBeLessThanOrEqual(plan.vm.maxMemoryMiB);
      expect(result.grow.addMemoryMiB % 128).toBe(0);
      expect(result.grow.vcpus).toBe(plan.vm.vcpus + result.grow.addVcpus);
      expect(result.grow.addVcpus).toBeGreaterThan(0);
      expect(result.grow.addMemoryMiB).toBeGreaterThan(0);
    }
  });
});
