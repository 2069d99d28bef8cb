import { invalid } from '../common/errors.js';
import { emptyDemand, type PodDemand } from './demand.js';
import type { LinuxContainerResourcesInput } from './input.js';
import { ceilDiv } from './quantity.js';
import { HUGEPAGE_SIZES } from './resources.js';
import type { SizingSource } from './types.js';

/**
 * The cgroup-shaped sizing inputs every kubelet since 1.23 sends (LinuxPodSandboxConfig.resources
 * and .overhead) and the annotations containerd and CRI-O derive from them. They carry a CFS
 * quota/period, CPU shares, a memory limit and hugetlb limits, not Kubernetes quantities.
 *
 * Conversions (the inverse of the kubelet's, pkg/kubelet/cm helpers):
 * - CPU limit: quota * 1000 / period millicores, rounded up (period defaults to the kernel's
 *   100000 us when 0); quota <= 0 (0 or -1) is no limit.
 * - CPU request: shares * 1000 / 1024 millicores, rounded up; 2 shares is what the kubelet sends
 *   for "no request" (MinShares), so <= 2 counts as none.
 * - A pod's summed limit can be below its summed requests when only some containers have a limit
 *   (PodLimits skips the others), so the limit used for sizing is max(quota, shares).
 * - Memory: only a limit exists; it is reported as the request too (the VM reserves all of it).
 */
export interface CgroupNumbers {
  period: bigint;
  quota: bigint;
  shares: bigint;
  memoryBytes: bigint;
  /** Page size name ("2Mi", "1Gi") -> bytes. */
  hugepageBytes: Map<string, bigint>;
}

const DEFAULT_CFS_PERIOD_US = 100_000n;
const MIN_SHARES = 2n;

const INT64_MIN = -(1n << 63n);
const INT64_MAX = (1n << 63n) - 1n;

/** An int64 carried as a decimal string (proto-loader), a JSON number (CRI-O) or absent. */
export function parseInt64(value: unknown, field: string): bigint {
  if (value === undefined || value === null || value === '') return 0n;
  let n: bigint | undefined;
  if (typeof value === 'bigint') n = value;
  else if (typeof value === 'number' && Number.isSafeInteger(value)) n = BigInt(value);
  else if (typeof value === 'string' && /^[+-]?\d{1,30}$/.test(value)) n = BigInt(value);
  if (n === undefined) {
    throw invalid('SIZING_INTEGER_INVALID', `${field} must be an integer, got ${JSON.stringify(value)}`, { details: { field } });
  }
  if (n < INT64_MIN || n > INT64_MAX) {
    throw invalid('SIZING_INTEGER_INVALID', `${field} is out of the int64 range, got ${JSON.stringify(String(value))}`, {
      details: { field },
    });
  }
  return n;
}

/**
 * The smallest value each cgroup number may take: a CFS quota of -1 is the kernel's "no limit"
 * (what cgroup tools and some runtimes write), every other negative number is nonsense that would
 * otherwise read as "nothing given" and size the VM from the handler's defaults behind the pod's back.
 */
export const CGROUP_NUMBER_MIN = { cpu_period: 0n, cpu_quota: -1n, cpu_shares: 0n, memory_limit_in_bytes: 0n, hugepage_limit: 0n } as const;

/** parseInt64, refusing values below `min` with the field's name. */
export function parseCgroupNumber(value: unknown, field: string, min: bigint): bigint {
  const n = parseInt64(value, field);
  if (n < min) {
    throw invalid('SIZING_INTEGER_INVALID', `${field} must be at least ${min}, got ${JSON.stringify(String(value))}`, {
      details: { field },
    });
  }
  return n;
}

const CGROUP_PAGE_SIZE = /^(\d+)(KB|MB|GB|Ki|Mi|Gi)$/;
const PAGE_UNITS: Record<string, bigint> = { KB: 1n << 10n, MB: 1n << 20n, GB: 1n << 30n, Ki: 1n << 10n, Mi: 1n << 20n, Gi: 1n << 30n };

/** "2MB" (hugetlb cgroup spelling, binary units) or "2Mi" -> the Kubernetes page size name. */
function pageSizeName(text: unknown, field: string): string {
  const match = typeof text === 'string' ? CGROUP_PAGE_SIZE.exec(text) : null;
  const bytes = match === null ? undefined : BigInt(match[1]!) * PAGE_UNITS[match[2]!]!;
  const size = bytes === undefined ? undefined : HUGEPAGE_SIZES.get(bytes);
  if (size === undefined) {
    throw invalid(
      'SIZING_HUGEPAGE_SIZE_UNSUPPORTED',
      `${field} ${JSON.stringify(text)} is not a hugepage size the guest offers (2MB or 1GB)`,
      {
        details: { field },
      },
    );
  }
  return size.name;
}

/**
 * Read a LinuxContainerResources-like object. `pick` maps a snake_case field name to its value,
 * so the same code reads decoded CRI messages and CRI-O's JSON (snake_case or camelCase).
 */
export function readCgroupNumbers(pick: (snakeName: string) => unknown, at: string): CgroupNumbers {
  const hugepageBytes = new Map<string, bigint>();
  const limits = pick('hugepage_limits');
  if (limits !== undefined && limits !== null) {
    if (!Array.isArray(limits)) throw invalid('SIZING_INTEGER_INVALID', `${at}.hugepage_limits must be a list`);
    limits.forEach((entry: unknown, i: number) => {
      const e = (typeof entry === 'object' && entry !== null ? entry : {}) as Record<string, unknown>;
      const limit = parseCgroupNumber(e.limit, `${at}.hugepage_limits[${i}].limit`, CGROUP_NUMBER_MIN.hugepage_limit);
      // The kubelet sends a zero limit for every host page size a container did not ask for.
      if (limit === 0n) return;
      const name = pageSizeName(e.page_size ?? e.pageSize, `${at}.hugepage_limits[${i}].page_size`);
      hugepageBytes.set(name, (hugepageBytes.get(name) ?? 0n) + limit);
    });
  }
  return {
    period: parseCgroupNumber(pick('cpu_period'), `${at}.cpu_period`, CGROUP_NUMBER_MIN.cpu_period),
    quota: parseCgroupNumber(pick('cpu_quota'), `${at}.cpu_quota`, CGROUP_NUMBER_MIN.cpu_quota),
    shares: parseCgroupNumber(pick('cpu_shares'), `${at}.cpu_shares`, CGROUP_NUMBER_MIN.cpu_shares),
    memoryBytes: parseCgroupNumber(pick('memory_limit_in_bytes'), `${at}.memory_limit_in_bytes`, CGROUP_NUMBER_MIN.memory_limit_in_bytes),
    hugepageBytes,
  };
}

/** Read a decoded CRI LinuxContainerResources. */
export function cgroupNumbersOf(resources: LinuxContainerResourcesInput, at: string): CgroupNumbers {
  return readCgroupNumbers((name) => (resources as Record<string, unknown>)[name], at);
}

/** True when the numbers state anything at all (an all-zero message says nothing). */
export function saysSomething(n: CgroupNumbers): boolean {
  return n.period > 0n || n.quota > 0n || n.shares > 0n || n.memoryBytes > 0n || n.hugepageBytes.size > 0;
}

/** CPU limit from CFS quota/period, in millicores; undefined when there is no quota. */
export function quotaMillis(n: CgroupNumbers): bigint | undefined {
  if (n.quota <= 0n) return undefined;
  const period = n.period > 0n ? n.period : DEFAULT_CFS_PERIOD_US;
  return ceilDiv(n.quota * 1000n, period);
}

/** CPU request from shares, in millicores; undefined for "no request" (<= MinShares). */
export function sharesMillis(n: CgroupNumbers): bigint | undefined {
  if (n.shares <= MIN_SHARES) return undefined;
  return ceilDiv(n.shares * 1000n, 1024n);
}

/** The demand such numbers express. */
export function demandFromCgroupNumbers(n: CgroupNumbers, source: SizingSource): PodDemand {
  const demand = emptyDemand(source);
  const limit = quotaMillis(n);
  const request = sharesMillis(n);
  demand.cpuRequestMillis = request ?? 0n;
  demand.cpuLimitMillis = limit === undefined ? (request ?? 0n) : request !== undefined && request > limit ? request : limit;
  demand.cpuUnbounded = limit === undefined && request === undefined;
  if (n.memoryBytes > 0n) {
    demand.memoryLimitBytes = n.memoryBytes;
    demand.memoryRequestBytes = n.memoryBytes;
    demand.memoryUnbounded = false;
  }
  demand.hugepageBytes = new Map(n.hugepageBytes);
  return demand;
}
