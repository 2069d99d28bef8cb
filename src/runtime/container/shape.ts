import type { HostBudget, VmShape } from '../../sizing/types.js';
import type { AnnouncedPodResources } from '../admission/index.js';
import type { SandboxRecord } from '../sandbox/record.js';

const MiB = 1024 * 1024;

/** The pod_resources RunPodSandbox (or a later resize) announced, when it named any container. */
export function announcedOf(record: SandboxRecord): AnnouncedPodResources | undefined {
  const podResources = record.podConfig.pod_resources as AnnouncedPodResources | null | undefined;
  if (podResources === null || podResources === undefined) return undefined;
  return (podResources.containers ?? []).length > 0 ? podResources : undefined;
}

/**
 * The VMM cgroup budget for a VM of `shape`, the same way the sizing planner builds it: VM memory
 * plus the VMM overhead, vCPUs plus the VMM overhead; `cpuRequestMillicores` is the workload's.
 */
export function budgetForShape(
  record: SandboxRecord,
  shape: Pick<VmShape, 'vcpus' | 'memoryMiB'>,
  cpuRequestMillicores: number,
): HostBudget {
  const overhead = record.plan.sizing.vmmOverhead;
  return {
    memoryLimitBytes: shape.memoryMiB * MiB + overhead.memoryBytes,
    cpuQuotaMillicores: shape.vcpus * 1000 + overhead.cpuMillicores,
    cpuRequestMillicores: cpuRequestMillicores + overhead.cpuMillicores,
  };
}
