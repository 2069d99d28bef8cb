import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import { alreadyExists, cancelled, errorMessage, invalid, isKataError, notFound, precondition } from '../../common/errors.js';
import { resolveIdPrefix } from '../../common/ids.js';
import type { Logger } from '../../common/logger.js';
import { resolveHandler } from '../../config/handlers.js';
import { ensureOverlayMounted, orphanRootfsDirs, removeContainerRootfs, removeContainerSnapshot } from '../../images/rootfs.js';
import type { RequestContext } from '../context.js';
import { boundedTimeoutMs } from '../deadline.js';
import { openLogNoFollow } from '../logs/open-nofollow.js';
import { planGrowth, type ResizePlan } from '../resize/index.js';
import { resumePod } from '../sandbox/pause.js';
import { nowNs, type SandboxRecord } from '../sandbox/record.js';
import type { SandboxListener } from '../sandbox/types.js';
import type { ContainerSpec } from '../spec/container.js';
import { createContainer, UNPLUG_TIMEOUT_MS } from './create.js';
import { detachDevices } from './devices.js';
import { ContainerEvents } from './events.js';
import { containerMatches } from './filter.js';
import {
  createAndStart,
  type ExecSyncResult,
  execSync,
  exitReason,
  START_CALL_MS,
  signalInGuest,
  stopInGuest,
  timestampNs,
} from './guest-ops.js';
import type { ContainerRecord } from './record.js';
import { containerRootfsRoot, unmountAndRemove } from './shared-dir.js';
import { ContainerTasks } from './tasks.js';
import type { ContainerCreateOptions, ContainerFilter, ContainerLookup, ContainerManagerDeps } from './types.js';

/** Remove a runtime-owned root filesystem (overlay: unmounted first); a caller's stays. */
async function removeRuntimeRootfs(record: ContainerRecord, logger: Logger): Promise<void> {
  if (record.rootfsOwner !== 'runtime') return;
  if (record.rootfsOverlay !== null) await removeContainerRootfs(record.rootfsOverlay, logger);
  else await removeContainerSnapshot(record.rootfs);
}

/** A container's exit as a face reports it (containerd's Wait). */
export interface ContainerExit {
  /** The exit code, 128 + the signal for a killed process, 255 when it was lost with its VM. */
  exitCode: number;
  /** Nanoseconds since the epoch. */
  finishedAtNs: string;
}

/**
 * Containers in pod VMs: CreateContainer admission against what RunPodSandbox announced, device
 * hot-plug onto the ports planned for them, growth within planned headroom for sandboxes sized
 * without pod_resources, and the records behind ContainerStatus and ListContainers. Every
 * operation runs under its sandbox's lock, so it is serialised with the sandbox's own rpcs.
 */
export class ContainerManager implements SandboxListener, ContainerLookup {
  private readonly containers = new Map<string, ContainerRecord>();
  /** Caller's ids of creates in progress (see CreateHost.claimId). */
  private readonly claimedIds = new Set<string>();
  /** Images and layer directories of creates between image lookup and registration (see CreateHost.holdImage). */
  private readonly held: Array<{ imageId: string; layers: string[] }> = [];
  readonly events = new ContainerEvents();
  /** Containers whose OOM kills the OOM watch told while they ran (the exit then tells none again). */
  private readonly oomTold = new Set<string>();
  readonly tasks: ContainerTasks;

  constructor(private readonly deps: ContainerManagerDeps) {
    this.tasks = new ContainerTasks({
      stateDir: deps.config.stateDir,
      logger: deps.logger,
      onExit: async (id, exit) => {
        const r = this.containers.get(id);
        if (r === undefined || r.state === 'CONTAINER_EXITED') return;
        const { reason, message } = exitReason(exit);
        const finishedAtNs = timestampNs(exit.finishedAt);
        // A kill the OOM watch did not tell (it came with the exit, or while no stream was open).
        if (exit.oomKilled && !this.oomTold.has(id)) this.events.emitOom(r, finishedAtNs);
        this.oomTold.delete(id);
        await this.markExited(r, reason, message, exit.exitCode, finishedAtNs);
      },
      onOom: async (id, atNs) => {
        const r = this.containers.get(id);
        if (r === undefined || r.state === 'CONTAINER_EXITED') return;
        this.oomTold.add(id);
        // As containerd's CRI does on TaskOOM: the reason is set while the container still runs,
        // and its exit keeps it (the exit's oomKilled says the same).
        if (r.reason !== 'OOMKilled') {
          r.reason = 'OOMKilled';
          r.message = 'a process of the container was killed by the out-of-memory killer';
          await this.deps.store.put(r);
        }
        this.deps.logger.info({ containerId: id }, 'OOM kill in the container');
        this.events.emitOom(r, atNs);
      },
      onLost: async (id) => {
        const r = this.containers.get(id);
        if (r === undefined || r.state === 'CONTAINER_EXITED') return;
        await this.markExited(r, 'Unknown', 'the guest agent no longer knows this container (the pod VM restarted or lost it)', 255);
      },
    });
  }

  /** Stop the background tasks (daemon shutdown); containers keep running in their VMs. */
  async close(): Promise<void> {
    await this.tasks.detachAll();
  }

  /** Load records; containers of sandboxes that no longer exist are removed, of stopped ones EXITED. */
  async recover(): Promise<void> {
    const { records } = await this.deps.store.load();
    for (const r of records) {
      const live = this.deps.sandboxes.find(r.sandboxId);
      if (live === undefined) {
        this.deps.logger.warn({ containerId: r.id, sandboxId: r.sandboxId }, 'container of a removed sandbox; removing it');
        await removeRuntimeRootfs(r, this.deps.logger);
        await this.deps.store.delete(r.id);
        continue;
      }
      this.containers.set(r.id, r);
      if (r.rootfsOverlay !== null) {
        // Still mounted when the runtime's namespace outlived the daemon; mounted again otherwise.
        try {
          const how = await ensureOverlayMounted(r.rootfsOverlay);
          if (how === 'remounted') this.deps.logger.info({ containerId: r.id }, 'container root filesystem mounted again');
        } catch (err) {
          this.deps.logger.error({ containerId: r.id, err: errorMessage(err) }, 'container root filesystem could not be mounted again');
        }
      }
      if (live.record.state !== 'SANDBOX_READY' && r.state !== 'CONTAINER_EXITED') {
        if (r.state === 'CONTAINER_CREATED') await this.markExited(r, ...NEVER_STARTED);
        else await this.markExited(r, ...VM_GONE);
        continue;
      }
      // A running container: its output resumes from the stored log state and its exit is
      // watched again (WaitContainer answers at once for one that exited while we were down).
      const agent = this.deps.guests.agentOf(r.sandboxId);
      if (r.state === 'CONTAINER_RUNNING' && agent !== undefined) {
        this.tasks.attach(r, agent);
        if (r.pid === 0) void this.learnPid(r, agent);
      }
    }
    await this.tearDownOrphanOverlays();
  }

  /**
   * An overlay root filesystem whose container has no record: a create that crashed between the
   * mount and the record (the record is written last). Unmounted and removed; copies without a
   * record are left for the orphan audit to report, as before.
   */
  private async tearDownOrphanOverlays(): Promise<void> {
    const rootfsDir = containerRootfsRoot(this.deps.config.stateDir);
    for (const dir of await orphanRootfsDirs(rootfsDir, new Set(this.containers.keys()))) {
      const upper = await fsp.stat(path.join(dir, 'upper')).catch(() => undefined);
      const merged = await fsp.stat(path.join(dir, 'merged')).catch(() => undefined);
      if (upper?.isDirectory() !== true || merged?.isDirectory() !== true) continue;
      try {
        await removeContainerRootfs({ dir, lowerDirs: [] }, this.deps.logger);
        this.deps.logger.warn({ dir }, 'overlay root filesystem of no container torn down');
      } catch (err) {
        this.deps.logger.error({ dir, err: errorMessage(err) }, 'overlay root filesystem of no container could not be torn down');
      }
    }
  }

  /** The layer directories (diff id hex) the containers' overlays stack: the image store keeps them. */
  layersInUse(): Set<string> {
    const out = new Set<string>();
    for (const c of this.containers.values()) for (const d of c.rootfsOverlay?.lowerDirs ?? []) out.add(path.basename(d));
    for (const h of this.held) for (const d of h.layers) out.add(path.basename(d));
    return out;
  }

  /** A running container recorded before pids were (format 4): the agent still knows it. */
  private async learnPid(record: ContainerRecord, agent: AgentClient): Promise<void> {
    try {
      const [state] = await agent.listContainers([record.id], { timeoutMs: 30_000 });
      if (state === undefined || state.pid === 0 || this.containers.get(record.id) !== record || record.pid !== 0) return;
      record.pid = state.pid;
      await this.deps.store.put(record);
    } catch (err) {
      this.deps.logger.debug({ containerId: record.id, err: errorMessage(err) }, 'the guest pid of a recovered container is not known');
    }
  }

  isImageInUse(imageId: string): boolean {
    for (const c of this.containers.values()) if (c.image.id === imageId) return true;
    return this.held.some((h) => h.imageId === imageId);
  }

  resolve(idOrPrefix: string): ContainerRecord {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) throw notFound('CONTAINER_NOT_FOUND', `container "${idOrPrefix}" does not exist`);
    return record;
  }

  list(filter: ContainerFilter | null): ContainerRecord[] {
    return [...this.containers.values()]
      .filter((c) => containerMatches(c, filter))
      .sort((a, b) => (a.createdAtNs < b.createdAtNs ? -1 : a.createdAtNs > b.createdAtNs ? 1 : 0));
  }

  inSandbox(sandboxId: string): ContainerRecord[] {
    return [...this.containers.values()].filter((c) => c.sandboxId === sandboxId);
  }

  /**
   * CreateContainer in sandbox `sandboxIdOrPrefix` for a validated spec (a face decodes its
   * request with decodeContainerSpec); returns the container's id. `options` (none from the CRI
   * face): the caller's id (INVALID_ARGUMENT CONTAINER_ID_INVALID unless it is containerd's kind of
   * identifier, ALREADY_EXISTS CONTAINER_EXISTS when a container has it), a root filesystem the
   * caller owns (used as it is: no image, no copy, never removed), and the stdio (the CRI log, or
   * the caller's FIFOs as raw bytes).
   */
  async create(sandboxIdOrPrefix: string, spec: ContainerSpec, ctx: RequestContext, options: ContainerCreateOptions = {}): Promise<string> {
    return createContainer(
      {
        deps: this.deps,
        inSandbox: (id) => this.inSandbox(id),
        growthFor: (record, incoming, admitted, name) => this.growthFor(record, incoming, admitted, name),
        claimId: (id) => {
          if (this.containers.has(id) || this.claimedIds.has(id)) throw alreadyExists('CONTAINER_EXISTS', `container ${id} already exists`);
          this.claimedIds.add(id);
          return () => this.claimedIds.delete(id);
        },
        holdImage: (imageId, layerDirs) => {
          const entry = { imageId, layers: [...layerDirs] };
          this.held.push(entry);
          return () => {
            const i = this.held.indexOf(entry);
            if (i >= 0) this.held.splice(i, 1);
          };
        },
        register: (record) => {
          this.containers.set(record.id, record);
          this.events.emit('CONTAINER_CREATED_EVENT', record);
        },
      },
      sandboxIdOrPrefix,
      spec,
      ctx,
      options,
    );
  }

  /** For sandboxes sized without pod_resources: does the container fit, or how must the VM grow? */
  growthFor(
    record: SandboxRecord,
    incoming: ContainerRecord['demand'],
    admitted: Array<ContainerRecord['demand']>,
    name: string,
  ): ResizePlan | undefined {
    const handler = resolveHandler(this.deps.config, record.handler);
    return planGrowth(record, handler.profile, incoming, admitted, name);
  }

  /** StartContainer: create and start it in the guest, then pump its output and watch its exit. */
  async start(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const record = this.resolve(idOrPrefix);
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.deps.sandboxes.withSandbox(record.sandboxId, async (sandbox) => {
      if (this.containers.get(record.id) !== record) throw notFound('CONTAINER_NOT_FOUND', `container "${idOrPrefix}" does not exist`);
      if (record.state !== 'CONTAINER_CREATED') {
        throw precondition('CONTAINER_NOT_CREATED', `container ${record.id} is ${record.state}; only a created container can be started`);
      }
      const agent = this.deps.guests.agentOf(record.sandboxId);
      if (sandbox.record.state !== 'SANDBOX_READY' || agent === undefined) {
        throw precondition('SANDBOX_NOT_READY', `pod sandbox ${record.sandboxId} is not running; its containers cannot start`);
      }
      if (record.guest === null) {
        throw precondition(
          'CONTAINER_NOT_STARTABLE',
          `container ${record.id} was created without a guest plan (before this version); remove and create it again`,
        );
      }
      if (record.logPath !== '') {
        // The kubelet (and critest) open the log file as soon as StartContainer returns, but the
        // output pump opens it asynchronously: create it (empty, appended to later) before then,
        // its directories too (as containerd does), with no symbolic link followed on the way.
        await (await openLogNoFollow(record.logPath, { createDirs: true })).close();
      }
      try {
        const started = await createAndStart(agent, record, boundedTimeoutMs(START_CALL_MS, ctx));
        record.startedAtNs = started.startedAtNs;
        record.pid = started.pid;
      } catch (err) {
        // A half-created container in the guest would hold its name: delete it (best effort).
        await agent.deleteContainer(record.id, true, { timeoutMs: 10_000 }).catch(() => undefined);
        // A secret the broker did not release: the container's status says which and why
        // (crictl inspect, the kubelet's events), not only the failed call.
        if (isKataError(err) && err.reason.startsWith('SECRET_')) {
          record.reason = 'SecretNotReleased';
          record.message = err.message;
          await this.deps.store.put(record).catch(() => undefined);
        }
        throw err;
      }
      record.state = 'CONTAINER_RUNNING';
      await this.deps.store.put(record);
      this.tasks.attach(record, agent);
      this.events.emit('CONTAINER_STARTED_EVENT', record);
      ctx.logger.info({ containerId: record.id }, 'container started');
    });
  }

  /**
   * StopContainer: the stop signal, SIGKILL after `timeoutSec`, resolved once the exit is
   * recorded. Idempotent; an unknown container id succeeds (as the CRI asks). Not under the
   * sandbox's lock: a long grace period must not hold up the pod's other rpcs.
   */
  async stop(idOrPrefix: string, timeoutSec: number, ctx: RequestContext): Promise<void> {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) {
      ctx.logger.info({ containerId: idOrPrefix }, 'StopContainer for an unknown container: nothing to stop');
      return;
    }
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.resumeIfPaused(record, ctx);
    await this.stopRecord(record, Math.max(0, timeoutSec) * 1000);
  }

  /**
   * A container of a paused pod (sandbox/pause.ts) is frozen in a VM that does not run: stopping,
   * killing or removing it resumes the pod first (containerd stops a pod by killing its containers
   * before its sandbox), so the signal reaches a guest that can act on it. Not under the sandbox's
   * lock (resumePod takes it).
   */
  private async resumeIfPaused(record: ContainerRecord, ctx: RequestContext): Promise<void> {
    if (this.deps.sandboxes.find(record.sandboxId)?.record.paused == null) return;
    ctx.logger.info({ containerId: record.id, sandboxId: record.sandboxId }, 'resuming the paused pod to end its container');
    await resumePod({ sandboxes: this.deps.sandboxes }, record.sandboxId, ctx);
  }

  private async stopRecord(record: ContainerRecord, timeoutMs: number): Promise<void> {
    if (record.state === 'CONTAINER_CREATED') {
      await this.markExited(record, 'NotStarted', 'the container was stopped before it started', 0);
      return;
    }
    if (record.state !== 'CONTAINER_RUNNING') return;
    const agent = this.deps.guests.agentOf(record.sandboxId);
    if (agent === undefined) {
      await this.markExited(record, ...VM_GONE);
      return;
    }
    await stopInGuest(agent, record, timeoutMs, this.tasks.exited(record.id));
  }

  /** RemoveContainer: stop (SIGKILL), store the last output, delete in the guest, undo the host side. Idempotent. */
  async remove(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) return;
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.resumeIfPaused(record, ctx);
    await this.stopRecord(record, 0);
    await this.deps.sandboxes.withSandboxIfPresent(record.sandboxId, async (sandbox) => {
      if (!this.containers.has(record.id)) return;
      const agent = this.deps.guests.agentOf(record.sandboxId);
      if (agent !== undefined && record.startedAtNs !== '0') {
        await this.tasks.drain(record.id);
        await agent.deleteContainer(record.id, true, { timeoutMs: 30_000 }).catch((err: unknown) => {
          if (!isKataError(err) || err.kind !== 'not_found') throw err;
        });
      }
      const vm = sandbox?.vm;
      if (sandbox !== undefined && record.devices.length > 0 && vm !== undefined && vm.exitInfo === undefined) {
        sandbox.record.topology = await detachDevices(vm, sandbox.record.topology, record.devices, UNPLUG_TIMEOUT_MS);
        record.devices = [];
        await sandbox.persist();
      }
      await this.forget(record, ctx.logger);
    });
  }

  private async forget(record: ContainerRecord, logger: Logger): Promise<void> {
    await this.tasks.detach(record.id);
    if (record.guest !== null && !(await unmountAndRemove(record.guest.hostDir, record.guest.bindMounts, logger))) {
      throw precondition(
        'CONTAINER_UNMOUNT_FAILED',
        `container ${record.id}: a bind mount under ${record.guest.hostDir} could not be unmounted`,
      );
    }
    // A caller's root filesystem is the caller's: never removed here (only unbound above).
    await removeRuntimeRootfs(record, logger);
    await fsp.rm(this.tasks.logStatePath(record.id), { force: true });
    await this.deps.store.delete(record.id);
    this.containers.delete(record.id);
    this.events.emit('CONTAINER_DELETED_EVENT', record);
  }

  private async markExited(
    record: ContainerRecord,
    reason: string,
    message: string,
    exitCode: number,
    finishedAtNs = nowNs(),
  ): Promise<void> {
    if (record.state === 'CONTAINER_EXITED') return;
    record.state = 'CONTAINER_EXITED';
    record.finishedAtNs = finishedAtNs;
    record.exitCode = exitCode;
    record.reason = reason;
    record.message = message;
    await this.deps.store.put(record);
    this.events.emit('CONTAINER_STOPPED_EVENT', record);
  }

  /**
   * Pause (`frozen`) or resume a running container: every process of it frozen or thawed by its
   * guest cgroup's freezer, as containerd's Pause does for a runc container. Idempotent. A
   * container not running is FAILED_PRECONDITION CONTAINER_NOT_RUNNING.
   */
  async freeze(idOrPrefix: string, frozen: boolean, ctx: RequestContext): Promise<void> {
    const record = this.resolve(idOrPrefix);
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    const agent = record.state === 'CONTAINER_RUNNING' ? this.deps.guests.agentOf(record.sandboxId) : undefined;
    if (agent === undefined) {
      throw precondition(
        'CONTAINER_NOT_RUNNING',
        `container ${record.id} is not running; only a running container can be ${frozen ? 'paused' : 'resumed'}`,
      );
    }
    if (frozen) await agent.pauseContainer(record.id, { timeoutMs: FREEZE_CALL_MS });
    else await agent.resumeContainer(record.id, { timeoutMs: FREEZE_CALL_MS });
    ctx.logger.info({ containerId: record.id }, frozen ? 'container paused' : 'container resumed');
  }

  /**
   * Signal the container's process (`all`: every process of the container) through the agent,
   * as containerd's Kill does. Only a running container has a process: one that has exited is
   * NOT_FOUND CONTAINER_PROCESS_FINISHED (containerd's "process already finished", which its CRI
   * plugin takes as done), also when it exits just as the signal goes; one created but never
   * started is FAILED_PRECONDITION CONTAINER_NOT_RUNNING (it has no process yet: `stop` ends it).
   * A signal outside 0..64 is INVALID_ARGUMENT. Not under the sandbox's lock (as stop).
   */
  async kill(idOrPrefix: string, signal: number, all: boolean, ctx: RequestContext): Promise<void> {
    const record = this.resolve(idOrPrefix);
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    if (!Number.isInteger(signal) || signal < 0 || signal > 64)
      throw invalid('CONTAINER_SIGNAL_INVALID', `signal ${signal} is not a Linux signal number`);
    const finished = () => notFound('CONTAINER_PROCESS_FINISHED', `container ${record.id}: its process has already finished`);
    if (record.state === 'CONTAINER_EXITED') throw finished();
    if (record.state === 'CONTAINER_CREATED') {
      throw precondition('CONTAINER_NOT_RUNNING', `container ${record.id} was created but not started: it has no process to signal`);
    }
    // Signal 0 only asks whether the process is there: a frozen one in a paused pod is.
    if (signal === 0 && this.deps.sandboxes.find(record.sandboxId)?.record.paused != null) return;
    await this.resumeIfPaused(record, ctx);
    const agent = this.deps.guests.agentOf(record.sandboxId);
    if (agent === undefined) {
      await this.markExited(record, ...VM_GONE);
      throw finished();
    }
    if (!(await signalInGuest(agent, record, signal, all, this.tasks.exited(record.id)))) throw finished();
    ctx.logger.info({ containerId: record.id, signal, all }, 'container signalled');
  }

  /**
   * Resolves once the container's output has reached its sink to the end (bounded: a sink nobody
   * reads does not hold the caller forever). A front door whose caller closes the output on the
   * exit (containerd 1.6 closes its FIFOs as it handles TaskExit) waits for this first.
   */
  async outputStored(idOrPrefix: string): Promise<void> {
    await this.tasks.drain(this.resolve(idOrPrefix).id);
  }

  /**
   * Resolves once the container has exited (at once when it has), also when its VM went away
   * (exit code 255): what containerd's Wait answers. Rejects with NOT_FOUND when the container
   * is removed before it exited, and with CANCELLED when `signal` aborts.
   */
  waitExit(idOrPrefix: string, signal: AbortSignal): Promise<ContainerExit> {
    const record = this.resolve(idOrPrefix);
    const exitOf = (r: ContainerRecord): ContainerExit => ({ exitCode: r.exitCode, finishedAtNs: r.finishedAtNs });
    if (record.state === 'CONTAINER_EXITED') return Promise.resolve(exitOf(record));
    return new Promise((resolve, reject) => {
      const finish = (settle: () => void) => {
        unsubscribe();
        signal.removeEventListener('abort', onAbort);
        settle();
      };
      const onAbort = () => finish(() => reject(cancelled('CALL_CANCELLED', `waiting for container ${record.id} to exit was cancelled`)));
      const unsubscribe = this.events.subscribe((e) => {
        if (e.record.id !== record.id) return;
        if (e.type === 'CONTAINER_STOPPED_EVENT') finish(() => resolve(exitOf(e.record)));
        else if (e.type === 'CONTAINER_DELETED_EVENT') {
          finish(() => reject(notFound('CONTAINER_NOT_FOUND', `container ${record.id} was removed before it exited`)));
        }
      });
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  /**
   * containerd's CloseIO: the container's stdin closes once what its stdin FIFO gave went in (it
   * closes by itself when the FIFO's writer closes it). Nothing to do for a container without a
   * stdin FIFO, or without a process.
   */
  async closeStdin(idOrPrefix: string): Promise<void> {
    const record = this.resolve(idOrPrefix);
    this.tasks.closeStdin(record.id);
  }

  /** ExecSync in a running container. */
  async execSync(idOrPrefix: string, cmd: readonly string[], timeoutSec: number, ctx: RequestContext): Promise<ExecSyncResult> {
    const record = this.resolve(idOrPrefix);
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    const agent = this.deps.guests.agentOf(record.sandboxId);
    if (record.state !== 'CONTAINER_RUNNING' || agent === undefined) {
      throw precondition('CONTAINER_NOT_RUNNING', `container ${record.id} is not running; ExecSync needs a running container`);
    }
    return execSync(agent, record, cmd, timeoutSec * 1000);
  }

  /** ReopenContainerLog: only for a running container (as containerd). */
  async reopenLog(idOrPrefix: string): Promise<void> {
    const record = this.resolve(idOrPrefix);
    if (record.state !== 'CONTAINER_RUNNING') {
      throw precondition('CONTAINER_NOT_RUNNING', `container ${record.id} is not running; its log cannot be reopened`);
    }
    await this.tasks.reopenLog(record.id);
  }

  /** SandboxListener: StopPodSandbox is starting (VM and agent up): stop every container within the deadline. */
  async sandboxStopping(sandboxId: string, deadlineMs: number): Promise<void> {
    const timeoutMs = Math.max(0, deadlineMs - Date.now() - 2000);
    await Promise.all(
      this.inSandbox(sandboxId).map((c) =>
        this.stopRecord(c, timeoutMs).catch((err: unknown) =>
          this.deps.logger.warn({ containerId: c.id, err: errorMessage(err) }, 'stopping a container of a stopping sandbox failed'),
        ),
      ),
    );
  }

  /** SandboxListener: the sandbox's VM is gone, so are its containers. */
  async sandboxStopped(sandboxId: string): Promise<void> {
    for (const c of this.inSandbox(sandboxId)) {
      await this.tasks.detach(c.id);
      if (c.state === 'CONTAINER_CREATED') await this.markExited(c, ...NEVER_STARTED);
      else if (c.state === 'CONTAINER_RUNNING') await this.markExited(c, ...VM_GONE);
    }
  }

  /** SandboxListener: RemovePodSandbox removes its containers (their devices left with the VM). */
  async sandboxRemoving(sandboxId: string): Promise<void> {
    for (const c of this.inSandbox(sandboxId)) await this.forget(c, this.deps.logger);
  }
}

/** Reason, message and exit code of a container whose sandbox stopped before it started. */
const NEVER_STARTED: [string, string, number] = ['SandboxStopped', 'the pod sandbox stopped before the container started', 0];
/** Reason, message and exit code of a container whose VM went away under it. */
/** One pause or resume in the guest (the freezer waits until every task is frozen). */
const FREEZE_CALL_MS = 30_000;

const VM_GONE: [string, string, number] = ['PodVMExited', 'the pod VM stopped while the container was running', 255];
