import { nanosToMillis, nanosToUnits } from './quantity.js';
import { HUGEPAGES_PREFIX } from './resources.js';
import type { SizingContainerType, SizingSource } from './types.js';

/**
 * What a pod asks for, whichever source it came from, in exact integers (BigInt) so that sums of
 * absurd values cannot overflow before the planner compares them with the host and the handler.
 */
export interface PodDemand {
  source: SizingSource;
  cpuRequestMillis: bigint;
  /** Limits, where a container without a limit counts with its request. */
  cpuLimitMillis: bigint;
  memoryRequestBytes: bigint;
  memoryLimitBytes: bigint;
  /** Kubernetes page size name ("2Mi", "1Gi") -> bytes. */
  hugepageBytes: Map<string, bigint>;
  /** Extended resource name -> whole count. */
  extended: Map<string, bigint>;
  /**
   * Some container states neither a limit nor a request for CPU (or memory), so it may use any
   * amount: the VM then gets at least the handler's default size for that resource.
   */
  cpuUnbounded: boolean;
  memoryUnbounded: boolean;
  containers: ContainerDemand[];
}

export interface ContainerDemand {
  name: string;
  type: SizingContainerType;
  cpuRequestMillis: bigint;
  cpuLimitMillis: bigint | null;
  memoryRequestBytes: bigint;
  memoryLimitBytes: bigint | null;
  hugepageBytes: Map<string, bigint>;
  extended: Map<string, bigint>;
}

/** Split a nanos-per-key map into the demand's fields (CPU to millicores, the rest to whole units, all rounded up). */
export function splitAmounts(amounts: ReadonlyMap<string, bigint>): {
  cpuMillis: bigint | undefined;
  memoryBytes: bigint | undefined;
  hugepageBytes: Map<string, bigint>;
  extended: Map<string, bigint>;
} {
  let cpuMillis: bigint | undefined;
  let memoryBytes: bigint | undefined;
  const hugepageBytes = new Map<string, bigint>();
  const extended = new Map<string, bigint>();
  for (const [key, nanos] of amounts) {
    if (key === 'cpu') cpuMillis = nanosToMillis(nanos);
    else if (key === 'memory') memoryBytes = nanosToUnits(nanos);
    else if (key.startsWith(HUGEPAGES_PREFIX)) hugepageBytes.set(key.slice(HUGEPAGES_PREFIX.length), nanosToUnits(nanos));
    else if (key.includes('/')) extended.set(key, nanosToUnits(nanos));
    // ephemeral-storage and other ignored keys do not size a VM.
  }
  return { cpuMillis, memoryBytes, hugepageBytes, extended };
}

/** A demand that states nothing: the handler's defaults decide everything. */
export function emptyDemand(source: SizingSource): PodDemand {
  return {
    source,
    cpuRequestMillis: 0n,
    cpuLimitMillis: 0n,
    memoryRequestBytes: 0n,
    memoryLimitBytes: 0n,
    hugepageBytes: new Map(),
    extended: new Map(),
    cpuUnbounded: true,
    memoryUnbounded: true,
    containers: [],
  };
}
