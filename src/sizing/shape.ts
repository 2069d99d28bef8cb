import { exhausted, invalid } from '../common/errors.js';
import type { ResolvedHandler } from '../config/handlers.js';
import type { ContainerDemand, PodDemand } from './demand.js';
import type { PodSandboxConfigInput } from './input.js';
import { ceilDiv } from './quantity.js';
import { HUGEPAGE_SIZES } from './resources.js';
import { resolveDemand, resolveVmmOverhead, type VmmOverhead } from './sources.js';
import type {
  ContainerResourcesPlan,
  HostBudget,
  HostCapacity,
  HugepageReservation,
  SizingPlan,
  VmShape,
  WorkloadResources,
} from './types.js';

const MIB = 1024n * 1024n;

/**
 * Boot RAM is a multiple of 2 MiB. QEMU itself only needs page granularity, but 2 MiB is the
 * x86-64 huge page (PMD) size: a 2 MiB-aligned RAM size lets the host back the whole guest with
 * transparent or hugetlbfs huge pages (a hugetlbfs-backed memory-backend refuses sizes that are
 * not a multiple of its page size), keeps every guest hugepage pool wholly inside RAM, and is the
 * default virtio-mem block size on x86-64, so boot RAM and plugged blocks tile evenly.
 */
export const BOOT_MEMORY_ALIGN_MIB = 2n;

/**
 * The hot-plug region (maxMemoryMiB - memoryMiB) is a multiple of 128 MiB: Linux on x86-64 adds
 * and onlines memory in memory blocks of 128 MiB (SECTION_SIZE_BITS = 27), for ACPI DIMMs and
 * virtio-mem alike; a region that ends mid-block leaves the tail unusable by the guest.
 */
export const HOTPLUG_MEMORY_ALIGN_MIB = 128n;

export interface PlanSizingInput {
  /** The RunPodSandboxRequest's config, decoded (or in the same shape). */
  config: PodSandboxConfigInput;
  handler: ResolvedHandler;
  host: HostCapacity;
  /** QEMU's translated-code cache under TCG (0 or absent under KVM), added to the VMM's memory budget. */
  translationCacheMiB?: number;
  /** The free-page-reporting balloon device (0 or absent: none), added to the VMM's memory budget. */
  balloonMiB?: number;
}

function alignUp(value: bigint, to: bigint): bigint {
  return ceilDiv(value, to) * to;
}

function min(...values: bigint[]): bigint {
  // biome-ignore lint/complexity/useMathMinMax: Math.min does not take bigint.
  return values.reduce((a, b) => (b < a ? b : a));
}

function max(...values: bigint[]): bigint {
  // biome-ignore lint/complexity/useMathMinMax: Math.max does not take bigint.
  return values.reduce((a, b) => (b > a ? b : a));
}

/** Convert after the ceilings were checked; anything still beyond 2^53 is refused, not rounded. */
function toNumber(value: bigint, what: string): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw invalid('SIZING_VALUE_TOO_LARGE', `${what} is ${value}, beyond what kata-ts can plan with (2^53)`);
  }
  return Number(value);
}

function podLabel(config: PodSandboxConfigInput): string {
  const m = config.metadata;
  if (m?.name === undefined || m.name === '') return 'the pod';
  return `pod ${m.namespace !== undefined && m.namespace !== '' ? `${m.namespace}/` : ''}${m.name}`;
}

function hugepageReservations(demand: PodDemand): HugepageReservation[] {
  const out: HugepageReservation[] = [];
  for (const [pageSizeBytes, size] of [...HUGEPAGE_SIZES].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
    const bytes = demand.hugepageBytes.get(size.name) ?? 0n;
    if (bytes <= 0n) continue;
    // A request that is not a whole number of pages still needs its last page.
    const count = ceilDiv(bytes, pageSizeBytes);
    out.push({ pageSize: size.name, pageSizeBytes: Number(pageSizeBytes), count: toNumber(count, `hugepages-${size.name} page count`) });
  }
  return out;
}

function kernelParamsFor(hugepages: HugepageReservation[]): string[] {
  // One `hugepagesz=` / `hugepages=` pair per pool, pairs in this order (the kernel reads them so).
  return hugepages.flatMap((h) => {
    const kernel = HUGEPAGE_SIZES.get(BigInt(h.pageSizeBytes))!.kernel;
    return [`hugepagesz=${kernel}`, `hugepages=${h.count}`];
  });
}

function shapeVm(demand: PodDemand, input: PlanSizingInput, vmm: VmmOverhead): VmShape {
  const { profile, name: handlerName } = input.handler;
  const { vm, guestOverhead } = profile;
  const who = podLabel(input.config);

  // A pod with a container that states no CPU at all may use any amount: give it the default.
  const vcpuFloor = demand.cpuUnbounded ? max(BigInt(vm.defaultVcpus), 1n) : 1n;
  const cpuNeed = demand.cpuLimitMillis + BigInt(guestOverhead.cpuMillicores);
  const vcpus = max(vcpuFloor, ceilDiv(cpuNeed, 1000n));
  const cpuWhy = `${demand.cpuLimitMillis}m workload + ${guestOverhead.cpuMillicores}m guest overhead`;
  const cpuDetails = {
    vcpus: String(vcpus),
    workloadMillicores: String(demand.cpuLimitMillis),
    guestOverheadMillicores: guestOverhead.cpuMillicores,
  };
  if (vcpus > BigInt(vm.maxVcpus)) {
    throw exhausted(
      'SIZING_VCPUS_EXCEED_HANDLER',
      `${who} needs ${vcpus} vCPUs (${cpuWhy}) but handler "${handlerName}" allows at most ${vm.maxVcpus}`,
      {
        details: { ...cpuDetails, handlerMaxVcpus: vm.maxVcpus },
      },
    );
  }
  if (vcpus > BigInt(input.host.cpus)) {
    throw exhausted('SIZING_VCPUS_EXCEED_HOST', `${who} needs ${vcpus} vCPUs (${cpuWhy}) but this host has ${input.host.cpus} CPUs`, {
      details: { ...cpuDetails, hostCpus: input.host.cpus },
    });
  }

  const hugepages = hugepageReservations(demand);
  const hugepagesMiB = hugepages.reduce((sum, h) => sum + (BigInt(h.pageSizeBytes) * BigInt(h.count)) / MIB, 0n);
  const memoryFloor = demand.memoryUnbounded ? max(BigInt(vm.defaultMemoryMiB), BigInt(vm.minMemoryMiB)) : BigInt(vm.minMemoryMiB);
  const workloadMiB = ceilDiv(demand.memoryLimitBytes, MIB);
  const baseMiB = max(memoryFloor, workloadMiB + BigInt(guestOverhead.memoryMiB));
  const memoryMiB = alignUp(baseMiB + hugepagesMiB, BOOT_MEMORY_ALIGN_MIB);
  const memWhy = `workload ${workloadMiB} MiB + guest overhead ${guestOverhead.memoryMiB} MiB + hugepages ${hugepagesMiB} MiB, floor ${memoryFloor} MiB`;
  const memDetails = { memoryMiB: String(memoryMiB), workloadMiB: String(workloadMiB), hugepagesMiB: String(hugepagesMiB) };
  if (memoryMiB > BigInt(vm.maxMemoryMiB)) {
    throw exhausted(
      'SIZING_MEMORY_EXCEEDS_HANDLER',
      `${who} needs ${memoryMiB} MiB of VM memory (${memWhy}) but handler "${handlerName}" allows at most ${vm.maxMemoryMiB} MiB`,
      {
        details: { ...memDetails, handlerMaxMemoryMiB: vm.maxMemoryMiB },
      },
    );
  }
  const hostMiB = BigInt(Math.floor(input.host.memoryMiB));
  const budgetMiB = ceilDiv(memoryMiB * MIB + vmm.memoryBytes, MIB);
  if (budgetMiB > hostMiB) {
    throw exhausted(
      'SIZING_MEMORY_EXCEEDS_HOST',
      `${who} needs ${budgetMiB} MiB on the host (VM ${memoryMiB} MiB + VMM overhead ${ceilDiv(vmm.memoryBytes, MIB)} MiB) but this host has ${hostMiB} MiB`,
      { details: { ...memDetails, budgetMiB: String(budgetMiB), hostMemoryMiB: input.host.memoryMiB } },
    );
  }

  let maxVcpus = vcpus;
  let maxMemoryMiB = memoryMiB;
  if (!profile.confidential) {
    // Headroom for CPU and memory hot-plug, never beyond the handler's ceiling or the host.
    maxVcpus = min(vcpus + BigInt(vm.hotplugVcpus), BigInt(vm.maxVcpus), BigInt(input.host.cpus));
    const room = min(BigInt(vm.hotplugMemoryMiB), BigInt(vm.maxMemoryMiB) - memoryMiB, hostMiB - memoryMiB);
    const headroom = room > 0n ? (room / HOTPLUG_MEMORY_ALIGN_MIB) * HOTPLUG_MEMORY_ALIGN_MIB : 0n;
    maxMemoryMiB = memoryMiB + headroom;
  }
  return {
    vcpus: toNumber(vcpus, 'vcpus'),
    maxVcpus: toNumber(maxVcpus, 'maxVcpus'),
    memoryMiB: toNumber(memoryMiB, 'memoryMiB'),
    maxMemoryMiB: toNumber(maxMemoryMiB, 'maxMemoryMiB'),
    hugepages,
    kernelParams: kernelParamsFor(hugepages),
  };
}

function record(map: ReadonlyMap<string, bigint>, what: string): Record<string, number> {
  return Object.fromEntries([...map].map(([k, v]) => [k, toNumber(v, `${what} ${k}`)]));
}

function extendedRecord(map: ReadonlyMap<string, bigint>): Record<string, string> {
  return Object.fromEntries([...map].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, v]) => [k, v.toString()]));
}

function containerPlan(c: ContainerDemand): ContainerResourcesPlan {
  const what = `container "${c.name}"`;
  return {
    name: c.name,
    type: c.type,
    cpuRequestMillicores: toNumber(c.cpuRequestMillis, `${what} cpu request`),
    cpuLimitMillicores: c.cpuLimitMillis === null ? null : toNumber(c.cpuLimitMillis, `${what} cpu limit`),
    memoryRequestBytes: toNumber(c.memoryRequestBytes, `${what} memory request`),
    memoryLimitBytes: c.memoryLimitBytes === null ? null : toNumber(c.memoryLimitBytes, `${what} memory limit`),
    hugepages: record(c.hugepageBytes, `${what} hugepages`),
    extended: extendedRecord(c.extended),
  };
}

/**
 * Size a pod's VM and its host budget (pure). Throws KataError invalid for contradictory input
 * and exhausted (with the numbers) when the pod exceeds the handler's ceiling or the host.
 */
export function planSizing(input: PlanSizingInput): SizingPlan {
  const demand = resolveDemand(input.config);
  const { guestOverhead } = input.handler.profile;
  const translationCacheBytes = BigInt(input.translationCacheMiB ?? 0) * MIB;
  const balloonBytes = BigInt(input.balloonMiB ?? 0) * MIB;
  const vmm = resolveVmmOverhead(input.config, input.handler.profile, {
    cpuMillis: BigInt(guestOverhead.cpuMillicores),
    memoryBytes: BigInt(guestOverhead.memoryMiB) * MIB + translationCacheBytes + balloonBytes,
  });
  const vm = shapeVm(demand, input, vmm);
  const workload: WorkloadResources = {
    cpuRequestMillicores: toNumber(demand.cpuRequestMillis, 'cpu request'),
    cpuLimitMillicores: toNumber(demand.cpuLimitMillis, 'cpu limit'),
    memoryRequestBytes: toNumber(demand.memoryRequestBytes, 'memory request'),
    memoryLimitBytes: toNumber(demand.memoryLimitBytes, 'memory limit'),
    hugepages: record(demand.hugepageBytes, 'hugepages'),
    extended: extendedRecord(demand.extended),
  };
  const vmmCpu = toNumber(vmm.cpuMillis, 'VMM cpu overhead');
  const hostMemoryBytes = BigInt(vm.memoryMiB) * MIB + vmm.memoryBytes + translationCacheBytes + balloonBytes;
  // The kubelet limits a pod's cgroup to its containers' limits plus the overhead it sends; what
  // the VM costs beyond both is the shortfall. Unknown (none) when no overhead was sent at all.
  const shortfallBytes =
    demand.memoryUnbounded || vmm.podOverheadMemoryBytes === undefined
      ? 0n
      : hostMemoryBytes - demand.memoryLimitBytes - vmm.podOverheadMemoryBytes;
  const host: HostBudget = {
    memoryLimitBytes: toNumber(hostMemoryBytes, 'host memory budget'),
    cpuQuotaMillicores: vm.vcpus * 1000 + vmmCpu,
    cpuRequestMillicores: workload.cpuRequestMillicores + vmmCpu,
  };
  return {
    source: demand.source,
    workload,
    vm,
    host,
    vmmOverhead: {
      cpuSource: vmm.cpuSource,
      memorySource: vmm.memorySource,
      cpuMillicores: vmmCpu,
      memoryBytes: toNumber(vmm.memoryBytes, 'VMM memory overhead'),
      ...(translationCacheBytes > 0n ? { translationCacheBytes: toNumber(translationCacheBytes, 'TCG translation cache') } : {}),
      ...(balloonBytes > 0n ? { balloonBytes: toNumber(balloonBytes, 'balloon device') } : {}),
    },
    containers: demand.containers.map(containerPlan),
    ...(shortfallBytes > 0n ? { overheadShortfallBytes: toNumber(shortfallBytes, 'overhead shortfall') } : {}),
  };
}
