import { invalid, isKataError } from '../../../src/common/errors.js';
import type {
  ContainerStatsEntry,
  ContainerStatus,
  CreateContainerRequest,
  ExecProcessRequest,
  ExitStatus,
  GuestFacts,
  GuestStatsResponse,
  Timestamp,
} from '../../../src/generated/agent/agent.js';
import type { BackendContainerState, BackendEvent, ContainerBackend, CreatedContainer, StartedProcess } from '../backend.js';
import type { Containers, CoreEvent, ProcessHandle } from './containers.js';
import { type GuestRoots, readGuestFacts, readGuestUsage } from './guest-facts.js';
import type { ContainerState, ExitStatus as CoreExit, OciProcess, OciSpec } from './types.js';

/** Milliseconds since the epoch as the agent API's Timestamp. */
export function toTimestamp(ms: number): Timestamp {
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

export function toApiExit(exit: CoreExit): ExitStatus {
  return { exitCode: exit.exitCode, signal: exit.signal ?? 0, oomKilled: exit.oomKilled, finishedAt: toTimestamp(exit.finishedAtMs) };
}

const STATUS: Record<ContainerState['status'], ContainerStatus> = {
  created: 'CONTAINER_STATUS_CREATED',
  running: 'CONTAINER_STATUS_RUNNING',
  stopped: 'CONTAINER_STATUS_STOPPED',
};

function parseJson<T>(text: string, field: string): T {
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('not an object');
    return value as T;
  } catch (cause) {
    throw invalid('AGENT_JSON_INVALID', `${field} is not a JSON object.`, { cause });
  }
}

/** Settles with the promise, or rejects when `signal` aborts first. */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

export interface CrunBackendOptions {
  roots: GuestRoots;
  /** The writable layer of a container in the guest, if it has one there (for stats). */
  writableLayerPath?: (containerId: string, rootfsPath: string) => string | undefined;
}

/** The agent server's ContainerBackend (guest/agent/backend.ts) on top of the crun core. */
export class CrunBackend implements ContainerBackend {
  constructor(
    private readonly containers: Containers,
    private readonly options: CrunBackendOptions,
  ) {}

  async guestFacts(): Promise<GuestFacts> {
    return readGuestFacts(this.options.roots);
  }

  outputSpool(containerId: string): string | undefined {
    try {
      return this.containers.process(containerId).stdio.spool;
    } catch {
      return undefined;
    }
  }

  async createContainer(request: CreateContainerRequest): Promise<CreatedContainer> {
    const spec = parseJson<OciSpec>(request.ociConfigJson, 'oci_config_json');
    const created = await this.containers.create({
      id: request.containerId,
      spec,
      rootfsPath: request.rootfsPath,
      stdio: { tty: request.stdio === 'STDIO_MODE_TTY', stdin: request.stdin },
      writableLayerPath: this.options.writableLayerPath?.(request.containerId, request.rootfsPath),
      devices: request.devices,
    });
    return { pid: created.pid ?? 0, stdio: this.containers.process(request.containerId).stdio };
  }

  async startContainer(containerId: string): Promise<{ startedAt: Timestamp }> {
    const state = await this.containers.start(containerId);
    return { startedAt: toTimestamp(state.startedAtMs ?? Date.now()) };
  }

  signalContainer(containerId: string, signal: number, all: boolean): Promise<void> {
    return this.containers.signal(containerId, signal, all);
  }

  freezeContainer(containerId: string, frozen: boolean): Promise<void> {
    return this.containers.freeze(containerId, frozen);
  }

  updateContainer(containerId: string, ociResourcesJson: string): Promise<void> {
    let resources: unknown;
    try {
      resources = JSON.parse(ociResourcesJson);
    } catch {
      throw invalid('RESOURCES_INVALID', 'ociResourcesJson is not JSON.', { details: { containerId } });
    }
    if (resources === null || typeof resources !== 'object' || Array.isArray(resources)) {
      throw invalid('RESOURCES_INVALID', 'ociResourcesJson must be a JSON object (the OCI linux.resources).', { details: { containerId } });
    }
    return this.containers.update(containerId, resources as Record<string, unknown>);
  }

  async waitContainer(containerId: string, signal: AbortSignal): Promise<ExitStatus> {
    return toApiExit(await untilAborted(this.containers.wait(containerId), signal));
  }

  deleteContainer(containerId: string, force: boolean): Promise<void> {
    return this.containers.delete(containerId, force);
  }

  async listContainers(containerIds: string[]): Promise<BackendContainerState[]> {
    const wanted = new Set(containerIds);
    return this.containers
      .list()
      .filter((s) => wanted.size === 0 || wanted.has(s.id))
      .map((s) => ({
        containerId: s.id,
        status: STATUS[s.status],
        pid: s.pid ?? 0,
        createdAt: toTimestamp(s.createdAtMs),
        startedAt: s.startedAtMs === undefined ? null : toTimestamp(s.startedAtMs),
        exit: s.exit ? toApiExit(s.exit) : null,
      }));
  }

  async containerStats(containerIds: string[]): Promise<ContainerStatsEntry[]> {
    const ids = containerIds.length > 0 ? containerIds : this.containers.list().map((s) => s.id);
    const out: ContainerStatsEntry[] = [];
    for (const id of ids) {
      try {
        const s = await this.containers.stats(id);
        const working = Number(s.memoryWorkingSetBytes);
        out.push({
          containerId: id,
          takenAt: toTimestamp(s.timestampMs),
          cpu: { usageNs: Number(s.cpuUsageNs), userNs: Number(s.cpuUserNs), systemNs: Number(s.cpuSystemNs) },
          memory: {
            workingSetBytes: working,
            rssBytes: Number(s.memoryRssBytes),
            usageBytes: Number(s.memoryUsageBytes),
            availableBytes: s.memoryLimitBytes === undefined ? 0 : Math.max(0, Number(s.memoryLimitBytes) - working),
            pageFaults: Number(s.pageFaults),
            majorPageFaults: Number(s.majorPageFaults),
            oomKills: Number(s.oomKills),
          },
          pids: Number(s.pids),
          writableLayerBytes: Number(s.writableLayerBytes ?? 0n),
          writableLayerInodes: Number(s.writableLayerInodes ?? 0n),
        });
      } catch (err) {
        // Unknown ids are skipped, as the interface asks; a container gone meanwhile too.
        if (!(isKataError(err) && (err.kind === 'not_found' || err.kind === 'precondition'))) throw err;
      }
    }
    return out;
  }

  async guestStats(): Promise<GuestStatsResponse> {
    const u = await readGuestUsage(this.options.roots);
    return {
      takenAt: toTimestamp(Date.now()),
      cpu: { usageNs: u.cpuUsageNs, userNs: u.cpuUserNs, systemNs: u.cpuSystemNs },
      memory: {
        workingSetBytes: u.memoryWorkingSetBytes,
        rssBytes: u.memoryRssBytes,
        usageBytes: u.memoryUsageBytes,
        availableBytes: u.memoryAvailableBytes,
        pageFaults: u.pageFaults,
        majorPageFaults: u.majorPageFaults,
        oomKills: 0,
      },
      pids: u.pids,
    };
  }

  async execProcess(request: ExecProcessRequest): Promise<StartedProcess> {
    const process = parseJson<OciProcess>(request.ociProcessJson, 'oci_process_json');
    const handle = await this.containers.exec({
      containerId: request.containerId,
      execId: request.execId,
      process,
      stdio: { tty: request.tty, stdin: request.stdin },
    });
    return { pid: handle.pid, stdio: handle.stdio };
  }

  async signalProcess(containerId: string, execId: string, signal: number): Promise<void> {
    if (execId === '') await this.containers.signal(containerId, signal, false);
    else this.containers.signalExec(containerId, execId, signal);
  }

  async resizeTty(containerId: string, execId: string, rows: number, columns: number): Promise<void> {
    this.containers.process(containerId, execId).resize(rows, columns);
  }

  async waitProcess(containerId: string, execId: string, signal: AbortSignal): Promise<ExitStatus> {
    const handle: ProcessHandle = this.containers.process(containerId, execId);
    return toApiExit(await untilAborted(handle.exit, signal));
  }

  async deleteProcess(containerId: string, execId: string): Promise<void> {
    this.containers.deleteExec(containerId, execId);
  }

  onEvent(listener: (event: BackendEvent) => void): () => void {
    return this.containers.onEvent((event: CoreEvent) => {
      for (const e of toBackendEvents(event)) listener(e);
    });
  }
}

/** Core events as the server's events (each OOM kill is its own `oom` event, told before an exit it caused). */
export function toBackendEvents(event: CoreEvent): BackendEvent[] {
  switch (event.kind) {
    case 'started':
      return [{ kind: 'container-started', containerId: event.id, at: toTimestamp(event.atMs) }];
    case 'exited': {
      return [{ kind: 'container-exited', containerId: event.id, exit: toApiExit(event.exit) }];
    }
    case 'oom':
      return [{ kind: 'oom', containerId: event.id, at: toTimestamp(event.atMs) }];
    case 'exec-exited':
      return [{ kind: 'process-exited', containerId: event.id, execId: event.execId, exit: toApiExit(event.exit) }];
  }
}
