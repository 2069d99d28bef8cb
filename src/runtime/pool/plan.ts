/**
 * The pool's planners (pure): the shape and argv of a pooled VM, the key that says which pods it
 * can serve, whether one pod's cold plan fits it (and, when not, why), and the claim plan that
 * grows it into exactly that cold plan. docs/pool.md.
 */
import path from 'node:path';
import { millicoresForShares, type PlacementRecord, type VmmLimits } from '../../cgroups/index.js';
import type { ResolvedHandler } from '../../config/handlers.js';
import type { HypervisorConfig } from '../../config/types.js';
import type { AccelerationChoice } from '../../hypervisor/index.js';
import { buildQemuArgv, type QemuArgvSpec, VIRTIO_MEM_BLOCK_MIB, type VmSocketPaths } from '../../hypervisor/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import { planPodPcie } from '../../pcie/index.js';
import type { HostCapacity, VmShape } from '../../sizing/types.js';
import { planVmmConfinement, type SandboxPlan, type VmmConfinementPlan } from '../plan.js';

/** Where the hot-plugged virtio-fs device and NIC go: root ports of the pool's own on our slots 0x05/0x06. */
export const POOL_VFS_PORT_ID = 'pool-vfs-port';
export const POOL_NIC_PORT_ID = 'pool-nic-port';
/** A chassis number the PCIe planner never uses (it takes 1 for root ports and 2+s for switches). */
export const POOL_PORT_CHASSIS = 200;
/** Under TCG a larger boot RAM costs only page tables; the smallest boot still starts fastest. */
const MEMORY_BLOCK_MIB = 128;

/** What a pooled VM was booted from; a pod fits only a VM with the same key (docs/pool.md#fit). */
export interface PoolKey {
  handler: string;
  qemuBinary: string;
  accel: AccelerationChoice['accel'];
  kernelPath: string;
  initrdPath: string;
  guestImagePath: string | null;
  kernelParams: string[];
  tcgTranslationCacheMiB: number;
  /** The `-device` args of the PCIe topology a pod without devices gets: its "topology class". */
  pcieArgs: string[];
  confined: boolean;
  /** The free-page-reporting balloon (the handler's vm.freePageReporting), as a cold boot has it. */
  freePageReporting: boolean;
}

export function samePoolKey(a: PoolKey, b: PoolKey): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

export interface PoolVmPlanInput {
  handler: ResolvedHandler;
  host: HostCapacity;
  hypervisor: HypervisorConfig;
  accel: AccelerationChoice;
  pcieFacts: PcieHostFacts;
  simulateVfioWith: string | null;
  vmName: string;
  /** The VM's sockets (agent port; no virtio-fs socket: that device is hot-plugged at claim). */
  paths: VmSocketPaths;
}

export interface PoolVmPlan {
  key: PoolKey;
  shape: VmShape;
  vmm: VmmConfinementPlan;
  qemu: { binary: string; accel: AccelerationChoice; argv: string[] };
}

/**
 * The smallest shape and the largest headroom the handler and host allow: one vCPU of up to
 * min(handler, host) vCPUs; the handler's least boot RAM, growable by virtio-mem to the handler's
 * (or host's) most, rounded up to whole 128 MiB memory blocks: a pod's own headroom ends at most
 * there, wherever its boot RAM starts. The region is address space (a sparse memfd) until the
 * claim plugs what the pod plans; a pod never grows beyond its own planned maximum.
 */
export function planPoolShape(handler: ResolvedHandler, host: HostCapacity): VmShape {
  const { vm } = handler.profile;
  const memoryMiB = Math.ceil(vm.minMemoryMiB / VIRTIO_MEM_BLOCK_MIB) * VIRTIO_MEM_BLOCK_MIB;
  const ceilingMiB = Math.min(vm.maxMemoryMiB, Math.floor(host.memoryMiB));
  const headroomMiB = Math.max(0, Math.ceil((ceilingMiB - memoryMiB) / MEMORY_BLOCK_MIB) * MEMORY_BLOCK_MIB);
  return {
    vcpus: 1,
    maxVcpus: Math.max(1, Math.min(vm.maxVcpus, host.cpus)),
    memoryMiB,
    maxMemoryMiB: memoryMiB + headroomMiB,
    hugepages: [],
    kernelParams: [],
  };
}

/** The two pcie-root-ports the claim hot-plugs onto (q35's root bus itself takes no hot-plug). */
export function poolPortArgs(): string[] {
  const port = (id: string, slot: number, physicalSlot: number) =>
    `pcie-root-port,id=${id},bus=pcie.0,addr=${slot.toString(16).padStart(2, '0')}.0,chassis=${POOL_PORT_CHASSIS},slot=${physicalSlot},port=${physicalSlot},io-reserve=0`;
  return ['-device', port(POOL_VFS_PORT_ID, 0x05, 1), '-device', port(POOL_NIC_PORT_ID, 0x06, 2)];
}

/**
 * Pure: what a pooled VM's QEMU argv is built from, apart from its name and paths (no NIC, no
 * virtio-fs; the two root ports the claim plugs them onto are poolPortArgs, added after). A
 * handler's template VM is the same VM (src/runtime/template/plan.ts), so that its clones take
 * the claim's steps.
 */
export function planPoolVmSpec(input: Omit<PoolVmPlanInput, 'vmName' | 'paths'>): {
  spec: Omit<QemuArgvSpec, 'name' | 'paths' | 'nic'>;
  vmm: VmmConfinementPlan;
  /** The PCIe topology's arguments: what the pod's plan is compared with. */
  topologyArgs: string[];
} {
  const { profile } = input.handler;
  const tcg = input.accel.accel === 'tcg';
  const pcie = planPodPcie({
    facts: input.pcieFacts,
    podResources: null,
    annotations: {},
    profile: { ...profile.pcie, confidential: profile.confidential },
    simulateVfioWith: input.simulateVfioWith,
  });
  const vmm = planVmmConfinement(input);
  const spec: Omit<QemuArgvSpec, 'name' | 'paths' | 'nic'> = {
    shape: planPoolShape(input.handler, input.host),
    accel: input.accel.accel,
    kernelPath: input.hypervisor.kernelPath,
    initrdPath: input.hypervisor.initrdPath,
    kernelParams: input.hypervisor.kernelParams,
    pcieArgs: pcie.qemuArgs,
    confidential: false,
    // As a cold boot of this handler has it (src/runtime/plan.ts): a pooled pod is the same VM.
    ...(profile.vm.freePageReporting ? { freePageReporting: true } : {}),
    ...(tcg ? { tcgTranslationCacheMiB: input.hypervisor.tcgTranslationCacheMiB } : {}),
    ...(input.hypervisor.guestImagePath === null ? {} : { guestImagePath: input.hypervisor.guestImagePath }),
    ...(vmm.seccomp === null ? {} : { seccompSandbox: vmm.seccomp }),
  };
  return { spec, vmm, topologyArgs: pcie.qemuArgs };
}

/** Pure: a pooled VM's key, shape and QEMU argv (no NIC, no virtio-fs; two root ports for them). */
export function planPoolVm(input: PoolVmPlanInput): PoolVmPlan {
  const { spec, vmm, topologyArgs } = planPoolVmSpec(input);
  const { virtiofsSocket: _none, ...paths } = input.paths;
  const argv = buildQemuArgv({ ...spec, name: input.vmName, paths });
  argv.push(...poolPortArgs());
  const key: PoolKey = {
    handler: input.handler.name,
    qemuBinary: input.hypervisor.qemuBinary,
    accel: input.accel.accel,
    kernelPath: input.hypervisor.kernelPath,
    initrdPath: input.hypervisor.initrdPath,
    guestImagePath: input.hypervisor.guestImagePath,
    kernelParams: input.hypervisor.kernelParams,
    tcgTranslationCacheMiB: spec.tcgTranslationCacheMiB ?? 0,
    pcieArgs: topologyArgs,
    confined: vmm.unprivileged,
    freePageReporting: input.handler.profile.vm.freePageReporting,
  };
  return { key, shape: spec.shape, vmm, qemu: { binary: input.hypervisor.qemuBinary, accel: input.accel, argv } };
}

/** Why a pod boots cold instead of taking a pooled VM (shown in its status). */
export type PoolMissReason =
  | 'POOL_DISABLED'
  | 'POOL_CONFIDENTIAL'
  | 'POOL_NETNS_NOT_OURS'
  | 'POOL_NO_GUEST_AGENT'
  | 'POOL_COLD_PLUGGED_DEVICES'
  | 'POOL_TOPOLOGY_DIFFERS'
  | 'POOL_HUGEPAGES'
  | 'POOL_GUEST_DIFFERS'
  | 'POOL_VCPUS_BELOW_POOL'
  | 'POOL_VCPUS_BEYOND_POOL'
  | 'POOL_MEMORY_BELOW_POOL'
  | 'POOL_MEMORY_BEYOND_POOL'
  | 'POOL_EMPTY'
  | 'POOL_CLAIM_FAILED';

export interface PoolMiss {
  reason: PoolMissReason;
  /** One sentence naming what differs, with the numbers. */
  message: string;
}

/** What the fit is judged from: the pod's cold plan and its request, and one pooled VM's key and shape. */
export interface PoolFitInput {
  plan: SandboxPlan;
  /** The pod's key (planned from the current config the same way as the pool's). */
  key: PoolKey;
  /** The pod joins a namespace the caller made (the shim's): QEMU's namespace is already fixed. */
  joinsNetns: boolean;
  /** The pooled VM's key and shape; undefined: the pool of this handler has no VM ready. */
  pooled: { key: PoolKey; shape: VmShape } | undefined;
  /** Pool size configured for the handler. */
  poolSize: number;
  withAgent: boolean;
  /** How the messages name the VM ("the pooled VM" unless given: a template's fit says "the template VM"). */
  vmNoun?: string;
}

/** Pure: null when the pod fits the pooled VM, otherwise the first reason it does not. */
export function poolMiss(input: PoolFitInput): PoolMiss | null {
  const { plan, key } = input;
  const miss = (reason: PoolMissReason, message: string): PoolMiss => ({ reason, message });
  const vm = input.vmNoun ?? 'the pooled VM';
  if (plan.confidential) return miss('POOL_CONFIDENTIAL', `handler "${plan.handler}" is confidential and is never pooled`);
  if (input.poolSize === 0) return miss('POOL_DISABLED', `pool.sizes has no pooled VMs for handler "${plan.handler}"`);
  if (!input.withAgent) return miss('POOL_NO_GUEST_AGENT', 'hypervisor.guestImagePath is null: a VM without the agent is never pooled');
  if (input.joinsNetns) return miss('POOL_NETNS_NOT_OURS', "the pod joins its caller's network namespace, not one the pool made");
  const cold = plan.pcie.topology.functions.length;
  if (cold > 0) return miss('POOL_COLD_PLUGGED_DEVICES', `the pod brings ${cold} PCIe functions attached at boot`);
  if (JSON.stringify(plan.pcie.qemuArgs) !== JSON.stringify(key.pcieArgs)) {
    return miss('POOL_TOPOLOGY_DIFFERS', `the pod reserves PCIe ports for announced devices beyond those of ${vm}`);
  }
  const shape = plan.sizing.vm;
  if (shape.hugepages.length > 0 || shape.kernelParams.length > 0) {
    return miss('POOL_HUGEPAGES', 'the pod asks for hugepage pools, which are reserved at boot');
  }
  if (input.pooled === undefined) return miss('POOL_EMPTY', `the pool of handler "${plan.handler}" has no VM ready`);
  const { key: pk, shape: ps } = input.pooled;
  if (!samePoolKey(pk, key)) {
    const fields = (Object.keys(key) as (keyof PoolKey)[]).filter((k) => JSON.stringify(key[k]) !== JSON.stringify(pk[k]));
    return miss('POOL_GUEST_DIFFERS', `${vm} was booted with other ${fields.join(', ')}`);
  }
  if (shape.vcpus < ps.vcpus) return miss('POOL_VCPUS_BELOW_POOL', `the pod plans ${shape.vcpus} vCPUs, below ${vm}'s ${ps.vcpus}`);
  if (shape.maxVcpus > ps.maxVcpus) {
    return miss('POOL_VCPUS_BEYOND_POOL', `the pod plans up to ${shape.maxVcpus} vCPUs, beyond ${vm}'s ${ps.maxVcpus}`);
  }
  if (shape.memoryMiB < ps.memoryMiB || (shape.memoryMiB - ps.memoryMiB) % VIRTIO_MEM_BLOCK_MIB !== 0) {
    return miss('POOL_MEMORY_BELOW_POOL', `the pod plans ${shape.memoryMiB} MiB, not reachable from ${vm}'s ${ps.memoryMiB} MiB`);
  }
  if (shape.maxMemoryMiB > ps.maxMemoryMiB) {
    return miss('POOL_MEMORY_BEYOND_POOL', `the pod plans up to ${shape.maxMemoryMiB} MiB, beyond ${vm}'s ${ps.maxMemoryMiB} MiB`);
  }
  return null;
}

/** The steps that turn a pooled VM into the pod's VM (pure; applied in order by claim.ts). */
export interface ClaimPlan {
  /** vCPUs to hot-plug: the pod's boot vCPUs minus the pooled VM's. */
  addVcpus: number;
  /** virtio-mem requested size: the pod's boot RAM minus the pooled VM's. */
  virtioMemMiB: number;
  /** The headroom the pooled VM's virtio-mem device holds. */
  virtioMemMaxMiB: number;
  /** The NIC (when the pod has a network): on the pool's NIC port, with CNI's MAC (known at claim). */
  nic: { portId: string } | null;
  /** The virtio-fs device, on the pool's own port. */
  sharedFs: { portId: string };
}

/** Pure: the claim of a pooled VM of `pooled` by a pod whose cold plan is `plan` (fit checked first). */
export function planClaim(plan: SandboxPlan, pooled: VmShape, withNetwork: boolean): ClaimPlan {
  const shape = plan.sizing.vm;
  return {
    addVcpus: shape.vcpus - pooled.vcpus,
    virtioMemMiB: shape.memoryMiB - pooled.memoryMiB,
    virtioMemMaxMiB: pooled.maxMemoryMiB - pooled.memoryMiB,
    nic: withNetwork ? { portId: POOL_NIC_PORT_ID } : null,
    sharedFs: { portId: POOL_VFS_PORT_ID },
  };
}

/**
 * The limits a pooled VM's own cgroup gets (docs/pool.md#the-pools-cgroup): no quota, no memory
 * limit, the CPU request the kubelet's conversion turns into `cpuShares` (the pool's weight).
 */
export function poolCgroupLimits(cpuShares: number): VmmLimits {
  return { cpuQuotaMillicores: 0, cpuRequestMillicores: millicoresForShares(cpuShares), memoryLimitBytes: 0 };
}

/**
 * A pooled VM's placement as recorded: with the cgroupfs driver its `createdParents` also lists
 * the pool's cgroup (each leaf's parent directory) whoever made it, so that removing the last
 * pooled VM's cgroup removes the pool's too (it is left while another VM is in it). The claim
 * removes a pooled VM's cgroup without its parents (`createdParents: []`): the refill may be
 * placing the next VM in the pool's cgroup meanwhile. systemd keeps the slice.
 */
export function withPoolCgroup(placement: PlacementRecord): PlacementRecord {
  if (placement.driver !== 'cgroupfs') return placement;
  const parents = Object.values(placement.paths).map((leaf) => path.dirname(leaf));
  return { ...placement, createdParents: [...new Set([...(placement.createdParents ?? []), ...parents])] };
}
