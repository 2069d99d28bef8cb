import { errorMessage, precondition } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { plugVcpus, setVirtioMemSize } from '../../hypervisor/index.js';
import type { HostBudget, VmShape } from '../../sizing/types.js';
import { virtioMemBasis } from '../sandbox/record.js';
import type { SandboxHandle } from '../sandbox/types.js';
import type { ResizePlan } from './plan.js';

/**
 * Apply a planned resize to the running VM and its cgroup. Limits are raised before the VM grows
 * and lowered after it shrinks, so the VMM never runs over its budget. The record's shape and
 * placement are updated as each step lands; the caller persists.
 */
export async function applyResize(sandbox: SandboxHandle, plan: ResizePlan, logger: Logger): Promise<void> {
  const { record, vm } = sandbox;
  if (vm === undefined) throw precondition('SANDBOX_NOT_RUNNING', `sandbox ${record.id} has no running VM to resize`);
  const growing = plan.shape.memoryMiB >= record.shape.memoryMiB;
  const updateLimits = async (): Promise<void> => {
    if (record.placement !== null) record.placement = await sandbox.cgroupsFor(record.placement).update(record.placement, plan.budget);
  };
  if (growing) await updateLimits();
  if (plan.shape.memoryMiB !== record.shape.memoryMiB) {
    // A pooled VM's virtio-mem already holds what grew it to the planned boot RAM (docs/pool.md).
    const basis = virtioMemBasis(record);
    await setVirtioMemSize(vm.qmp, plan.virtioMemMiB + basis.offsetMiB, basis.maxMiB);
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
      logger.warn({ sandboxId: record.id, err: errorMessage(err) }, 'cgroup limits not lowered yet'),
    );
  }
  logger.info({ sandboxId: record.id, shape: record.shape, budget: plan.budget }, 'sandbox resized');
}

/** The part of a sandbox a resize changes, taken before applyResize so a rollback can return to it. */
export interface ResizeCheckpoint {
  shape: VmShape;
  /** The cgroup limits in force, or null when the VMM has no placement. */
  limits: HostBudget | null;
}

/** Remember what applyResize is about to change. */
export function resizeCheckpoint(sandbox: SandboxHandle): ResizeCheckpoint {
  const { shape, placement } = sandbox.record;
  return { shape: { ...shape }, limits: placement === null ? null : { ...placement.limits } };
}

/**
 * Undo an applied resize as far as the VM allows (a rollback step: never throws, logs every step
 * that fails with the numbers). Memory goes back through virtio-mem, then the cgroup limits; vCPUs
 * stay, since kata-ts never unplugs a vCPU (see planResize), and the record keeps saying so.
 */
export async function revertResize(sandbox: SandboxHandle, to: ResizeCheckpoint, logger: Logger): Promise<void> {
  const { record, vm } = sandbox;
  const log = logger.child({ sandboxId: record.id });
  if (record.shape.memoryMiB !== to.shape.memoryMiB) {
    const bootMemoryMiB = record.plan.sizing.vm.memoryMiB;
    const numbers = { fromMemoryMiB: record.shape.memoryMiB, toMemoryMiB: to.shape.memoryMiB };
    try {
      if (vm === undefined) throw new Error('the VM is gone');
      const basis = virtioMemBasis(record);
      await setVirtioMemSize(vm.qmp, to.shape.memoryMiB - bootMemoryMiB + basis.offsetMiB, basis.maxMiB);
      record.shape = { ...record.shape, memoryMiB: to.shape.memoryMiB };
      log.info(numbers, 'rollback: VM memory resized back');
    } catch (err) {
      log.error({ ...numbers, err: errorMessage(err) }, 'rollback step failed: VM memory not resized back');
    }
  }
  if (record.shape.vcpus !== to.shape.vcpus) {
    log.warn(
      { vcpus: record.shape.vcpus, before: to.shape.vcpus },
      'rollback: hot-plugged vCPUs stay in the VM (vCPUs are never unplugged)',
    );
  }
  const placement = record.placement;
  if (placement !== null && to.limits !== null && !sameLimits(placement.limits, to.limits)) {
    const numbers = { fromLimits: placement.limits, toLimits: to.limits };
    try {
      record.placement = await sandbox.cgroupsFor(placement).update(placement, to.limits);
      log.info(numbers, 'rollback: cgroup limits set back');
    } catch (err) {
      log.error({ ...numbers, err: errorMessage(err) }, 'rollback step failed: cgroup limits not set back');
    }
  }
}

function sameLimits(a: HostBudget, b: HostBudget): boolean {
  return (
    a.cpuQuotaMillicores === b.cpuQuotaMillicores &&
    a.cpuRequestMillicores === b.cpuRequestMillicores &&
    a.memoryLimitBytes === b.memoryLimitBytes
  );
}
