/**
 * Container and pod usage: one agent call per sandbox (ContainerStats for its running containers,
 * GuestStats for the pod), the writable layer measured on the host where the container's root
 * filesystem lives, nano-cores from the previous sample of each container and pod. Faces shape
 * the readings into their own messages.
 */
import { isReason } from '../../common/errors.js';
import { epochNs } from '../../common/time.js';
import type { ContainerStatsEntry } from '../../generated/agent/agent.js';
import { containerRootfsDirs } from '../../images/overlay-plan.js';
import type { SandboxRecord } from '../sandbox/record.js';
import type { LiveSandbox } from '../sandbox/types.js';
import type { ContainerRecord } from './record.js';
import { type ContainerUsage, CpuRates, type CpuReading, containerUsage, diskUsage, type MemoryReading, podUsage } from './stats.js';
import type { ContainerFilter, ContainerLookup, SandboxGuestAccess } from './types.js';

const STATS_CALL_MS = 10_000;

/** A pod's usage: the whole guest (cpu, memory, processes: null unless its VM runs), and its containers'. */
export interface SandboxUsage {
  sandbox: SandboxRecord;
  atNs: bigint;
  cpu: CpuReading | null;
  memory: MemoryReading | null;
  processCount: number | null;
  containers: ContainerUsage[];
}

export class StatsCollector {
  private readonly rates = new CpuRates();

  /**
   * `layerUsage` false: no container's writable layer is measured (its usage is null). Behind
   * containerd the layer is containerd's snapshot, which it measures itself, and the shim's Stats
   * has no field for it: walking the whole merged root on every call would be work thrown away.
   */
  constructor(
    private readonly containers: Pick<ContainerLookup, 'list' | 'inSandbox'>,
    private readonly guests: SandboxGuestAccess,
    private readonly options: { layerUsage: boolean } = { layerUsage: true },
  ) {}

  /** Usage of the given containers (any state; a container not running has no cpu/memory numbers). */
  async forContainers(records: ContainerRecord[]): Promise<ContainerUsage[]> {
    const bySandbox = new Map<string, ContainerRecord[]>();
    for (const r of records) bySandbox.set(r.sandboxId, [...(bySandbox.get(r.sandboxId) ?? []), r]);
    const out: ContainerUsage[] = [];
    for (const [sandboxId, list] of bySandbox) {
      const running = list.filter((r) => r.state === 'CONTAINER_RUNNING').map((r) => r.id);
      const agent = this.guests.agentOf(sandboxId);
      const entries = new Map<string, ContainerStatsEntry>();
      if (agent !== undefined && running.length > 0) {
        const stats = await unlessPaused(agent.containerStats(running, { timeoutMs: STATS_CALL_MS }));
        for (const e of stats ?? []) entries.set(e.containerId, e);
      }
      for (const r of list) {
        const layer = this.options.layerUsage ? await diskUsage(writableLayerOf(r)) : null;
        out.push(containerUsage(r, entries.get(r.id), layer, this.rates));
      }
    }
    return out;
  }

  /** Usage of every container a listing's filter lets through. */
  async list(filter: ContainerFilter | null): Promise<ContainerUsage[]> {
    return this.forContainers(this.containers.list(filter));
  }

  /** A pod's usage: the whole guest as the pod, plus its containers. */
  async forSandbox(live: LiveSandbox): Promise<SandboxUsage> {
    const { record } = live;
    const containers = await this.forContainers(this.containers.inSandbox(record.id));
    const agent = this.guests.agentOf(record.id);
    const usage: SandboxUsage = { sandbox: record, atNs: epochNs(), cpu: null, memory: null, processCount: null, containers };
    if (agent !== undefined && record.state === 'SANDBOX_READY') {
      const guest = await unlessPaused(agent.guestStats({ timeoutMs: STATS_CALL_MS }));
      if (guest !== undefined) {
        const pod = podUsage(record.id, guest, this.rates);
        usage.cpu = pod.cpu;
        usage.memory = pod.memory;
        usage.processCount = guest.pids;
      }
    }
    return usage;
  }

  forget(id: string): void {
    this.rates.forget(id);
  }
}

/**
 * A guest call's answer, or undefined when the pod is paused (its agent connection refuses every
 * call at once): a paused pod reports no usage, and a node-wide listing goes on with the others
 * instead of failing because of one paused pod.
 */
async function unlessPaused<T>(call: Promise<T>): Promise<T | undefined> {
  try {
    return await call;
  } catch (err) {
    if (isReason(err, 'SANDBOX_PAUSED')) return undefined;
    throw err;
  }
}

/** What the container wrote: an overlay's upper directory (the layers are the image's), or the whole copy. */
function writableLayerOf(r: ContainerRecord): string {
  return r.rootfsOverlay === null ? r.rootfs : containerRootfsDirs(r.rootfsOverlay.dir).upper;
}
