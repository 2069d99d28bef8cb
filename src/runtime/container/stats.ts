/**
 * The agent's cgroup numbers -> readings any face can shape into its own messages (the CRI's in
 * src/cri/views/stats.ts). CPU nano-cores need two samples: the previous sample of each container
 * (and of each pod) is kept, and the rate is the usage delta over the time delta; the first
 * sample of a container reports no rate (the kubelet does the same with cAdvisor).
 */

import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { epochNs } from '../../common/time.js';
import type { ContainerStatsEntry, GuestStatsResponse, Timestamp } from '../../generated/agent/agent.js';
import type { ContainerRecord } from './record.js';

export interface CpuSample {
  atNs: bigint;
  usageNs: bigint;
}

/** A CPU sample and, from the sample before it, the rate (undefined for a first sample). */
export interface CpuReading extends CpuSample {
  nanoCores: bigint | undefined;
}

/** Memory numbers of a cgroup (or of the whole guest) when they were taken. */
export interface MemoryReading {
  atNs: bigint;
  workingSetBytes: number;
  availableBytes: number;
  usageBytes: number;
  rssBytes: number;
  pageFaults: number;
  majorPageFaults: number;
}

/** One container's usage: cpu and memory only while it runs (null otherwise), and its writable layer. */
export interface ContainerUsage {
  container: ContainerRecord;
  /** When the host-side numbers (the writable layer) were read. */
  atNs: bigint;
  cpu: CpuReading | null;
  memory: MemoryReading | null;
  /** Null where the layer is not measured here (behind containerd, which measures its snapshots). */
  writableLayer: LayerUsage | null;
}

function ns(t: Timestamp | null): bigint {
  return t === null ? epochNs() : BigInt(t.seconds) * 1_000_000_000n + BigInt(t.nanos);
}

/** Nano-cores between two samples (pure); undefined without an earlier, older sample. */
export function nanoCores(previous: CpuSample | undefined, current: CpuSample): bigint | undefined {
  if (previous === undefined || current.atNs <= previous.atNs || current.usageNs < previous.usageNs) return undefined;
  return ((current.usageNs - previous.usageNs) * 1_000_000_000n) / (current.atNs - previous.atNs);
}

/** Keeps the previous CPU sample per key (container or pod id). */
export class CpuRates {
  private readonly samples = new Map<string, CpuSample>();

  /** A reading for a new sample, remembering the sample for the next call. */
  usage(key: string, takenAt: Timestamp | null, usageNs: number): CpuReading {
    const current = { atNs: ns(takenAt), usageNs: BigInt(usageNs) };
    const rate = nanoCores(this.samples.get(key), current);
    this.samples.set(key, current);
    return { ...current, nanoCores: rate };
  }

  forget(key: string): void {
    this.samples.delete(key);
  }
}

/** The agent's memory numbers as a reading (a number the agent left out counts as 0). */
export function memoryReading(takenAt: Timestamp | null, m: ContainerStatsEntry['memory']): MemoryReading {
  return {
    atNs: ns(takenAt),
    workingSetBytes: m?.workingSetBytes ?? 0,
    availableBytes: m?.availableBytes ?? 0,
    usageBytes: m?.usageBytes ?? 0,
    rssBytes: m?.rssBytes ?? 0,
    pageFaults: m?.pageFaults ?? 0,
    majorPageFaults: m?.majorPageFaults ?? 0,
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

/** One container's usage from the agent's entry (undefined entry: a container not running). */
export function containerUsage(
  r: ContainerRecord,
  entry: ContainerStatsEntry | undefined,
  layer: LayerUsage | null,
  rates: CpuRates,
): ContainerUsage {
  return {
    container: r,
    atNs: epochNs(),
    cpu: entry === undefined ? null : rates.usage(r.id, entry.takenAt, entry.cpu?.usageNs ?? 0),
    memory: entry === undefined ? null : memoryReading(entry.takenAt, entry.memory),
    writableLayer: layer,
  };
}

/** The pod's own numbers (the whole guest: the VM is the pod). */
export function podUsage(sandboxId: string, guest: GuestStatsResponse, rates: CpuRates): { cpu: CpuReading; memory: MemoryReading } {
  return {
    cpu: rates.usage(`pod:${sandboxId}`, guest.takenAt, guest.cpu?.usageNs ?? 0),
    memory: memoryReading(guest.takenAt, guest.memory),
  };
}
