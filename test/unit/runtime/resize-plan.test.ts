/** The pure resize planners: planResize, budgetForShape, planGrowth (before, exercised only through QEMU). */
import { describe, expect, it } from 'vitest';
import { VIRTIO_MEM_BLOCK_MIB } from '../../../src/hypervisor/index.js';
import type { AdmissionDemand } from '../../../src/runtime/admission/index.js';
import { budgetForShape, planGrowth, planResize, type ResizeBasis } from '../../../src/runtime/resize/index.js';
import { thrown } from '../../helpers/kata-error.js';

const MiB = 1024 * 1024;
const budget = { memoryLimitBytes: 1, cpuQuotaMillicores: 2, cpuRequestMillicores: 3 };

/** A hot-plug capable VM: booted with 1 vCPU and 512 MiB, may grow to 4 vCPUs and 2048 MiB. */
function basis(over: { vcpus?: number; memoryMiB?: number; confidential?: boolean } = {}): ResizeBasis {
  const confidential = over.confidential ?? false;
  return {
    id: 'sb1',
    handler: confidential ? 'kata-ts-cvm' : 'kata-ts',
    shape: {
      vcpus: over.vcpus ?? 1,
      maxVcpus: confidential ? 1 : 4,
      memoryMiB: over.memoryMiB ?? 512,
      maxMemoryMiB: confidential ? 512 : 2048,
      hugepages: [],
      kernelParams: [],
    },
    plan: { confidential, sizing: { vm: { memoryMiB: 512 }, vmmOverhead: { cpuMillicores: 100, memoryBytes: 96 * MiB } } },
  };
}

describe('planResize', () => {
  it('grows vCPUs and memory within the headroom: vCPUs to plug, virtio-mem size above the boot memory', () => {
    const plan = planResize(basis(), { vcpus: 3, memoryMiB: 1024, budget });
    expect(plan).toMatchObject({ addVcpus: 2, virtioMemMiB: 512, changed: true, budget });
    expect([plan.shape.vcpus, plan.shape.memoryMiB, plan.shape.maxVcpus, plan.shape.maxMemoryMiB]).toEqual([3, 1024, 4, 2048]);
  });

  it('rounds hot-plugged memory up to whole virtio-mem blocks', () => {
    const plan = planResize(basis(), { vcpus: 1, memoryMiB: 512 + VIRTIO_MEM_BLOCK_MIB + 1, budget });
    expect(plan.virtioMemMiB).toBe(2 * VIRTIO_MEM_BLOCK_MIB);
    expect(plan.shape.memoryMiB).toBe(512 + 2 * VIRTIO_MEM_BLOCK_MIB);
  });

  it('never shrinks vCPUs; shrinks memory, but never below the boot size', () => {
    const plan = planResize(basis({ vcpus: 3, memoryMiB: 1024 }), { vcpus: 1, memoryMiB: 256, budget });
    expect(plan).toMatchObject({ addVcpus: 0, virtioMemMiB: 0, changed: true });
    expect([plan.shape.vcpus, plan.shape.memoryMiB]).toEqual([3, 512]);
  });

  it('the same shape is no change', () => {
    expect(planResize(basis({ vcpus: 2, memoryMiB: 640 }), { vcpus: 2, memoryMiB: 640, budget }).changed).toBe(false);
  });

  it('refuses beyond the headroom planned at boot with the numbers', () => {
    const err = thrown(() => planResize(basis(), { vcpus: 5, memoryMiB: 4096, budget }));
    expect([err.kind, err.reason]).toEqual(['exhausted', 'RESIZE_BEYOND_HEADROOM']);
    expect(err.message).toContain('5 vCPUs exceed the 4 planned at boot');
    expect(err.message).toContain('4096 MiB exceed the 2048 MiB planned at boot');
  });

  it('never changes a confidential VM, but accepts its own shape', () => {
    const cvm = basis({ confidential: true });
    expect(planResize(cvm, { vcpus: 1, memoryMiB: 512, budget }).changed).toBe(false);
    const err = thrown(() => planResize(cvm, { vcpus: 1, memoryMiB: 1024, budget }));
    expect([err.kind, err.reason]).toEqual(['precondition', 'RESIZE_CONFIDENTIAL_STATIC']);
  });
});

describe('budgetForShape', () => {
  it('VM memory and vCPUs plus the VMM overhead; the request is the workload’s plus the overhead', () => {
    expect(budgetForShape(basis(), { vcpus: 2, memoryMiB: 1024 }, 750)).toEqual({
      memoryLimitBytes: 1024 * MiB + 96 * MiB,
      cpuQuotaMillicores: 2100,
      cpuRequestMillicores: 850,
    });
  });
});

describe('planGrowth', () => {
  const handler = { confidential: false, guestOverhead: { cpuMillicores: 250, memoryMiB: 160 } };
  const demand = (cpuMillicores: number, memoryMiB: number): AdmissionDemand => ({
    cpuMillicores,
    memoryBytes: memoryMiB * MiB,
    hugepages: {},
  });

  it('nothing to do when the container fits the VM as it is', () => {
    expect(planGrowth(basis(), handler, demand(500, 128), [], 'small')).toBeUndefined();
  });

  it('grows the VM for a container that does not fit, with the budget for the new shape', () => {
    const plan = planGrowth(basis(), handler, demand(1500, 512), [demand(500, 128)], 'big');
    expect(plan?.changed).toBe(true);
    expect(plan?.shape.vcpus).toBeGreaterThan(1);
    expect(plan?.shape.memoryMiB).toBeGreaterThan(512);
    expect(plan?.budget).toEqual(budgetForShape(basis(), plan!.shape, 2000));
  });
});
