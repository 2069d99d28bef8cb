/**
 * A container's (or the pod's) usage as the cgroup metrics containerd decodes from a shim's Stats
 * answer (pure). containerd's CRI reads a few numbers of them: the CPU time, the memory usage and,
 * for the working set, usage minus the inactive file pages; limit minus working set is what it
 * reports as available. The guest measured them inside the VM, so they are written in the shape
 * of the host's cgroup version (v1 on a v1 or hybrid host, as runc's shim answers there).
 */
import type { CpuReading, MemoryReading } from '../runtime/container/stats.js';
import { type AnyMessage, anyOf } from './proto.js';

export interface UsageReading {
  cpu: CpuReading | null;
  memory: MemoryReading | null;
  processCount: number | null;
}

export type MetricsVersion = 'v1' | 'v2';

/**
 * The Stats answer's Any for a reading. Every sub-message a reader dereferences is present, zero
 * when nothing was measured: CRI-O (internal/oci/runtime_vm.go) reads v1's `memory.usage`,
 * `.swap`, `.kernel`, `.kernel_tcp`, `cpu.usage`, `cpu.throttling` and `pids`, and v2's `memory`,
 * `cpu` and `pids`, through Go pointers without a nil check: a message left out crashes it.
 */
export function metricsAny(usage: UsageReading, version: MetricsVersion): AnyMessage {
  const m = usage.memory;
  // containerd takes the working set as usage - inactive file; the rest of usage is stated as such.
  const inactiveFile = m === null ? 0 : Math.max(0, m.usageBytes - m.workingSetBytes);
  const limit = m === null ? 0 : m.availableBytes + m.workingSetBytes;
  const pids = usage.processCount === null ? {} : { current: usage.processCount };
  if (version === 'v2') {
    return anyOf('io.containerd.cgroups.v2.Metrics', {
      pids,
      cpu: usage.cpu === null ? {} : { usage_usec: (usage.cpu.usageNs / 1000n).toString() },
      memory:
        m === null
          ? {}
          : {
              usage: m.usageBytes,
              usage_limit: limit,
              inactive_file: inactiveFile,
              anon: m.rssBytes,
              pgfault: m.pageFaults,
              pgmajfault: m.majorPageFaults,
            },
    });
  }
  return anyOf('io.containerd.cgroups.v1.Metrics', {
    pids,
    cpu: { usage: usage.cpu === null ? {} : { total: usage.cpu.usageNs.toString() }, throttling: {} },
    memory: {
      ...(m === null
        ? {}
        : {
            rss: m.rssBytes,
            total_rss: m.rssBytes,
            total_inactive_file: inactiveFile,
            pg_fault: m.pageFaults,
            total_pg_fault: m.pageFaults,
            pg_maj_fault: m.majorPageFaults,
            total_pg_maj_fault: m.majorPageFaults,
          }),
      usage: m === null ? {} : { usage: m.usageBytes, limit },
      swap: {},
      kernel: {},
      kernel_tcp: {},
    },
  });
}
