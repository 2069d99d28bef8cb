import { invalid } from '../../common/errors.js';
import { splitAmounts } from '../../sizing/demand.js';
import { cgroupNumbersOf, demandFromCgroupNumbers } from '../../sizing/linux-resources.js';
import { amountsOf, defaultRequestsToLimits, parseRequirements, protoPaths } from '../../sizing/resources.js';
import type { ContainerConfigInput } from './types.js';

/** What one container takes out of its VM's workload capacity. */
export interface AdmissionDemand {
  cpuMillicores: number;
  memoryBytes: number;
  /** Page size as in the resource name ("2Mi", "1Gi") -> bytes. */
  hugepages: Record<string, number>;
}

function hasEntries(map: Record<string, unknown> | null | undefined): boolean {
  return map !== null && map !== undefined && Object.keys(map).length > 0;
}

function toNumber(value: bigint, field: string): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw invalid('ADMISSION_VALUE_TOO_LARGE', `${field} comes to ${value}, beyond what kata-ts can budget with (2^53)`, {
      details: { field },
    });
  }
  return Number(value);
}

function hugepageRecord(map: ReadonlyMap<string, bigint>, at: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [size, bytes] of [...map].sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0))) {
    if (bytes > 0n) out[size] = toNumber(bytes, `${at} hugepages-${size}`);
  }
  return out;
}

/**
 * A container's demand for a sandbox sized WITHOUT pod_resources, counted the way the sizing
 * planner counts a container (limit, else request: a container without a limit counts with its
 * request; a zero amount counts as nothing):
 * - from `kubernetes_resources` when it names anything (quantities; a missing request defaults
 *   to the limit, as the API server does);
 * - else from `linux.resources` (what every kubelet sends): CPU from cpu_quota/cpu_period in
 *   millicores rounded up, else from cpu_shares; memory_limit_in_bytes; hugepage_limits;
 * - else 0 for everything.
 * `at` prefixes field paths in errors. Throws KataError invalid for malformed quantities or
 * integers (the sizing reasons: QUANTITY_*, SIZING_*) and ADMISSION_VALUE_TOO_LARGE beyond 2^53.
 */
export function containerDemand(received: ContainerConfigInput, at = 'config'): AdmissionDemand {
  const k8s = received.kubernetes_resources;
  if (k8s !== null && k8s !== undefined && (hasEntries(k8s.requests) || hasEntries(k8s.limits))) {
    const where = `${at}.kubernetes_resources`;
    const parsed = defaultRequestsToLimits(parseRequirements(k8s, protoPaths(where)));
    const effective = amountsOf(parsed.requests);
    for (const [key, nanos] of amountsOf(parsed.limits)) effective.set(key, nanos);
    const amounts = splitAmounts(effective);
    return {
      cpuMillicores: toNumber(amounts.cpuMillis ?? 0n, `${where} cpu`),
      memoryBytes: toNumber(amounts.memoryBytes ?? 0n, `${where} memory`),
      hugepages: hugepageRecord(amounts.hugepageBytes, where),
    };
  }
  const resources = received.linux?.resources;
  if (resources !== null && resources !== undefined) {
    const where = `${at}.linux.resources`;
    const demand = demandFromCgroupNumbers(cgroupNumbersOf(resources, where), 'linux_resources');
    return {
      cpuMillicores: toNumber(demand.cpuLimitMillis, `${where} cpu`),
      memoryBytes: toNumber(demand.memoryLimitBytes, `${where}.memory_limit_in_bytes`),
      hugepages: hugepageRecord(demand.hugepageBytes, where),
    };
  }
  return { cpuMillicores: 0, memoryBytes: 0, hugepages: {} };
}
