import type { CgroupDriver } from '../../cgroups/index.js';
import { errorMessage } from '../../common/errors.js';
import type { VmProcess } from '../../hypervisor/index.js';
import type { LiveSandbox } from './manager.js';

/** Sizes as QEMU itself reports them (not as planned): what the VM really has right now. */
export interface QmpSizes {
  vcpus: number;
  baseMemoryMiB: number;
  pluggedMemoryMiB: number;
}

const MiB = 1024 * 1024;

export async function qmpSizes(vm: VmProcess, timeoutMs = 3000): Promise<QmpSizes> {
  const [cpus, memory] = await Promise.all([
    vm.qmp.queryCpusFast({ timeoutMs }),
    vm.qmp.queryMemorySizeSummary({ timeoutMs }),
  ]);
  return {
    vcpus: cpus.length,
    baseMemoryMiB: Math.round(memory['base-memory'] / MiB),
    pluggedMemoryMiB: Math.round((memory['plugged-memory'] ?? 0) / MiB),
  };
}

/**
 * PodSandboxStatus verbose info (the JSON string under "info", as containerd and CRI-O do): the
 * plan, the VMM's pid and acceleration, where it was placed, what QMP and the guest report.
 */
export async function sandboxVerboseInfo(live: LiveSandbox, cgroups: CgroupDriver): Promise<Record<string, string>> {
  const { record, vm } = live;
  let qmp: QmpSizes | { error: string } | null = null;
  if (vm !== undefined && vm.exitInfo === undefined) {
    qmp = await qmpSizes(vm).catch((err: unknown) => ({ error: errorMessage(err) }));
  }
  const info = {
    handler: record.handler,
    runtimeHandler: record.runtimeHandler,
    phase: record.phase,
    pid: record.vmm?.pid ?? null,
    accel: record.plan.qemu.accel,
    workDir: record.vmm?.workDir ?? null,
    cgroup: record.placement === null ? { driver: cgroups.name, placed: false } : cgroups.describe(record.placement),
    shape: record.shape,
    qmp,
    guest: record.guest,
    exit: record.exit,
    plan: {
      source: record.plan.sizing.source,
      vm: record.plan.sizing.vm,
      host: record.plan.sizing.host,
      workload: record.plan.sizing.workload,
      containers: record.plan.sizing.containers,
      pcie: record.plan.pcie.description,
      qemu: record.plan.qemu,
    },
  };
  return { info: JSON.stringify(info) };
}
