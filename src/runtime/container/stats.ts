/**
 * The agent's cgroup numbers -> CRI stats. CPU nano-cores need two samples: the previous sample
 * of each container (and of each pod) is kept, and the rate is the usage delta over the time
 * delta; the first sample of a container reports no rate (the kubelet does the same with cAdvisor).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { ContainerStatsEntry, GuestStatsResponse, Timestamp } from '../../generated/agent/agent.js';
import type { ContainerStats } from '../../generated/runtime/v1/ContainerStats.js';
import type { CpuUsage } from '../../generated/runtime/v1/CpuUsage.js';
import type { MemoryUsage } from '../../generated/runtime/v1/MemoryUsage.js';
import type { ContainerRecord } from './record.js';

export interface CpuSample {
  atNs: bigint;
  usageNs: bigint;
}

function ns(t: Timestamp | null): bigint {
  return t === null ? BigInt(Date.now()) * 1_000_000n : BigInt(t.seconds) * 1_000_000_000n + BigInt(t.nanos);
}

/** Nano-cores between two samples (pure); undefined without an earlier, older sample. */
export function nanoCores(previous: CpuSample | undefined, current: CpuSample): bigint | undefined {
  if (previous === undefined || current.atNs <= previous.atNs || current.usageNs < previous.usageNs) return undefined;
  return ((current.usageNs - previous.usageNs) * 1_000_000_000n) / (current.atNs - previous.atNs);
}

/** Keeps the previous CPU sample per key (container or pod id). */
export class CpuRates {
  private readonly samples = new Map<string, CpuSample>();

  /** CRI CpuUsage for a new sample, remembering it for the next call. */
  usage(key: string, takenAt: Timestamp | null, usageNs: number): CpuUsage {
    const current = { atNs: ns(takenAt), usageNs: BigInt(usageNs) };
    const rate = nanoCores(this.samples.get(key), current);
    this.samples.set(key, current);
    return {
      timestamp: current.atNs.toString(),
      usage_core_nano_seconds: { value: current.usageNs.toString() },
      ...(rate === undefined ? {} : { usage_nano_cores: { value: rate.toString() } }),
    };
  }

  forget(key: string): void {
    this.samples.delete(key);
  }
}

export function memoryUsage(takenAt: Timestamp | null, m: ContainerStatsEntry['memory']): MemoryUsage {
  const v = (n: number | undefined) => ({ value: String(n ?? 0) });
  return {
    timestamp: ns(takenAt).toString(),
    working_set_bytes: v(m?.workingSetBytes),
    available_bytes: v(m?.availableBytes),
    usage_bytes: v(m?.usageBytes),
    rss_bytes: v(m?.rssBytes),
    page_faults: v(m?.pageFaults),
    major_page_faults: v(m?.majorPageFaults),
  };
}

export interface LayerUsage {
  bytes: number;
  inodes: number;
}

/** Bytes and inodes under `dir` on the host, without following symlinks or crossing mounts. */
export async function diskUsage(dir: string): Promise<LayerUsage> {
  let bytes = 0;
  let inodes = 0;
  const root = await fsp.lstat(dir).catch(() => undefined);
  if (root === undefined) return { bytes, inodes };
  const walk = async (d: string): Promise<void> => {
    const entries = await fsp.readdir(d, { withFileTypes: true }).catch(() => []);
    for (const e of entries) {
      const p = path.join(d, e.name);
      const st = await fsp.lstat(p).catch(() => undefined);
      if (st === undefined || st.dev !== root.dev) continue;
      inodes += 1;
      bytes += st.blocks * 512;
      if (st.isDirectory()) await walk(p);
    }
  };
  await walk(dir);
  return { bytes, inodes: inodes + 1 };
}

/** One container's CRI stats from the agent's entry (undefined entry: a container not running). */
export function containerStats(
  r: ContainerRecord,
  entry: ContainerStatsEntry | undefined,
  layer: LayerUsage,
  rates: CpuRates,
): ContainerStats {
  const now = (BigInt(Date.now()) * 1_000_000n).toString();
  return {
    attributes: { id: r.id, metadata: r.metadata, labels: r.labels, annotations: r.annotations },
    cpu: entry === undefined ? { timestamp: now } : rates.usage(r.id, entry.takenAt, entry.cpu?.usageNs ?? 0),
    memory: entry === undefined ? { timestamp: now } : memoryUsage(entry.takenAt, entry.memory),
    writable_layer: {
      timestamp: now,
      fs_id: { mountpoint: r.rootfs },
      used_bytes: { value: String(layer.bytes) },
      inodes_used: { value: String(layer.inodes) },
    },
  };
}

/** The pod's own numbers (the whole guest: the VM is the pod). */
export function podUsage(sandboxId: string, guest: GuestStatsResponse, rates: CpuRates): { cpu: CpuUsage; memory: MemoryUsage } {
  return {
    cpu: rates.usage(`pod:${sandboxId}`, guest.takenAt, guest.cpu?.usageNs ?? 0),
    memory: memoryUsage(guest.takenAt, guest.memory),
  };
}
