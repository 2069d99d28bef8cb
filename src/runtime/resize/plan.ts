import { exhausted, precondition } from '../../common/errors.js';
import type { CpuMemory } from '../../config/types.js';
import { VIRTIO_MEM_BLOCK_MIB } from '../../hypervisor/argv.js';
import type { HostBudget, VmShape } from '../../sizing/types.js';
import { type AdmissionDemand, fitBudget } from '../admission/index.js';

const MiB = 1024 * 1024;

/**
 * What a resize is planned from: the VM as it runs now and what its boot plan fixed (boot
 * memory, the VMM overhead, whether the handler is confidential). A SandboxRecord fits as is.
 */
export interface ResizeBasis {
  id: string;
  handler: string;
  shape: VmShape;
  plan: {
    confidential: boolean;
    sizing: {
      vm: Pick<VmShape, 'memoryMiB'>;
      vmmOverhead: { cpuMillicores: number; memoryBytes: number; translationCacheBytes?: number; balloonBytes?: number };
    };
  };
}

/** What the VM should have after a resize, and the VMM cgroup budget that goes with it. */
export interface ResizeTarget {
  vcpus: number;
  memoryMiB: number;
  budget: HostBudget;
}

/** The decided change: the shape to record and the steps to take (pure, see planResize). */
export interface ResizePlan {
  shape: VmShape;
  addVcpus: number;
  /** virtio-mem requested size after the resize (memory above the boot size). */
  virtioMemMiB: number;
  budget: HostBudget;
  changed: boolean;
}

/**
 * Decide a resize within what was planned at boot (pure). vCPUs only grow (CPU hot-unplug needs
 * guest cooperation kata-ts does not ask for); memory grows and shrinks through virtio-mem but
 * never below the boot size. A confidential VM is never changed: any difference is refused. Beyond
 * the boot plan's maxVcpus / maxMemoryMiB: RESOURCE_EXHAUSTED with the numbers.
 */
export function planResize(basis: ResizeBasis, target: ResizeTarget): ResizePlan {
  const current = basis.shape;
  const bootMemoryMiB = basis.plan.sizing.vm.memoryMiB;
  const vcpus = Math.max(current.vcpus, target.vcpus);
  const virtioMemMiB = Math.ceil(Math.max(0, target.memoryMiB - bootMemoryMiB) / VIRTIO_MEM_BLOCK_MIB) * VIRTIO_MEM_BLOCK_MIB;
  const memoryMiB = bootMemoryMiB + virtioMemMiB;
  const changed = vcpus !== current.vcpus || memoryMiB !== current.memoryMiB;
  if (basis.plan.confidential && changed) {
    throw precondition(
      'RESIZE_CONFIDENTIAL_STATIC',
      `sandbox ${basis.id} runs the confidential handler "${basis.handler}", whose VM is never resized (${current.vcpus} vCPUs, ${current.memoryMiB} MiB; asked ${target.vcpus} vCPUs, ${target.memoryMiB} MiB)`,
    );
  }
  const problems: string[] = [];
  if (target.vcpus > current.maxVcpus) problems.push(`${target.vcpus} vCPUs exceed the ${current.maxVcpus} planned at boot`);
  if (target.memoryMiB > current.maxMemoryMiB)
    problems.push(`${target.memoryMiB} MiB exceed the ${current.maxMemoryMiB} MiB planned at boot`);
  if (problems.length > 0) {
    throw exhausted('RESIZE_BEYOND_HEADROOM', `sandbox ${basis.id} cannot grow: ${problems.join(', ')}`, {
      details: {
        current: { vcpus: current.vcpus, memoryMiB: current.memoryMiB },
        target: { vcpus: target.vcpus, memoryMiB: target.memoryMiB },
        max: { vcpus: current.maxVcpus, memoryMiB: current.maxMemoryMiB },
      },
    });
  }
  return { shape: { ...current, vcpus, memoryMiB }, addVcpus: vcpus - current.vcpus, virtioMemMiB, budget: target.budget, changed };
}

/**
 * The VMM cgroup budget for a VM of `shape`, the same way the sizing planner builds it: VM memory
 * plus the VMM overhead, vCPUs plus the VMM overhead; `cpuRequestMillicores` is the workload's.
 */
export function budgetForShape(
  basis: Pick<ResizeBasis, 'plan'>,
  shape: Pick<VmShape, 'vcpus' | 'memoryMiB'>,
  cpuRequestMillicores: number,
): HostBudget {
  const overhead = basis.plan.sizing.vmmOverhead;
  return {
    memoryLimitBytes: shape.memoryMiB * MiB + overhead.memoryBytes + (overhead.translationCacheBytes ?? 0) + (overhead.balloonBytes ?? 0),
    cpuQuotaMillicores: shape.vcpus * 1000 + overhead.cpuMillicores,
    cpuRequestMillicores: cpuRequestMillicores + overhead.cpuMillicores,
  };
}

/** What planGrowth needs to know about the sandbox's handler. */
export interface GrowthHandler {
  confidential: boolean;
  guestOverhead: CpuMemory;
}

/**
 * For sandboxes sized without pod_resources (pure): does the incoming container fit beside the
 * admitted ones, or how must the VM grow (within its planned headroom) so that it does? Undefined
 * when it fits as the VM is.
 */
export function planGrowth(
  basis: ResizeBasis,
  handler: GrowthHandler,
  incoming: AdmissionDemand,
  admitted: readonly AdmissionDemand[],
  containerName: string,
): ResizePlan | undefined {
  const fit = fitBudget({ containerName, shape: basis.shape, handler, admitted, incoming });
  if (fit.fits) return undefined;
  const shape = { vcpus: fit.grow.vcpus, memoryMiB: fit.grow.memoryMiB };
  const cpuRequest = [...admitted, incoming].reduce((sum, d) => sum + d.cpuMillicores, 0);
  return planResize(basis, { ...shape, budget: budgetForShape(basis, shape, cpuRequest) });
}
