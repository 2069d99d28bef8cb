/**
 * ContainerStats / ListContainerStats / PodSandboxStats / ListPodSandboxStats: one agent call per
 * sandbox (ContainerStats for its running containers, GuestStats for the pod), the writable layer
 * measured on the host where the container's root filesystem lives, nano-cores from the previous
 * sample of each container and pod.
 */

import { matchesLabels } from '../../cri/views/sandbox.js';
import type { ContainerStatsEntry } from '../../generated/agent/agent.js';
import type { ContainerStats } from '../../generated/runtime/v1/ContainerStats.js';
import type { ContainerStatsFilter__Output } from '../../generated/runtime/v1/ContainerStatsFilter.js';
import type { PodSandboxStats } from '../../generated/runtime/v1/PodSandboxStats.js';
import type { LiveSandbox } from '../sandbox/manager.js';
import type { ContainerManager, SandboxGuestAccess } from './manager.js';
import type { ContainerRecord } from './record.js';
import { CpuRates, containerStats, diskUsage, podUsage } from './stats.js';

const STATS_CALL_MS = 10_000;

export class StatsCollector {
  private readonly rates = new CpuRates();

  constructor(
    private readonly containers: ContainerManager,
    private readonly guests: SandboxGuestAccess,
  ) {}

  /** Stats of the given containers (any state; a container not running has no cpu/memory numbers). */
  async forContainers(records: ContainerRecord[]): Promise<ContainerStats[]> {
    const bySandbox = new Map<string, ContainerRecord[]>();
    for (const r of records) bySandbox.set(r.sandboxId, [...(bySandbox.get(r.sandboxId) ?? []), r]);
    const out: ContainerStats[] = [];
    for (const [sandboxId, list] of bySandbox) {
      const running = list.filter((r) => r.state === 'CONTAINER_RUNNING').map((r) => r.id);
      const agent = this.guests.agentOf(sandboxId);
      const entries = new Map<string, ContainerStatsEntry>();
      if (agent !== undefined && running.length > 0) {
        for (const e of await agent.containerStats(running, { timeoutMs: STATS_CALL_MS })) entries.set(e.containerId, e);
      }
      for (const r of list) out.push(containerStats(r, entries.get(r.id), await diskUsage(r.rootfs), this.rates));
    }
    return out;
  }

  async list(filter: ContainerStatsFilter__Output | null): Promise<ContainerStats[]> {
    const records = this.containers.list(null).filter((r) => {
      if (filter === null) return true;
      if (filter.id !== '' && !r.id.startsWith(filter.id)) return false;
      if (filter.pod_sandbox_id !== '' && !r.sandboxId.startsWith(filter.pod_sandbox_id)) return false;
      return matchesLabels(r.labels, filter.label_selector ?? {});
    });
    return this.forContainers(records);
  }

  /** A pod's stats: the whole guest as the pod, plus its containers. */
  async forSandbox(live: LiveSandbox): Promise<PodSandboxStats> {
    const { record } = live;
    const containers = await this.forContainers(this.containers.inSandbox(record.id));
    const agent = this.guests.agentOf(record.id);
    const now = (BigInt(Date.now()) * 1_000_000n).toString();
    const linux: NonNullable<PodSandboxStats['linux']> = { containers };
    if (agent !== undefined && record.state === 'SANDBOX_READY') {
      const guest = await agent.guestStats({ timeoutMs: STATS_CALL_MS });
      const usage = podUsage(record.id, guest, this.rates);
      linux.cpu = usage.cpu;
      linux.memory = usage.memory;
      linux.process = { timestamp: now, process_count: { value: String(guest.pids) } };
    }
    return {
      attributes: { id: record.id, metadata: record.spec.metadata, labels: record.spec.labels, annotations: record.spec.annotations },
      linux,
    };
  }

  forget(id: string): void {
    this.rates.forget(id);
  }
}
