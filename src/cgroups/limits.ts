/**
 * Pure conversions from a VMM budget (millicores, bytes) to what the kernel and systemd take,
 * shared by both drivers. The CPU conversions follow the kubelet's (pkg/kubelet/cm helpers) so
 * that a VMM placed by kata-ts is weighed exactly like a container the kubelet sized itself.
 */
import { invalid } from '../common/errors.js';
import type { CgroupMode, VmmLimits } from './types.js';

/** CFS period the kubelet uses (100 ms); kata-ts never changes it. */
export const CFS_PERIOD_US = 100_000;
/** The kernel refuses a CFS quota below 1 ms; the kubelet raises smaller quotas to it. */
export const MIN_CFS_QUOTA_US = 1_000;
/** cpu.shares bounds of the kernel (MIN_SHARES, MAX_SHARES = 1 << 18). */
export const MIN_CPU_SHARES = 2;
export const MAX_CPU_SHARES = 262_144;
const SHARES_PER_CPU = 1024;
const MILLICORES_PER_CPU = 1000;
/** systemd's "infinity" for usec and byte properties (UINT64_MAX). */
export const SYSTEMD_INFINITY = 18_446_744_073_709_551_615n;
/**
 * The kernel keeps memory limits in pages and reads them back as pages * 4096, so a limit is
 * planned page-aligned (rounded down, as the kernel would) and reads back unchanged.
 */
export const PAGE_SIZE_BYTES = 4096;
/** Below this a VMM is OOM-killed as soon as it touches guest RAM; such a limit is a planning bug. */
export const MIN_MEMORY_LIMIT_BYTES = 1024 * 1024;

function checkField(value: number, field: keyof VmmLimits): void {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw invalid('CGROUP_LIMITS_INVALID', `limits.${field} must be a non-negative integer, got ${value}.`, {
      details: { field, value },
    });
  }
}

/** Throws INVALID_ARGUMENT naming the first field that is not a usable limit. */
export function validateLimits(limits: VmmLimits): void {
  checkField(limits.cpuQuotaMillicores, 'cpuQuotaMillicores');
  checkField(limits.cpuRequestMillicores, 'cpuRequestMillicores');
  checkField(limits.memoryLimitBytes, 'memoryLimitBytes');
  if (limits.memoryLimitBytes !== 0 && limits.memoryLimitBytes < MIN_MEMORY_LIMIT_BYTES) {
    throw invalid(
      'CGROUP_LIMITS_INVALID',
      `limits.memoryLimitBytes ${limits.memoryLimitBytes} is below the ${MIN_MEMORY_LIMIT_BYTES}-byte minimum (0 means no limit).`,
      { details: { field: 'memoryLimitBytes', value: limits.memoryLimitBytes } },
    );
  }
}

/**
 * The CPU request whose kubelet conversion (milliCpuToShares) gives `shares`, or the next shares
 * above it for the few values no request reaches (the conversion steps by 1.024): the smallest
 * such request. Pure; `shares` within [MIN_CPU_SHARES, MAX_CPU_SHARES].
 */
export function millicoresForShares(shares: number): number {
  if (shares <= MIN_CPU_SHARES) return 0;
  let m = Math.floor((shares * MILLICORES_PER_CPU) / SHARES_PER_CPU);
  while (milliCpuToShares(m) < shares) m++;
  return m;
}

/** The weight file writes that give a parent cgroup `shares` (v1/hybrid cpu.shares, v2 cpu.weight). */
export function parentWeightWrite(shares: number, mode: CgroupMode): CgroupFileWrite {
  const clamped = Math.min(Math.max(Math.floor(shares), MIN_CPU_SHARES), MAX_CPU_SHARES);
  return mode === 'v2'
    ? { controller: 'cpu', file: 'cpu.weight', value: String(sharesToWeight(clamped)) }
    : { controller: 'cpu', file: 'cpu.shares', value: String(clamped) };
}

/** systemd's property for a slice's weight: CPUShares (v1/hybrid) or CPUWeight (v2). */
export function systemdWeightProperty(shares: number, mode: CgroupMode): SystemdProperty {
  const clamped = Math.min(Math.max(Math.floor(shares), MIN_CPU_SHARES), MAX_CPU_SHARES);
  return mode === 'v2' ? ['CPUWeight', 't', BigInt(sharesToWeight(clamped))] : ['CPUShares', 't', BigInt(clamped)];
}

/** CFS quota in microseconds per period; 0 means "no quota" (the kubelet's MilliCPUToQuota). */
export function milliCpuToQuotaUs(milliCpu: number, periodUs: number = CFS_PERIOD_US): number {
  if (milliCpu === 0) return 0;
  const quota = Math.floor((milliCpu * periodUs) / MILLICORES_PER_CPU);
  return Math.max(quota, MIN_CFS_QUOTA_US);
}

/** cpu.shares for a CPU request (the kubelet's MilliCPUToShares: 0 -> 2, clamped to [2, 262144]). */
export function milliCpuToShares(milliCpu: number): number {
  if (milliCpu === 0) return MIN_CPU_SHARES;
  const shares = Math.floor((milliCpu * SHARES_PER_CPU) / MILLICORES_PER_CPU);
  return Math.min(Math.max(shares, MIN_CPU_SHARES), MAX_CPU_SHARES);
}

/**
 * cgroup v2 cpu.weight for v1 shares, as runc/crun and the kubelet convert them since
 * kubernetes#131216: a quadratic in log2(shares) that maps 2 -> 1, 1024 -> 100 (both defaults)
 * and 262144 -> 10000. The older linear mapping (1 + (s-2)*9999/262142) turned the default 1024
 * shares into weight 39, starving pods against system services at weight 100.
 */
export function sharesToWeight(shares: number): number {
  if (shares <= MIN_CPU_SHARES) return 1;
  if (shares >= MAX_CPU_SHARES) return 10_000;
  const l = Math.log2(shares);
  const exponent = (l * l + 125 * l) / 612 - 7 / 34;
  return Math.ceil(10 ** exponent);
}

/**
 * systemd's CPUQuotaPerSecUSec for a quota; SYSTEMD_INFINITY when there is none. systemd keeps
 * the quota as a whole percentage of a CPU, so a value that is not a multiple of 10 ms per second
 * is rounded up to one (as runc does) - otherwise systemd would round it down below the plan.
 */
export function quotaPerSecUSec(quotaUs: number, periodUs: number = CFS_PERIOD_US): bigint {
  if (quotaUs === 0) return SYSTEMD_INFINITY;
  const perSec = Math.floor((quotaUs * 1_000_000) / periodUs);
  const rounded = perSec % 10_000 === 0 ? perSec : (Math.floor(perSec / 10_000) + 1) * 10_000;
  return BigInt(rounded);
}

/** The page-aligned memory limit the kernel will hold; 0 stays 0 (no limit). */
export function alignedMemoryBytes(bytes: number): number {
  return bytes - (bytes % PAGE_SIZE_BYTES);
}

/** Everything a driver writes, decided once from the limits. */
export interface LimitPlan {
  periodUs: number;
  /** 0 = no quota. */
  quotaUs: number;
  shares: number;
  weight: number;
  /** 0 = no limit. */
  memoryBytes: number;
  /** The quota systemd will write for CPUQuotaPerSecUSec (rounded up to whole percent). */
  systemdQuotaUs: number;
}

export function planLimits(limits: VmmLimits): LimitPlan {
  validateLimits(limits);
  const quotaUs = milliCpuToQuotaUs(limits.cpuQuotaMillicores);
  const shares = milliCpuToShares(limits.cpuRequestMillicores);
  const perSec = quotaPerSecUSec(quotaUs);
  return {
    periodUs: CFS_PERIOD_US,
    quotaUs,
    shares,
    weight: sharesToWeight(shares),
    memoryBytes: alignedMemoryBytes(limits.memoryLimitBytes),
    systemdQuotaUs: quotaUs === 0 ? 0 : Number((perSec * BigInt(CFS_PERIOD_US)) / 1_000_000n),
  };
}

/**
 * What the default vmmPidsMargin (192) is made of, counted on Debian's QEMU 7.2 and C virtiofsd:
 * QEMU's fixed threads (main loop, RCU, call_rcu, signalfd/QMP, a VNC or audio worker when
 * configured: at most 8), its AIO worker pool (thread-pool-max: 64 per AioContext), virtiofsd's
 * main and queue threads (8) and its thread pool (--thread-pool-size: 64), and the launch chain's
 * helpers (nsenter, setpriv, the jailer: 8); the rest (40) is headroom for QEMU versions that add
 * threads. A fork bomb in the VMM stops at the total.
 */
export const VMM_PIDS_MARGIN_PARTS = {
  qemuFixedThreads: 8,
  qemuAioPool: 64,
  virtiofsdThreads: 8,
  virtiofsdPool: 64,
  launchHelpers: 8,
  headroom: 40,
} as const;

/**
 * The VMM cgroup's pids.max (systemd TasksMax): one task per vCPU the VM may grow to (QEMU runs a
 * thread per vCPU, hot-plugged ones included), one per iothread, and the margin for everything
 * else QEMU and virtiofsd run (VMM_PIDS_MARGIN_PARTS). Pure.
 */
export function vmmPidsMax(maxVcpus: number, iothreads: number, marginTasks: number): number {
  for (const [field, value] of [
    ['maxVcpus', maxVcpus],
    ['iothreads', iothreads],
    ['marginTasks', marginTasks],
  ] as const) {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw invalid('CGROUP_LIMITS_INVALID', `pids.max input ${field} must be a non-negative integer, got ${value}.`, {
        details: { field, value },
      });
    }
  }
  return maxVcpus + iothreads + marginTasks;
}

/** A task limit must be a positive whole number (0 tasks could not even hold the VMM). */
export function checkPidsMax(pidsMax: number | undefined): void {
  if (pidsMax !== undefined && (!Number.isSafeInteger(pidsMax) || pidsMax <= 0)) {
    throw invalid('CGROUP_LIMITS_INVALID', `pidsMax must be a positive integer, got ${pidsMax}.`, {
      details: { field: 'pidsMax', value: pidsMax },
    });
  }
}

/** The pids.max write for `pidsMax` tasks (the same file in v1's pids hierarchy and in cgroup2). */
export function pidsMaxWrite(pidsMax: number): CgroupFileWrite {
  return { controller: 'pids', file: 'pids.max', value: String(pidsMax) };
}

/** One interface file write: which controller's hierarchy, which file, what value. */
export interface CgroupFileWrite {
  controller: 'cpu' | 'memory' | 'pids';
  file: string;
  value: string;
}

/**
 * The interface files written for a plan, in order. v1: the period before the quota, because
 * the kernel checks quota/period as a pair against the parent's ratio. v2: cpu.max carries both.
 * Hybrid mode writes the v1 files (the controllers are bound to v1 there).
 */
export function cgroupFileWrites(plan: LimitPlan, mode: CgroupMode): CgroupFileWrite[] {
  if (mode === 'v2') {
    return [
      { controller: 'cpu', file: 'cpu.max', value: `${plan.quotaUs === 0 ? 'max' : plan.quotaUs} ${plan.periodUs}` },
      { controller: 'cpu', file: 'cpu.weight', value: String(plan.weight) },
      { controller: 'memory', file: 'memory.max', value: plan.memoryBytes === 0 ? 'max' : String(plan.memoryBytes) },
    ];
  }
  return [
    { controller: 'cpu', file: 'cpu.cfs_period_us', value: String(plan.periodUs) },
    { controller: 'cpu', file: 'cpu.cfs_quota_us', value: plan.quotaUs === 0 ? '-1' : String(plan.quotaUs) },
    { controller: 'cpu', file: 'cpu.shares', value: String(plan.shares) },
    { controller: 'memory', file: 'memory.limit_in_bytes', value: plan.memoryBytes === 0 ? '-1' : String(plan.memoryBytes) },
  ];
}

/** A systemd unit property without D-Bus types: name, D-Bus signature, value. */
export type SystemdProperty = readonly [name: string, signature: 'b' | 's' | 't' | 'au', value: boolean | string | bigint | number[]];

/**
 * The resource properties of a scope. v2 uses the unified names (MemoryMax, CPUWeight); v1 and
 * hybrid the legacy ones (MemoryLimit, CPUShares) that systemd maps to the v1 files. The quota is
 * always sent, as infinity when there is none, so that a resize can also lift it.
 */
export function systemdLimitProperties(plan: LimitPlan, mode: CgroupMode): SystemdProperty[] {
  const memory = plan.memoryBytes === 0 ? SYSTEMD_INFINITY : BigInt(plan.memoryBytes);
  const quota = quotaPerSecUSec(plan.quotaUs, plan.periodUs);
  if (mode === 'v2') {
    return [
      ['MemoryMax', 't', memory],
      ['CPUQuotaPerSecUSec', 't', quota],
      ['CPUWeight', 't', BigInt(plan.weight)],
    ];
  }
  return [
    ['MemoryLimit', 't', memory],
    ['CPUShares', 't', BigInt(plan.shares)],
    ['CPUQuotaPerSecUSec', 't', quota],
  ];
}
