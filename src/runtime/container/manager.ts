import path from 'node:path';
import { alreadyExists, errorMessage, notFound, precondition } from '../../common/errors.js';
import { newObjectId, resolveIdPrefix } from '../../common/ids.js';
import type { Logger } from '../../common/logger.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { ContainerFilter__Output } from '../../generated/runtime/v1/ContainerFilter.js';
import type { CreateContainerRequest__Output } from '../../generated/runtime/v1/CreateContainerRequest.js';
import type { VmProcess } from '../../hypervisor/index.js';
import { createContainerSnapshot, removeContainerSnapshot } from '../../images/snapshot.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import { admissionError, admitAnnounced, containerDemand } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import { applyResize, planGrowth, type ResizePlan, resizeCheckpoint, revertResize } from '../resize/index.js';
import type { SandboxAccess, SandboxHandle, SandboxListener } from '../sandbox/manager.js';
import { nowNs, type SandboxRecord } from '../sandbox/record.js';
import { type ContainerSpec, decodeContainerSpec } from '../spec/container.js';
import { announcedPodResources, type SandboxSpec } from '../spec/sandbox.js';
import type { RecordStore } from '../store.js';
import { applyHotplug, detachDevices, planContainerHotplug } from './devices.js';
import type { AttachedDevice, ContainerRecord } from './record.js';
import { RollbackSteps } from './rollback.js';
import { containerMatches } from './views.js';

/** What the container layer needs of the image store. */
export interface ImageLookup {
  resolveImage(ref: string): { id: string; repoDigests: string[] } | undefined;
  rootfsFor(imageId: string): string;
}

export interface ContainerManagerDeps {
  config: KataConfig;
  logger: Logger;
  store: RecordStore<ContainerRecord>;
  sandboxes: SandboxAccess;
  images: ImageLookup;
  host: HostCapacity;
  readPcieFacts(): Promise<PcieHostFacts>;
}

/** How long a detached device may take to leave the guest (the guest acknowledges the unplug). */
const UNPLUG_TIMEOUT_MS = 30_000;

/**
 * Containers in pod VMs: CreateContainer admission against what RunPodSandbox announced, device
 * hot-plug onto the ports planned for them, growth within planned headroom for sandboxes sized
 * without pod_resources, and the records behind ContainerStatus and ListContainers. Every
 * operation runs under its sandbox's lock, so it is serialised with the sandbox's own rpcs.
 */
export class ContainerManager implements SandboxListener {
  private readonly containers = new Map<string, ContainerRecord>();

  constructor(private readonly deps: ContainerManagerDeps) {}

  /** Load records; containers of sandboxes that no longer exist are removed, of stopped ones EXITED. */
  async recover(): Promise<void> {
    const { records } = await this.deps.store.load();
    for (const r of records) {
      const live = this.deps.sandboxes.find(r.sandboxId);
      if (live === undefined) {
        this.deps.logger.warn({ containerId: r.id, sandboxId: r.sandboxId }, 'container of a removed sandbox; removing it');
        await removeContainerSnapshot(r.rootfs);
        await this.deps.store.delete(r.id);
        continue;
      }
      this.containers.set(r.id, r);
      if (live.record.state !== 'SANDBOX_READY' && r.state === 'CONTAINER_CREATED') await this.markExited(r, 'SandboxStopped');
    }
  }

  isImageInUse(imageId: string): boolean {
    for (const c of this.containers.values()) if (c.image.id === imageId) return true;
    return false;
  }

  resolve(idOrPrefix: string): ContainerRecord {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) throw notFound('CONTAINER_NOT_FOUND', `container "${idOrPrefix}" does not exist`);
    return record;
  }

  list(filter: ContainerFilter__Output | null): ContainerRecord[] {
    return [...this.containers.values()]
      .filter((c) => containerMatches(c, filter))
      .sort((a, b) => (a.createdAtNs < b.createdAtNs ? -1 : a.createdAtNs > b.createdAtNs ? 1 : 0));
  }

  inSandbox(sandboxId: string): ContainerRecord[] {
    return [...this.containers.values()].filter((c) => c.sandboxId === sandboxId);
  }

  async create(req: CreateContainerRequest__Output, ctx: RequestContext): Promise<string> {
    return this.deps.sandboxes.withSandbox(req.pod_sandbox_id, async (sandbox) => {
      const sandboxId = sandbox.record.id;
      ctx.annotate({ sandboxId });
      const spec = this.validateCreate(req, sandbox);
      const { name } = spec.metadata;
      const image = this.deps.images.resolveImage(spec.image.image);
      if (image === undefined) throw notFound('IMAGE_NOT_FOUND', `image "${spec.image.image}" is not present; pull it first`);

      // Admission (pure): nothing below runs for a container the VM was not shaped for.
      const announced = announcedPodResources(sandbox.record.spec);
      const demand = containerDemand(spec);
      let resize: ResizePlan | undefined;
      if (announced !== undefined) {
        const result = admitAnnounced(announced, spec);
        if (!result.ok) throw admissionError(name, result.differences);
      } else {
        const admitted = this.inSandbox(sandboxId)
          .filter((c) => c.state === 'CONTAINER_CREATED')
          .map((c) => c.demand);
        resize = this.growthFor(sandbox.record, demand, admitted, name);
      }
      // The host inventory is read only for a container that brings devices at all.
      const bringsDevices = spec.devices.length > 0 || spec.CDI_devices.length > 0;
      const hotplug = bringsDevices
        ? planContainerHotplug(sandbox.record.topology, spec, await this.deps.readPcieFacts(), this.deps.config.pcie.simulateVfioWith)
        : undefined;

      const id = newObjectId();
      ctx.annotate({ containerId: id });
      const rootfs = path.join(this.deps.config.stateDir, 'rootfs', id);
      const log = ctx.logger.child({ containerId: id, name });
      // Every step that changed something pushes its undo; a failure runs them newest first.
      const undo = new RollbackSteps(log);
      try {
        await createContainerSnapshot(this.deps.images.rootfsFor(image.id), rootfs, { signal: ctx.signal });
        undo.push('remove root filesystem', () => removeContainerSnapshot(rootfs));
        let attached: AttachedDevice[] = [];
        if (hotplug !== undefined) {
          const vm = requireVm(sandbox);
          const before = sandbox.record.topology;
          attached = await applyHotplug(vm, hotplug, ctx.logger, UNPLUG_TIMEOUT_MS);
          // QEMU confirmed every device_add: only now does the topology record change.
          sandbox.record.topology = hotplug.topology;
          undo.push('unplug hot-plugged devices', async () => {
            await detachDevices(vm, sandbox.record.topology, attached, UNPLUG_TIMEOUT_MS);
            sandbox.record.topology = before;
          });
        }
        if (resize?.changed) {
          const checkpoint = resizeCheckpoint(sandbox);
          // Registered before applying: a resize that fails half-way has changed something too.
          undo.push('resize back', () => revertResize(sandbox, checkpoint, log));
          await applyResize(sandbox, resize, ctx.logger);
        }
        const record: ContainerRecord = {
          id,
          sandboxId,
          state: 'CONTAINER_CREATED',
          createdAtNs: nowNs(),
          finishedAtNs: '0',
          exitCode: 0,
          reason: '',
          message: '',
          metadata: { name, attempt: spec.metadata.attempt },
          image: { requested: spec.image.image, id: image.id, ref: image.repoDigests[0] ?? image.id },
          labels: spec.labels,
          annotations: spec.annotations,
          logPath: logPathOf(sandbox.record.spec, spec),
          rootfs,
          spec,
          demand,
          devices: attached,
        };
        await this.deps.store.put(record);
        undo.push('delete container record', () => this.deps.store.delete(id));
        if (hotplug !== undefined || resize?.changed) await sandbox.persist();
        this.containers.set(id, record);
        ctx.logger.info({ containerId: id, name, image: image.id, devices: attached, shape: sandbox.record.shape }, 'container created');
        return id;
      } catch (err) {
        log.warn({ err: errorMessage(err) }, 'container creation failed; rolling back');
        const changedSandbox = undo.has('unplug hot-plugged devices') || undo.has('resize back');
        await undo.run();
        // The sandbox record tells what the VM has after the rollback (a vCPU stays plugged).
        if (changedSandbox) await undo.attempt('save sandbox record', () => sandbox.persist());
        throw err;
      }
    });
  }

  private validateCreate(req: CreateContainerRequest__Output, sandbox: SandboxHandle): ContainerSpec {
    const spec = decodeContainerSpec(req.config);
    if (sandbox.record.state !== 'SANDBOX_READY' || sandbox.vm === undefined) {
      throw precondition(
        'SANDBOX_NOT_READY',
        `pod sandbox ${sandbox.record.id} is not ready; containers can only be created in a running sandbox`,
      );
    }
    const { name, attempt } = spec.metadata;
    const clash = this.inSandbox(sandbox.record.id).find((c) => c.metadata.name === name && c.metadata.attempt === attempt);
    if (clash !== undefined) {
      throw alreadyExists(
        'CONTAINER_EXISTS',
        `container "${name}" (attempt ${attempt}) already exists in pod sandbox ${sandbox.record.id}: ${clash.id}`,
      );
    }
    return spec;
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

  /**
   * StopContainer: containers never run yet (StartContainer is not implemented), so this records
   * the exit. As the CRI asks (and as StopPodSandbox does), an unknown container id succeeds.
   */
  async stop(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) {
      ctx.logger.info({ containerId: idOrPrefix }, 'StopContainer for an unknown container: nothing to stop');
      return;
    }
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.deps.sandboxes.withSandboxIfPresent(record.sandboxId, async () => {
      if (this.containers.get(record.id) === record && record.state === 'CONTAINER_CREATED') await this.markExited(record, 'NotStarted');
    });
  }

  /** RemoveContainer: hot-plugged devices leave the VM first, then the root filesystem and record. Idempotent. */
  async remove(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) return;
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.deps.sandboxes.withSandboxIfPresent(record.sandboxId, async (sandbox) => {
      if (!this.containers.has(record.id)) return;
      const vm = sandbox?.vm;
      if (sandbox !== undefined && record.devices.length > 0 && vm !== undefined && vm.exitInfo === undefined) {
        sandbox.record.topology = await detachDevices(vm, sandbox.record.topology, record.devices, UNPLUG_TIMEOUT_MS);
        record.devices = [];
        await sandbox.persist();
      }
      await this.forget(record);
    });
  }

  private async forget(record: ContainerRecord): Promise<void> {
    await removeContainerSnapshot(record.rootfs);
    await this.deps.store.delete(record.id);
    this.containers.delete(record.id);
  }

  private async markExited(record: ContainerRecord, reason: string): Promise<void> {
    record.state = 'CONTAINER_EXITED';
    record.finishedAtNs = nowNs();
    record.reason = reason;
    record.message =
      reason === 'NotStarted'
        ? 'the container was stopped before it started; starting containers inside the guest is not implemented yet'
        : 'the pod sandbox stopped';
    await this.deps.store.put(record);
  }

  /**
   * SandboxListener: StopPodSandbox is about to bring the VM down (placeholder: no container runs
   * in the guest yet; the container layer stops its containers here within `deadlineMs`).
   */
  async sandboxStopping(_sandboxId: string, _deadlineMs: number): Promise<void> {}

  /** SandboxListener: the sandbox's VM is gone, so are its containers. */
  async sandboxStopped(sandboxId: string): Promise<void> {
    for (const c of this.inSandbox(sandboxId)) {
      if (c.state === 'CONTAINER_CREATED') await this.markExited(c, 'SandboxStopped');
    }
  }

  /** SandboxListener: RemovePodSandbox removes its containers (their devices left with the VM). */
  async sandboxRemoving(sandboxId: string): Promise<void> {
    for (const c of this.inSandbox(sandboxId)) await this.forget(c);
  }
}

function requireVm(sandbox: SandboxHandle): VmProcess {
  if (sandbox.vm === undefined) throw precondition('SANDBOX_NOT_READY', `pod sandbox ${sandbox.record.id} has no running VM`);
  return sandbox.vm;
}

function logPathOf(sandbox: SandboxSpec, container: ContainerSpec): string {
  if (container.log_path === '') return '';
  return sandbox.log_directory === '' ? container.log_path : path.join(sandbox.log_directory, container.log_path);
}
