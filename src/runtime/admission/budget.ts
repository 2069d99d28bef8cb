import { exhausted } from '../../common/errors.js';
import type { CpuMemory } from '../../config/types.js';
import { ceilDiv } from '../../sizing/quantity.js';
import { HOTPLUG_MEMORY_ALIGN_MIB } from '../../sizing/shape.js';
import type { HugepageReservation } from '../../sizing/types.js';
import type { AdmissionDemand } from './demand.js';

const MIB = 1024n * 1024n;

/** The VM as it runs now (boot shape plus any growth so far) and the ceilings planned at boot. */
export interface VmBudgetShape {
  vcpus: number;
  memoryMiB: number;
  /** VmShape.maxVcpus / maxMemoryMiB: equal to vcpus / memoryMiB for a VM that cannot grow. */
  maxVcpus: number;
  maxMemoryMiB: number;
  /** Guest hugepage pools, reserved on the kernel command line at boot: they never grow. */
  hugepages: readonly HugepageReservation[];
}

export interface FitBudgetInput {
  /** For messages. */
  containerName: string;
  shape: VmBudgetShape;
  handler: { confidential: boolean; guestOverhead: CpuMemory };
  /**
   * Containers already admitted that can run beside the incoming one (created or running; not
   * exited or removed): they consume the capacity first.
   */
  admitted: readonly AdmissionDemand[];
  incoming: AdmissionDemand;
}

/** What a VM shape gives containers. */
export interface WorkloadCapacity {
  cpuMillicores: number;
  memoryBytes: number;
  /** Page size ("2Mi") -> bytes reserved. */
  hugepages: Record<string, number>;
}

/** Where the VM must grow to for the incoming container: targets and the steps to get there. */
export interface GrowPlan {
  /** vCPUs online after growing (plug `addVcpus` more). */
  vcpus: number;
  /** Memory after growing (virtio-mem plugs `addMemoryMiB` more, whole 128 MiB blocks). */
  memoryMiB: number;
  addVcpus: number;
  addMemoryMiB: number;
}

/** `fits: true`: fits as the VM is. `fits: false`: fits once the VM grows as `grow` says. */
export type BudgetFit = { fits: true } | { fits: false; grow: GrowPlan };

function hugepagePools(shape: VmBudgetShape): Map<string, bigint> {
  const out = new Map<string, bigint>();
  for (const h of shape.hugepages) out.set(h.pageSize, (out.get(h.pageSize) ?? 0n) + BigInt(h.pageSizeBytes) * BigInt(h.count));
  return out;
}

function poolsMiB(pools: ReadonlyMap<string, bigint>): bigint {
  let total = 0n;
  for (const bytes of pools.values()) total += ceilDiv(bytes, MIB);
  return total;
}

/**
 * The VM's workload capacity: vCPUs * 1000 minus the guest's CPU overhead; memory minus the
 * guest's overhead and the hugepage pools (the sizing planner added both on top of the
 * workload, so this is the inverse of its formula); the hugepage pools themselves. Never below 0.
 */
export function workloadCapacity(shape: VmBudgetShape, guestOverhead: CpuMemory): WorkloadCapacity {
  const pools = hugepagePools(shape);
  const cpu = shape.vcpus * 1000 - guestOverhead.cpuMillicores;
  const memoryMiB = BigInt(shape.memoryMiB) - BigInt(guestOverhead.memoryMiB) - poolsMiB(pools);
  return {
    cpuMillicores: Math.max(0, cpu),
    memoryBytes: memoryMiB > 0n ? Number(memoryMiB * MIB) : 0,
    hugepages: Object.fromEntries([...pools].map(([k, v]) => [k, Number(v)])),
  };
}

function sum(values: readonly number[]): bigint {
  return values.reduce((acc, v) => acc + BigInt(v), 0n);
}

function mib(bytes: bigint): string {
  return `${ceilDiv(bytes, MIB)} MiB`;
}

/**
 * Decide whether one more container fits a VM sized WITHOUT pod_resources (pure).
 *
 * Semantics:
 * - The containers' demands (admitted ones plus the incoming one) add up; they must fit the VM's
 *   workload capacity (see `workloadCapacity`), resource by resource.
 * - CPU grows by whole vCPUs: the VM needs ceil((demand + guest CPU overhead) / 1000) vCPUs,
 *   the sizing planner's own formula. Memory grows in 128 MiB blocks (the Linux memory block
 *   that the guest onlines; the hot-plug region was planned as a multiple of it): boot RAM must
 *   cover demand + guest overhead + hugepage pools. Neither shrinks here.
 * - Growth stops at the ceilings planned at boot (maxVcpus, maxMemoryMiB); beyond them, or when
 *   a hugepage pool is too small (pools are fixed at boot), throws exhausted
 *   ADMISSION_BUDGET_EXCEEDED with the numbers (needed, available now, maximum).
 * - A confidential handler's VM never changes after boot: when CPU or memory would have to grow,
 *   throws exhausted ADMISSION_CONFIDENTIAL_STATIC with the numbers, whatever its ceilings say.
 */
export function fitBudget(input: FitBudgetInput): BudgetFit {
  const { shape, handler, incoming, admitted, containerName } = input;
  const overheadCpu = BigInt(handler.guestOverhead.cpuMillicores);
  const overheadMiB = BigInt(handler.guestOverhead.memoryMiB);
  const pools = hugepagePools(shape);
  const poolMiB = poolsMiB(pools);

  const admittedCpu = sum(admitted.map((d) => d.cpuMillicores));
  const needCpu = admittedCpu + BigInt(incoming.cpuMillicores);
  const admittedMem = sum(admitted.map((d) => d.memoryBytes));
  const needMem = admittedMem + BigInt(incoming.memoryBytes);

  const vcpus = BigInt(shape.vcpus);
  const memoryMiB = BigInt(shape.memoryMiB);
  const cpuAt = (n: bigint): bigint => n * 1000n - overheadCpu;
  const memAt = (miB: bigint): bigint => (miB - overheadMiB - poolMiB) * MIB;

  const wantVcpus = ceilDiv(needCpu + overheadCpu, 1000n);
  const targetVcpus = wantVcpus > vcpus ? wantVcpus : vcpus;
  const wantMiB = ceilDiv(needMem, MIB) + overheadMiB + poolMiB;
  const targetMiB =
    wantMiB > memoryMiB ? memoryMiB + ceilDiv(wantMiB - memoryMiB, HOTPLUG_MEMORY_ALIGN_MIB) * HOTPLUG_MEMORY_ALIGN_MIB : memoryMiB;

  const cpuLine = `cpu needs ${needCpu}m (${admittedCpu}m admitted + ${incoming.cpuMillicores}m incoming) with ${cpuAt(vcpus)}m available at ${vcpus} vCPUs`;
  const memLine = `memory needs ${mib(needMem)} (${mib(admittedMem)} admitted + ${mib(BigInt(incoming.memoryBytes))} incoming) with ${mib(memAt(memoryMiB))} available at ${memoryMiB} MiB`;
  const hugepageLines: string[] = [];
  const hugepageDetails: Record<string, { neededBytes: number; availableBytes: number }> = {};
  const sizes = new Set([...pools.keys(), ...Object.keys(incoming.hugepages), ...admitted.flatMap((d) => Object.keys(d.hugepages))]);
  for (const size of [...sizes].sort()) {
    const need = sum(admitted.map((d) => d.hugepages[size] ?? 0)) + BigInt(incoming.hugepages[size] ?? 0);
    const have = pools.get(size) ?? 0n;
    hugepageDetails[size] = { neededBytes: Number(need), availableBytes: Number(have) };
    if (need > have)
      hugepageLines.push(`hugepages-${size} needs ${mib(need)} with ${mib(have)} reserved at boot (hugepage pools never grow)`);
  }

  const cpuShort = targetVcpus > vcpus;
  const memShort = targetMiB > memoryMiB;
  const details = {
    container: containerName,
    cpu: {
      neededMillicores: Number(needCpu),
      availableMillicores: Number(cpuAt(vcpus)),
      maxMillicores: Number(cpuAt(BigInt(shape.maxVcpus))),
      vcpus: shape.vcpus,
      maxVcpus: shape.maxVcpus,
      neededVcpus: Number(targetVcpus),
    },
    memory: {
      neededBytes: Number(needMem),
      availableBytes: Number(memAt(memoryMiB)),
      maxBytes: Number(memAt(BigInt(shape.maxMemoryMiB))),
      memoryMiB: shape.memoryMiB,
      maxMemoryMiB: shape.maxMemoryMiB,
      neededMemoryMiB: Number(targetMiB),
    },
    hugepages: hugepageDetails,
  };
  const who = `container ${JSON.stringify(containerName)}`;

  if (handler.confidential && (cpuShort || memShort)) {
    const lines = [...(cpuShort ? [cpuLine] : []), ...(memShort ? [memLine] : []), ...hugepageLines];
    throw exhausted(
      'ADMISSION_CONFIDENTIAL_STATIC',
      `${who} does not fit its confidential VM, which never changes after boot: ${lines.join('; ')}`,
      { details },
    );
  }
  const cpuBeyond = targetVcpus > BigInt(shape.maxVcpus);
  const memBeyond = targetMiB > BigInt(shape.maxMemoryMiB);
  if (cpuBeyond || memBeyond || hugepageLines.length > 0) {
    const lines = [
      ...(cpuBeyond ? [`${cpuLine}, at most ${cpuAt(BigInt(shape.maxVcpus))}m at the planned maximum of ${shape.maxVcpus} vCPUs`] : []),
      ...(memBeyond
        ? [`${memLine}, at most ${mib(memAt(BigInt(shape.maxMemoryMiB)))} at the planned maximum of ${shape.maxMemoryMiB} MiB`]
        : []),
      ...hugepageLines,
    ];
    throw exhausted('ADMISSION_BUDGET_EXCEEDED', `${who} does not fit its VM even grown to the planned maximum: ${lines.join('; ')}`, {
      details,
    });
  }
  if (!cpuShort && !memShort) return { fits: true };
  return {
    fits: false,
    grow: {
      vcpus: Number(targetVcpus),
      memoryMiB: Number(targetMiB),
      addVcpus: Number(targetVcpus - vcpus),
      addMemoryMiB: Number(targetMiB - memoryMiB),
    },
  };
}
