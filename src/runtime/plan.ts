import type { ResolvedHandler } from '../config/handlers.js';
import type { HypervisorConfig } from '../config/types.js';
import {
  type AccelerationChoice,
  BALLOON_DEVICE_MIB,
  buildQemuArgv,
  type NicSpec,
  QEMU_SECCOMP_SANDBOX,
  type VmSocketPaths,
} from '../hypervisor/index.js';
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
  /** The VM's sockets: in the VMM dir when the handler confines QEMU (sandboxArgvPaths). */
  paths: VmSocketPaths;
  /** The pod's NIC (a pod with CNI networking); its MAC is the CNI interface's, known after CNI ADD. */
  nic?: NicSpec;
}

/**
 * How the VMM is confined (the handler's vmmConfinement): QEMU's seccomp option, and whether it
 * runs as an identity of its own, jailed. The identity itself is taken at RunPodSandbox (the first
 * free number of `identityRange`) and recorded in the sandbox record, not planned.
 */
export interface VmmConfinementPlan {
  /** The `-sandbox` value in the argv; null: no seccomp filter. */
  seccomp: string | null;
  unprivileged: boolean;
  /** Where the identity comes from; null when QEMU runs as root. */
  identityRange: { firstId: number; count: number } | null;
  /** The handler's reason for what it turns off; null when nothing is. */
  optOutReason: string | null;
}

/** The decided shape of one pod's VM: sizes, PCIe layout and the exact QEMU command line. */
export interface SandboxPlan {
  handler: string;
  confidential: boolean;
  sizing: SizingPlan;
  pcie: PodPciePlan;
  qemu: { binary: string; accel: AccelerationChoice; argv: string[] };
  vmm: VmmConfinementPlan;
}

/** Pure: the confinement a handler asks for, with the node's identity range. */
export function planVmmConfinement(input: Pick<SandboxPlanInput, 'handler' | 'hypervisor'>): VmmConfinementPlan {
  const c = input.handler.profile.vmmConfinement;
  const { firstId, count } = input.hypervisor.vmmIdentities;
  return {
    seccomp: c.seccomp ? QEMU_SECCOMP_SANDBOX : null,
    unprivileged: c.unprivileged,
    identityRange: c.unprivileged ? { firstId, count } : null,
    optOutReason: c.seccomp && c.unprivileged ? null : c.optOutReason,
  };
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
  // Never on a confidential VM (config validation refuses it; the argv builder would too).
  const freePageReporting = profile.vm.freePageReporting && !profile.confidential;
  const sizing = planSizing({
    config: input.config,
    handler: input.handler,
    host: input.host,
    translationCacheMiB,
    balloonMiB: freePageReporting ? BALLOON_DEVICE_MIB : 0,
  });
  const pcie = planPodPcie({
    facts: input.pcieFacts,
    podResources: input.config.pod_resources ?? null,
    annotations: input.config.annotations ?? {},
    ...(input.kubelet === undefined ? {} : { kubelet: input.kubelet }),
    profile: { ...profile.pcie, confidential: profile.confidential },
    simulateVfioWith: input.simulateVfioWith ?? null,
  });
  const vmm = planVmmConfinement(input);
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
    ...(input.nic === undefined ? {} : { nic: input.nic }),
    ...(tcg ? { tcgTranslationCacheMiB: translationCacheMiB } : {}),
    ...(freePageReporting ? { freePageReporting } : {}),
    ...(input.hypervisor.guestImagePath === null ? {} : { guestImagePath: input.hypervisor.guestImagePath }),
    ...(vmm.seccomp === null ? {} : { seccompSandbox: vmm.seccomp }),
  });
  return {
    handler: input.handler.name,
    confidential: profile.confidential,
    sizing,
    pcie,
    qemu: { binary: input.hypervisor.qemuBinary, accel: input.accel, argv },
    vmm,
  };
}
