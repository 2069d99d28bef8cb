import path from 'node:path';
import type { ResolvedHandler } from '../config/handlers.js';
import type { HypervisorConfig, TeeKind, TeeKindSetting } from '../config/types.js';
import {
  type AccelerationChoice,
  BALLOON_DEVICE_MIB,
  buildQemuArgv,
  type GuestImageVerity,
  type NicSpec,
  QEMU_SECCOMP_SANDBOX,
  resolveTeeKind,
  type TeeArgvSpec,
  teeLaunchProblem,
  type VmSocketPaths,
} from '../hypervisor/index.js';
import { type KubeletPodResources, type PcieHostFacts, type PodPciePlan, planPodPcie } from '../pcie/index.js';
import type { PodSandboxConfigInput } from '../sizing/input.js';
import { planSizing } from '../sizing/shape.js';
import type { HostCapacity, SizingPlan } from '../sizing/types.js';
import type { TeeFacts } from './facts.js';

/** Where a sandbox's TEE files go (sandboxTeePaths in src/runtime/sandbox/paths.ts). */
export interface SandboxTeePaths {
  /** The pod's copy of OVMF's variable store: in QEMU's own dir, owned by its identity. */
  ovmfVarsCopy: string;
  /** swtpm's state (its NVRAM, the EK and its certificate): swtpm's own dir. */
  tpmStateDir: string;
  /** swtpm's control socket QEMU connects to, in a dir swtpm owns and QEMU's group may enter. */
  tpmSocket: string;
  /** swtpm's log. */
  tpmLog: string;
  /** The pod's initdata document, when it has one (handed to the guest over fw_cfg). */
  initdata: string;
}

/**
 * The pod's initdata as the argv carries it (src/measure/initdata.ts decodes the annotation and
 * computes the bindings): its path on the host comes from teePaths.
 */
export interface SandboxInitdata {
  /** SEV-SNP HOST_DATA (32 bytes) and TDX MRCONFIGID (48 bytes) binding it to the launch measurement. */
  snpHostData: Buffer;
  tdxMrConfigId: Buffer;
}

/**
 * The TEE a pod's VM gets, decided before boot: the handler's setting, what it resolved to on
 * this host and why, and why it cannot start here (null: it can).
 */
export interface TeePlan {
  setting: TeeKindSetting;
  kind: TeeKind;
  reason: string;
  /** QEMU too old, no such hardware or no KVM: RunPodSandbox refuses (TEE_UNAVAILABLE); `plan` and `doctor` say it. */
  launchProblem: string | null;
  /** The firmware the VM boots: OVMF's code and vars template and the pod's copy (vtpm), or the -bios image (snp, tdx). */
  firmware: { ovmfCode: string; ovmfVarsTemplate: string; ovmfVarsCopy: string } | { bios: string } | null;
  /** The pod's swtpm (vtpm only). */
  tpm: { stateDir: string; socketPath: string; logFile: string } | null;
  /** The initdata document's path when the pod has one. */
  initdataPath: string | null;
  /**
   * The guest image the VM mounts at /usr and the dm-verity table its measured command line
   * carries (`kata_ts.verity=`, guest/init verifies every block read against it); verity null:
   * the image has no verity metadata, so nothing would measure it (RunPodSandbox refuses such a
   * TEE pod: GUEST_IMAGE_UNVERIFIED). Null: no image (the initramfs is the whole guest) or no TEE.
   * Absent: planned before the guest image was verified.
   */
  guestImage?: { path: string; verity: GuestImageVerity | null } | null;
}

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
  /** The host's TEEs and QEMU's version (RuntimeFacts.tee); absent: no hardware TEE, version unknown. */
  tee?: TeeFacts;
  /** Where the TEE's files go; needed when the handler's TEE resolves to vtpm. */
  teePaths?: SandboxTeePaths;
  /** The pod's initdata, when it has one. */
  initdata?: SandboxInitdata;
  /**
   * The guest image's dm-verity table, read by the caller from `<guestImagePath>.verity.json`
   * (readGuestImageVerity); null or absent: the image has none. Used only by a TEE handler.
   */
  guestImageVerity?: GuestImageVerity | null;
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
  /** Absent: planned before TEE profiles existed (no TEE). */
  tee?: TeePlan;
}

const NO_HARDWARE_TEE: TeeFacts = {
  host: { snp: { ok: false, message: 'not checked' }, tdx: { ok: false, message: 'not checked' } },
  qemuVersion: null,
};

/** TEE paths for a caller that gives none (a plan made outside a sandbox): beside the QMP socket. */
function besideQmp(qmpSocket: string): SandboxTeePaths {
  const dir = path.dirname(qmpSocket);
  return {
    ovmfVarsCopy: path.join(dir, 'OVMF_VARS.fd'),
    tpmStateDir: path.join(dir, 'tpm'),
    tpmSocket: path.join(dir, 'tpm-sock', 'ctrl.sock'),
    tpmLog: path.join(dir, 'swtpm.log'),
    initdata: path.join(dir, 'initdata.toml'),
  };
}

/** Pure: the handler's TEE on this host (resolved from the facts), and what the argv needs for it. */
export function planTee(
  input: Pick<SandboxPlanInput, 'handler' | 'hypervisor' | 'tee' | 'teePaths' | 'initdata' | 'accel' | 'paths' | 'guestImageVerity'>,
): {
  plan: TeePlan;
  argv: TeeArgvSpec;
  /** The verity table the command line carries (a TEE VM with a verified image), else undefined. */
  guestImageVerity?: GuestImageVerity;
} {
  const setting = input.handler.profile.tee.kind;
  const facts = input.tee ?? NO_HARDWARE_TEE;
  const choice = resolveTeeKind(setting, facts.host);
  const launchProblem = teeLaunchProblem(choice.kind, { host: facts.host, qemuVersion: facts.qemuVersion, accel: input.accel.accel });
  const fw = input.hypervisor.firmware;
  const paths = input.teePaths ?? besideQmp(input.paths.qmpSocket);
  const initdataPath = input.initdata === undefined ? null : paths.initdata;
  const initdata = initdataPath === null ? {} : { initdataPath };
  // A TEE VM's /usr is the guest image, verified by dm-verity against the root hash on its
  // measured command line; without a TEE nothing measures the command line, so nothing changes.
  const imagePath = input.hypervisor.guestImagePath;
  const verity = input.guestImageVerity ?? null;
  const guestImage = choice.kind === 'none' || imagePath === null ? null : { path: imagePath, verity };
  const base = { setting, kind: choice.kind, reason: choice.reason, launchProblem, initdataPath, guestImage };
  const verified = guestImage?.verity == null ? {} : { guestImageVerity: guestImage.verity };
  switch (choice.kind) {
    case 'none':
      return { plan: { ...base, firmware: null, tpm: null, initdataPath: null }, argv: { kind: 'none' } };
    case 'vtpm': {
      return {
        ...verified,
        plan: {
          ...base,
          firmware: { ovmfCode: fw.ovmfCodePath, ovmfVarsTemplate: fw.ovmfVarsPath, ovmfVarsCopy: paths.ovmfVarsCopy },
          tpm: { stateDir: paths.tpmStateDir, socketPath: paths.tpmSocket, logFile: paths.tpmLog },
        },
        argv: { kind: 'vtpm', ovmfCodePath: fw.ovmfCodePath, ovmfVarsPath: paths.ovmfVarsCopy, tpmSocket: paths.tpmSocket, ...initdata },
      };
    }
    case 'snp': {
      const hostData = input.initdata?.snpHostData;
      return {
        ...verified,
        plan: { ...base, firmware: { bios: fw.snpFirmwarePath }, tpm: null },
        argv: { kind: 'snp', firmwarePath: fw.snpFirmwarePath, ...(hostData === undefined ? {} : { hostData }), ...initdata },
      };
    }
    case 'tdx': {
      const mrConfigId = input.initdata?.tdxMrConfigId;
      return {
        ...verified,
        plan: { ...base, firmware: { bios: fw.tdxFirmwarePath }, tpm: null },
        argv: { kind: 'tdx', firmwarePath: fw.tdxFirmwarePath, ...(mrConfigId === undefined ? {} : { mrConfigId }), ...initdata },
      };
    }
  }
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
  const tee = planTee(input);
  const hardwareTee = tee.plan.kind === 'snp' || tee.plan.kind === 'tdx';
  const argv = buildQemuArgv({
    name: input.vmName,
    shape: sizing.vm,
    // An SNP or TDX guest runs only under KVM: its argv is the one such a host needs, also where
    // this one cannot start it (tee.launchProblem says why, and RunPodSandbox refuses).
    accel: hardwareTee ? 'kvm' : input.accel.accel,
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
    ...(tee.argv.kind === 'none' ? {} : { tee: tee.argv }),
    ...(tee.guestImageVerity === undefined ? {} : { guestImageVerity: tee.guestImageVerity }),
  });
  return {
    handler: input.handler.name,
    confidential: profile.confidential,
    sizing,
    pcie,
    qemu: { binary: input.hypervisor.qemuBinary, accel: input.accel, argv },
    vmm,
    tee: tee.plan,
  };
}
