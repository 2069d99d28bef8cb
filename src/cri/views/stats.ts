/** Core usage readings -> the CRI's stats messages (ContainerStats, PodSandboxStats). */
import type { ContainerStats } from '../../generated/runtime/v1/ContainerStats.js';
import type { CpuUsage } from '../../generated/runtime/v1/CpuUsage.js';
import type { MemoryUsage } from '../../generated/runtime/v1/MemoryUsage.js';
import type { PodSandboxStats } from '../../generated/runtime/v1/PodSandboxStats.js';
import type { ContainerUsage, CpuReading, MemoryReading } from '../../runtime/container/stats.js';
import type { SandboxUsage } from '../../runtime/container/stats-service.js';

/** The CRI's UInt64Value: int64 travels as a decimal string. */
const u64 = (n: number | bigint) => ({ value: String(n) });

/** CpuUsage; nano-cores only from the second sample on. */
export function criCpuUsage(cpu: CpuReading): CpuUsage {
  return {
    timestamp: cpu.atNs.toString(),
    usage_core_nano_seconds: u64(cpu.usageNs),
    ...(cpu.nanoCores === undefined ? {} : { usage_nano_cores: u64(cpu.nanoCores) }),
  };
}

export function criMemoryUsage(m: MemoryReading): MemoryUsage {
  return {
    timestamp: m.atNs.toString(),
    working_set_bytes: u64(m.workingSetBytes),
    available_bytes: u64(m.availableBytes),
    usage_bytes: u64(m.usageBytes),
    rss_bytes: u64(m.rssBytes),
    page_faults: u64(m.pageFaults),
    major_page_faults: u64(m.majorPageFaults),
  };
}

/** ContainerStats: a container that is not running reports only timestamps for cpu and memory. */
export function criContainerStats(u: ContainerUsage): ContainerStats {
  const r = u.container;
  const now = u.atNs.toString();
  return {
    attributes: { id: r.id, metadata: r.metadata, labels: r.labels, annotations: r.annotations },
    cpu: u.cpu === null ? { timestamp: now } : criCpuUsage(u.cpu),
    memory: u.memory === null ? { timestamp: now } : criMemoryUsage(u.memory),
    ...(u.writableLayer === null
      ? {}
      : {
          writable_layer: {
            timestamp: now,
            fs_id: { mountpoint: r.rootfs },
            used_bytes: u64(u.writableLayer.bytes),
            inodes_used: u64(u.writableLayer.inodes),
          },
        }),
  };
}

/** PodSandboxStats: the whole guest as the pod (when its VM runs), plus its containers. */
export function criPodSandboxStats(u: SandboxUsage): PodSandboxStats {
  const { sandbox } = u;
  const linux: NonNullable<PodSandboxStats['linux']> = { containers: u.containers.map(criContainerStats) };
  if (u.cpu !== null) linux.cpu = criCpuUsage(u.cpu);
  if (u.memory !== null) linux.memory = criMemoryUsage(u.memory);
  if (u.processCount !== null) linux.process = { timestamp: u.atNs.toString(), process_count: u64(u.processCount) };
  return {
    attributes: { id: sandbox.id, metadata: sandbox.spec.metadata, labels: sandbox.spec.labels, annotations: sandbox.spec.annotations },
    linux,
  };
}
