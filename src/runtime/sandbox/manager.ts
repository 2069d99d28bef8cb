import { promises as fsp } from 'node:fs';
import type { CgroupDriver, PlacementRecord } from '../../cgroups/index.js';
import { alreadyExists, errorMessage, invalid, notFound } from '../../common/errors.js';
import { CALLER_ID_MAX_LENGTH, isCallerId, newObjectId, resolveIdPrefix } from '../../common/ids.js';
import { resolveHandler } from '../../config/handlers.js';
import { type ExitInfo, isSameLiveProcess, type VmProcess } from '../../hypervisor/index.js';
import type { RequestContext } from '../context.js';
import { boundedTimeoutMs } from '../deadline.js';
import { KeyedMutex } from '../locks.js';
import type { SandboxSpec } from '../spec/sandbox.js';
import { createSandbox } from './create.js';
import { sandboxMatches } from './filter.js';
import { releaseIdentity } from './identities.js';
import { releaseJail } from './jail.js';
import { networksFor } from './network.js';
import { killAndWait } from './orphans.js';
import { sandboxSharedDir, sandboxVmRoot, sandboxWorkDir } from './paths.js';
import { resumeBeforeStop } from './pause.js';
import { identityKey, type SandboxExitRecord, type SandboxRecord } from './record.js';
import { recoverSandboxes } from './recover.js';
import { releaseSharedMounts, removeWorkDir } from './shared-dir.js';
import { destroyGuestPod, type StopBudget, stopBudget, tellStopping } from './stop.js';
import { stopPodTpm } from './tpm.js';
import {
  cgroupsFor,
  type LiveSandbox,
  type SandboxAccess,
  type SandboxFilter,
  type SandboxHandle,
  type SandboxManagerDeps,
  type SandboxRunOptions,
} from './types.js';
import { stopVirtiofsd, watchVirtiofsd } from './virtiofsd.js';

export { CONTAINERS_STOP_MAX_MS } from './stop.js';

/**
 * Owns every pod sandbox: RunPodSandbox, Stop, Remove, Status, List, recovery after a restart,
 * and noticing a VM that dies on its own. Rpcs on one sandbox are serialised by its id; rpcs on
 * different sandboxes run in parallel.
 */
export class SandboxManager implements SandboxAccess {
  private readonly sandboxes = new Map<string, LiveSandbox>();
  /** Pod identity (namespace, name, uid, attempt) -> sandbox id, including creations in flight. */
  private readonly identities = new Map<string, string>();
  private readonly locks = new KeyedMutex();

  constructor(private readonly deps: SandboxManagerDeps) {}

  /** Find sandboxes again from their records (see recover.ts). */
  async recover(): Promise<void> {
    await fsp.mkdir(sandboxVmRoot(this.deps.config.stateDir), { recursive: true, mode: 0o700 });
    const recovered = await recoverSandboxes(this.deps);
    for (const live of recovered) {
      this.sandboxes.set(live.record.id, live);
      this.identities.set(identityKey(live.record.metadata), live.record.id);
      if (live.vm !== undefined) this.watchExit(live, live.vm);
    }
    this.updateGauge();
  }

  /**
   * RunPodSandbox for a validated spec (a face decodes its request with decodeSandboxSpec) and the
   * name of the runtime handler to run it with (unknown names: NOT_FOUND listing the known ones).
   * `options` is what a face other than the CRI server asks beyond the spec (SandboxRunOptions:
   * the caller's id, a network namespace to join); the CRI server passes none.
   */
  async run(spec: SandboxSpec, runtimeHandler: string, ctx: RequestContext, options: SandboxRunOptions = {}): Promise<string> {
    const { metadata } = spec;
    const handler = resolveHandler(this.deps.config, runtimeHandler);
    const key = identityKey(metadata);
    const existing = this.identities.get(key);
    if (existing !== undefined) {
      throw alreadyExists(
        'SANDBOX_EXISTS',
        `a sandbox for pod ${metadata.namespace}/${metadata.name} (uid ${metadata.uid}, attempt ${metadata.attempt}) already exists: ${existing}`,
      );
    }
    const id = options.id === undefined ? newObjectId() : this.callerId(options.id);
    this.identities.set(key, id);
    ctx.annotate({ sandboxId: id });
    try {
      const { record, vm, agent } = await this.locks.run(id, () =>
        createSandbox(this.deps, {
          id,
          spec,
          runtimeHandler,
          handler,
          logger: ctx.logger.child({ sandboxId: id }),
          signal: ctx.signal,
          readyTimeoutMs: boundedTimeoutMs(this.deps.config.hypervisor.readyTimeoutMs, ctx),
          ...(options.joinNetns === undefined ? {} : { joinNetns: options.joinNetns }),
        }),
      );
      const live: LiveSandbox = { record, vm, agent, stopping: false };
      this.sandboxes.set(id, live);
      this.watchExit(live, vm);
      this.updateGauge();
      return id;
    } catch (err) {
      this.identities.delete(key);
      throw err;
    }
  }

  /**
   * A caller's sandbox id (containerd's pause container id), checked: containerd's identifier
   * rule (INVALID_ARGUMENT naming the field), and no sandbox of that id, also none being created
   * or stopped (ALREADY_EXISTS). Checked and taken in one synchronous step, as run() records it.
   */
  private callerId(id: string): string {
    if (!isCallerId(id)) {
      throw invalid(
        'SANDBOX_ID_INVALID',
        `id ${JSON.stringify(id)} is not an identifier (letters and digits separated by single ".", "_" or "-", at most ${CALLER_ID_MAX_LENGTH} characters).`,
        { details: { field: 'id', id } },
      );
    }
    if (this.sandboxes.has(id) || [...this.identities.values()].includes(id)) {
      throw alreadyExists('SANDBOX_ID_EXISTS', `a sandbox with id ${id} already exists.`, { details: { field: 'id', id } });
    }
    return id;
  }

  /** Resolve a full id or unique prefix of a visible sandbox, or throw NOT_FOUND. */
  resolve(idOrPrefix: string): LiveSandbox {
    const id = resolveIdPrefix(idOrPrefix, this.visibleIds());
    const live = id === undefined ? undefined : this.sandboxes.get(id);
    if (live === undefined) throw notFound('SANDBOX_NOT_FOUND', `pod sandbox "${idOrPrefix}" does not exist`);
    return live;
  }

  /** Same as resolve(), but undefined instead of NOT_FOUND. */
  find(idOrPrefix: string): LiveSandbox | undefined {
    const id = resolveIdPrefix(idOrPrefix, this.visibleIds());
    return id === undefined ? undefined : this.sandboxes.get(id);
  }

  /**
   * Run `fn` under the sandbox's lock, serialised with every other rpc on it. The sandbox is
   * resolved first (NOT_FOUND) and checked again once the lock is held, since a RemovePodSandbox
   * may have run while this waited (NOT_FOUND then too).
   */
  async withSandbox<T>(idOrPrefix: string, fn: (sandbox: SandboxHandle) => Promise<T>): Promise<T> {
    const live = this.resolve(idOrPrefix);
    const id = live.record.id;
    return this.locks.run(id, () => {
      if (this.sandboxes.get(id) !== live) throw notFound('SANDBOX_NOT_FOUND', `pod sandbox "${id}" does not exist`);
      return fn(this.handleFor(live));
    });
  }

  /**
   * Like withSandbox, for idempotent rpcs on what a sandbox holds (StopContainer, RemoveContainer):
   * `fn` runs under the lock of sandbox `id` and gets undefined when that sandbox does not exist
   * (any more) instead of an error.
   */
  async withSandboxIfPresent<T>(id: string, fn: (sandbox: SandboxHandle | undefined) => Promise<T>): Promise<T> {
    return this.locks.run(id, () => {
      const live = this.sandboxes.get(id);
      return fn(live === undefined ? undefined : this.handleFor(live));
    });
  }

  private handleFor(live: LiveSandbox): SandboxHandle {
    return {
      get record() {
        return live.record;
      },
      get vm() {
        return live.vm;
      },
      get agent() {
        return live.agent;
      },
      persist: () => this.deps.store.put(live.record),
      cgroupsFor: (placement) => this.cgroupsFor(placement),
    };
  }

  private *visibleIds(): Iterable<string> {
    for (const [id, live] of this.sandboxes) if (live.record.phase !== 'creating') yield id;
  }

  /**
   * StopPodSandbox: graceful guest shutdown, then quit, then SIGKILL; cgroup removed. Idempotent,
   * and, as the CRI asks, no error once everything is reclaimed: an unknown (removed) id succeeds.
   */
  async stop(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const live = this.find(idOrPrefix);
    if (live === undefined) {
      ctx.logger.info({ sandboxId: idOrPrefix }, 'StopPodSandbox for an unknown sandbox: nothing to stop');
      return;
    }
    ctx.annotate({ sandboxId: live.record.id });
    await this.locks.run(live.record.id, () => this.stopLocked(live, stopBudget(this.deps.config, ctx)));
  }

  private async stopLocked(live: LiveSandbox, budget: StopBudget): Promise<void> {
    const { record } = live;
    const log = this.deps.logger.child({ sandboxId: record.id });
    let exit: SandboxExitRecord | null = record.exit;
    // A paused pod is resumed first, so its containers and guest stop as any pod's do.
    await resumeBeforeStop(live, () => this.deps.store.put(record), log);
    if (live.vm !== undefined && live.vm.exitInfo === undefined) {
      // Containers first, while the VM and its agent are up, so they stop with their timeouts.
      await tellStopping(this.deps.listener, record.id, budget.containersMs, log);
      await destroyGuestPod(live, log);
      live.stopping = true;
      const result = await live.vm.shutdown({ timeoutMs: budget.vmMs });
      log.info({ how: result.how, exit: result.exit }, 'VM stopped');
      exit = await this.exitRecord(live.vm, result.exit, 'stopped');
    } else if (live.vm === undefined && record.vmm !== null && isSameLiveProcess(record.vmm.pid, record.vmm.startTimeTicks)) {
      // A QEMU we could not re-attach to after a restart: still ours (pid + start time), so end it.
      log.warn({ pid: record.vmm.pid }, 'killing a VM that could not be re-attached');
      await killAndWait(record.vmm.pid);
      exit ??= { at: new Date().toISOString(), code: null, signal: 'SIGKILL', reason: 'stopped', logTail: '' };
    }
    live.vm?.release();
    live.vm = undefined;
    live.agent?.close();
    live.agent = undefined;
    // The VM is gone: say so durably before touching cgroups, so that a teardown failure below
    // leaves an honest NOTREADY sandbox whose Stop can simply be retried.
    const changed = record.state !== 'SANDBOX_NOTREADY' || record.phase !== 'stopped' || record.exit !== exit;
    record.state = 'SANDBOX_NOTREADY';
    record.phase = 'stopped';
    record.exit = exit;
    record.guestPod = null;
    await this.deps.listener.sandboxStopped(record.id);
    if (changed) await this.deps.store.put(record);
    this.updateGauge();
    // virtiofsd and swtpm leave before their cgroup can go, and before the shared directory's mounts.
    await stopVirtiofsd(record, log);
    await stopPodTpm(record, this.deps.config.stateDir, log);
    if (record.virtiofsd !== null) {
      record.virtiofsd = null;
      await this.deps.store.put(record);
    }
    await releaseSharedMounts(sandboxSharedDir(this.deps.config.stateDir, record.id), log);
    // The jail's mounts (its /usr, /dev and the guest's files) serve no one once QEMU is gone.
    if (record.confinement?.jailDir != null) await releaseJail(record.confinement.jailDir, log);
    // CNI DEL and the TAP once QEMU is gone; a failure fails the stop, which the kubelet retries.
    if (record.network !== null) await networksFor(this.deps).detach(record.network, () => this.deps.store.put(record), log);
    if (record.placement !== null) {
      await this.cgroupsFor(record.placement).remove(record.placement);
      record.placement = null;
      await this.deps.store.put(record);
    }
    this.updateGauge();
  }

  /** RemovePodSandbox: stops if needed, removes every trace. Unknown ids succeed (CRI: idempotent). */
  async remove(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const live = this.find(idOrPrefix);
    if (live === undefined) return;
    const { record } = live;
    ctx.annotate({ sandboxId: record.id });
    await this.locks.run(record.id, async () => {
      if (!this.sandboxes.has(record.id)) return; // removed while we waited for the lock
      await this.stopLocked(live, stopBudget(this.deps.config, ctx));
      await this.deps.listener.sandboxRemoving(record.id);
      if (record.network !== null) {
        const log = this.deps.logger.child({ sandboxId: record.id });
        await networksFor(this.deps).teardown(record.network, () => this.deps.store.put(record), log);
      }
      await this.deps.store.delete(record.id);
      const log = this.deps.logger.child({ sandboxId: record.id });
      await removeWorkDir(sandboxWorkDir(this.deps.config.stateDir, record.id), log);
      // Last: the identity is free for another pod once nothing of this one is left.
      await releaseIdentity(this.deps, record, log);
      this.sandboxes.delete(record.id);
      this.identities.delete(identityKey(record.metadata));
      this.updateGauge();
    });
  }

  /** The visible sandboxes a filter lets through, oldest first. */
  list(filter: SandboxFilter | null): SandboxRecord[] {
    const out: SandboxRecord[] = [];
    for (const live of this.sandboxes.values()) {
      if (live.record.phase !== 'creating' && sandboxMatches(live.record, filter)) out.push(live.record);
    }
    return out.sort((a, b) => (a.createdAtNs < b.createdAtNs ? -1 : a.createdAtNs > b.createdAtNs ? 1 : 0));
  }

  /** Stop serving: drop connections to the VMs, which keep running for the next start. */
  close(): void {
    for (const live of this.sandboxes.values()) {
      live.vm?.release();
      live.agent?.close();
    }
  }

  /**
   * A VM that exits without StopPodSandbox makes its sandbox NOTREADY at once, with why. A guest
   * whose agent keeps breaking the channel protocol is failed here (QEMU killed, the violation
   * its reason), as the VM's own handle fails one that floods its ready port or QMP.
   */
  private watchExit(live: LiveSandbox, vm: VmProcess): void {
    const stopWatchingAgent = live.agent?.connection.onViolation((err) => vm.fail(err));
    let lostFiles = false;
    const stopWatching = watchVirtiofsd(
      () => (live.vm === vm && !live.stopping ? live.record.virtiofsd : null),
      () => {
        lostFiles = true;
        this.deps.logger.error(
          { sandboxId: live.record.id, pid: vm.pid },
          'virtiofsd exited: the pod VM has lost its files; ending the VM',
        );
        void vm.kill();
      },
    );
    void vm.exited
      .then(async (exit) => {
        stopWatching();
        stopWatchingAgent?.();
        if (live.vm !== vm || live.stopping) return;
        // Visible to List/Status immediately; the record follows under the lock.
        live.record.state = 'SANDBOX_NOTREADY';
        this.updateGauge();
        const record = await this.exitRecord(vm, exit, lostFiles ? 'virtiofsd-exited' : exitReason(exit));
        this.deps.logger.error({ sandboxId: live.record.id, pid: vm.pid, exit: record }, 'VM exited on its own; sandbox is NOTREADY');
        await this.locks.run(live.record.id, async () => {
          if (live.vm !== vm || !this.sandboxes.has(live.record.id)) return;
          live.vm = undefined;
          live.agent?.close();
          live.agent = undefined;
          live.record.phase = 'stopped';
          live.record.exit = record;
          live.record.guestPod = null;
          live.record.paused = null;
          // virtiofsd ends when QEMU disconnects; one that did not is stopped here.
          await stopVirtiofsd(live.record, this.deps.logger.child({ sandboxId: live.record.id }));
          live.record.virtiofsd = null;
          // swtpm leaves once QEMU closed its socket; one that did not is ended (a failure is
          // logged: the exit must still be recorded, and Stop ends it again).
          await stopPodTpm(live.record, this.deps.config.stateDir, this.deps.logger.child({ sandboxId: live.record.id })).catch(
            (err: unknown) => this.deps.logger.error({ sandboxId: live.record.id, err: errorMessage(err) }, 'stopping swtpm failed'),
          );
          await this.deps.listener.sandboxStopped(live.record.id);
          await this.deps.store.put(live.record);
        });
      })
      .catch((err: unknown) => this.deps.logger.error({ err: errorMessage(err), sandboxId: live.record.id }, 'recording a VM exit failed'));
  }

  private async exitRecord(vm: VmProcess, exit: ExitInfo, reason: string): Promise<SandboxExitRecord> {
    const [log, consoleText] = await Promise.all([vm.logTail(10).catch(() => ''), vm.consoleTail(10).catch(() => '')]);
    return {
      at: new Date().toISOString(),
      code: exit.code,
      signal: exit.signal,
      reason,
      logTail: [log.trim(), consoleText.trim()].filter((s) => s !== '').join('\n--- console ---\n'),
    };
  }

  private updateGauge(): void {
    let ready = 0;
    let notReady = 0;
    for (const live of this.sandboxes.values()) {
      if (live.record.phase === 'creating') continue;
      if (live.record.state === 'SANDBOX_READY') ready++;
      else notReady++;
    }
    this.deps.metrics.sandboxes.set({ state: 'ready' }, ready);
    this.deps.metrics.sandboxes.set({ state: 'notready' }, notReady);
  }

  /** For status: the cgroup driver in use (the one RuntimeConfig advertises). */
  get cgroups(): CgroupDriver {
    return this.deps.cgroups;
  }

  /** The driver that made a placement (see cgroupsFor in types.ts). */
  private cgroupsFor(placement: PlacementRecord): CgroupDriver {
    return cgroupsFor(this.deps, placement.driver);
  }
}

/** The reason a VM's exit is recorded with: the runtime's own failure of it first (vm.fail). */
function exitReason(exit: ExitInfo): string {
  if (exit.failure !== undefined) return `${exit.failure.reason}: ${exit.failure.message}`;
  return exit.shutdownReason ?? 'unexpected';
}
