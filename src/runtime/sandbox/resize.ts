import type { CgroupDriver, PlacementRecord } from '../../cgroups/index.js';
import { exhausted, precondition } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { plugVcpus, setVirtioMemSize, VIRTIO_MEM_BLOCK_MIB } from '../../hypervisor/index.js';
import type { HostBudget, VmShape } from '../../sizing/types.js';
import type { LiveSandbox } from './manager.js';
import type { SandboxRecord } from './record.js';

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
export function planResize(record: SandboxRecord, target: ResizeTarget): ResizePlan {
  const current = record.shape;
  const bootMemoryMiB = record.plan.sizing.vm.memoryMiB;
  const vcpus = Math.max(current.vcpus, target.vcpus);
  const virtioMemMiB = Math.ceil(Math.max(0, target.memoryMiB - bootMemoryMiB) / VIRTIO_MEM_BLOCK_MIB) * VIRTIO_MEM_BLOCK_MIB;
  const memoryMiB = bootMemoryMiB + virtioMemMiB;
  const changed = vcpus !== current.vcpus || memoryMiB !== current.memoryMiB;
  if (record.plan.confidential && changed) {
    throw precondition(
      'RESIZE_CONFIDENTIAL_STATIC',
      `sandbox ${record.id} runs the confidential handler "${record.handler}", whose VM is never resized (${current.vcpus} vCPUs, ${current.memoryMiB} MiB; asked ${target.vcpus} vCPUs, ${target.memoryMiB} MiB)`,
    );
  }
  const problems: string[] = [];
  if (target.vcpus > current.maxVcpus) problems.push(`${target.vcpus} vCPUs exceed the ${current.maxVcpus} planned at boot`);
  if (target.memoryMiB > current.maxMemoryMiB)
    problems.push(`${target.memoryMiB} MiB exceed the ${current.maxMemoryMiB} MiB planned at boot`);
  if (problems.length > 0) {
    throw exhausted('RESIZE_BEYOND_HEADROOM', `sandbox ${record.id} cannot grow: ${problems.join(', ')}`, {
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
 * Apply a planned resize to the running VM and its cgroup. Limits are raised before the VM grows
 * and lowered after it shrinks, so the VMM never runs over its budget. The record's shape and
 * placement are updated as each step lands; the caller persists.
 */
export async function applyResize(
  live: LiveSandbox,
  plan: ResizePlan,
  cgroupsFor: (placement: PlacementRecord) => CgroupDriver,
  logger: Logger,
): Promise<void> {
  const { record, vm } = live;
  if (vm === undefined) throw precondition('SANDBOX_NOT_RUNNING', `sandbox ${record.id} has no running VM to resize`);
  const growing = plan.shape.memoryMiB >= record.shape.memoryMiB;
  const updateLimits = async (): Promise<void> => {
    if (record.placement !== null) record.placement = await cgroupsFor(record.placement).update(record.placement, plan.budget);
  };
  if (growing) await updateLimits();
  if (plan.shape.memoryMiB !== record.shape.memoryMiB) {
    await setVirtioMemSize(vm.qmp, plan.virtioMemMiB, record.shape.maxMemoryMiB - record.plan.sizing.vm.memoryMiB);
    record.shape = { ...record.shape, memoryMiB: plan.shape.memoryMiB };
  }
  if (plan.addVcpus > 0) {
    const ids = await plugVcpus(vm.qmp, plan.addVcpus);
    record.shape = { ...record.shape, vcpus: plan.shape.vcpus };
    logger.info({ sandboxId: record.id, added: ids }, 'vCPUs hot-plugged');
  }
  if (!growing) {
    // Lowering a memory limit below what QEMU still holds fails until the guest has given the
    // unplugged memory back; the VM is already smaller, so keep the old limits and say so.
    await updateLimits().catch((err: unknown) =>
      logger.warn({ sandboxId: record.id, err: err instanceof Error ? err.message : String(err) }, 'cgroup limits not lowered yet'),
    );
  }
  logger.info({ sandboxId: record.id, shape: record.shape, budget: plan.budget }, 'sandbox resized');
}
