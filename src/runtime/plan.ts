import type { ResolvedHandler } from '../config/handlers.js';
import type { HypervisorConfig } from '../config/types.js';
import { type AccelerationChoice, buildQemuArgv, type VmSocketPaths } from '../hypervisor/index.js';
import { type KubeletPodResources, type PcieHostFacts, type PodPciePlan, planPodPcie } from '../pcie/index.js';
import type { PodSandboxConfigInput } from '../sizing/input.js';
import { planSizing } from '../sizing/shape.js';
import type { HostCapacity, SizingPlan } from '../sizing/types.js';

/** Everything a sandbox plan is computed from; gathered by the caller, so planning is pure. */
export interface SandboxPlanInput {
  config: PodSandboxConfigInput;
  handler: ResolvedHandler;
  host: HostCapacity;
  pcieFacts: PcieHostFacts;
  /** The kubelet PodResources API answer, when it was asked (pod_resources absent, socket configured). */
  kubelet?: KubeletPodResources;
  accel: AccelerationChoice;
  hypervisor: HypervisorConfig;
  /** Hosts without VFIO hardware: the emulated model standing in for vfio-pci (config pcie.simulateVfioWith). */
  simulateVfioWith?: string | null;
  /** QEMU `-name`: shown in ps, unique per sandbox. */
  vmName: string;
  paths: VmSocketPaths;
}

/** The decided shape of one pod's VM: sizes, PCIe layout and the exact QEMU command line. */
export interface SandboxPlan {
  handler: string;
  confidential: boolean;
  sizing: SizingPlan;
  pcie: PodPciePlan;
  qemu: { binary: string; accel: AccelerationChoice; argv: string[] };
}

/**
 * validate -> plan: size the VM from what the pod announces, lay out its PCIe topology, and build
 * the QEMU argv. Pure (no I/O): the same input gives the same plan, which is what `kata-ts plan`
 * prints and what RunPodSandbox executes.
 */
export function planSandbox(input: SandboxPlanInput): SandboxPlan {
  const { profile } = input.handler;
  const tcg = input.accel.accel === 'tcg';
  const translationCacheMiB = tcg ? input.hypervisor.tcgTranslationCacheMiB : 0;
  const sizing = planSizing({ config: input.config, handler: input.handler, host: input.host, translationCacheMiB });
  const pcie = planPodPcie({
    facts: input.pcieFacts,
    podResources: input.config.pod_resources ?? null,
    annotations: input.config.annotations ?? {},
    ...(input.kubelet === undefined ? {} : { kubelet: input.kubelet }),
    profile: { ...profile.pcie, confidential: profile.confidential },
    simulateVfioWith: input.simulateVfioWith ?? null,
  });
  const argv = buildQemuArgv({
    name: input.vmName,
    shape: sizing.vm,
    accel: input.accel.accel,
    kernelPath: input.hypervisor.kernelPath,
    initrdPath: input.hypervisor.initrdPath,
    kernelParams: input.hypervisor.kernelParams,
    paths: input.paths,
    pcieArgs: pcie.qemuArgs,
    confidential: profile.confidential,
    ...(tcg ? { tcgTranslationCacheMiB: translationCacheMiB } : {}),
    ...(input.hypervisor.guestImagePath === null ? {} : { guestImagePath: input.hypervisor.guestImagePath }),
  });
  return {
    handler: input.handler.name,
    confidential: profile.confidential,
    sizing,
    pcie,
    qemu: { binary: input.hypervisor.qemuBinary, accel: input.accel, argv },
  };
}
