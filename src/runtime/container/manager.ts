import path from 'node:path';
import { alreadyExists, errorMessage, invalid, notFound, precondition } from '../../common/errors.js';
import { newObjectId, resolveIdPrefix } from '../../common/ids.js';
import type { Logger } from '../../common/logger.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { ContainerConfig__Output } from '../../generated/runtime/v1/ContainerConfig.js';
import type { ContainerFilter__Output } from '../../generated/runtime/v1/ContainerFilter.js';
import type { CreateContainerRequest__Output } from '../../generated/runtime/v1/CreateContainerRequest.js';
import { createContainerSnapshot, removeContainerSnapshot } from '../../images/snapshot.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import { admissionError, admitAnnounced, containerDemand, fitBudget } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import type { LiveSandbox, SandboxManager } from '../sandbox/manager.js';
import { nowNs } from '../sandbox/record.js';
import { applyResize, planResize, type ResizePlan } from '../sandbox/resize.js';
import type { RecordStore } from '../store.js';
import { applyHotplug, detachDevices, planContainerHotplug } from './devices.js';
import type { AttachedDevice, ContainerRecord } from './record.js';
import { announcedOf, budgetForShape } from './shape.js';
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
  sandboxes: SandboxManager;
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
export class ContainerManager {
  readonly containers = new Map<string, ContainerRecord>();

  constructor(private readonly deps: ContainerManagerDeps) {
    deps.sandboxes.hooks = {
      onStopped: (live) => this.sandboxStopped(live),
      onRemoving: (live) => this.sandboxRemoving(live),
    };
  }

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
    const live = this.deps.sandboxes.resolve(req.pod_sandbox_id);
    const sandboxId = live.record.id;
    ctx.annotate({ sandboxId });
    return this.deps.sandboxes.locks.run(sandboxId, async () => {
      if (this.deps.sandboxes.find(sandboxId) !== live) throw notFound('SANDBOX_NOT_FOUND', `pod sandbox "${sandboxId}" does not exist`);
      const config = this.validateCreate(req, live);
      const name = config.metadata!.name;
      const image = this.deps.images.resolveImage(config.image!.image);
      if (image === undefined) throw notFound('IMAGE_NOT_FOUND', `image "${config.image!.image}" is not present; pull it first`);

      // Admission (pure): nothing below runs for a container the VM was not shaped for.
      const announced = announcedOf(live.record);
      const demand = containerDemand(config);
      let resize: ResizePlan | undefined;
      if (announced !== undefined) {
        const result = admitAnnounced(announced, config);
        if (!result.ok) throw admissionError(name, result.differences);
      } else {
        resize = this.growthFor(
          live,
          demand,
          this.inSandbox(sandboxId)
            .filter((c) => c.state === 'CONTAINER_CREATED')
            .map((c) => c.demand),
          name,
        );
      }
      // The host inventory is read only for a container that brings devices at all.
      const bringsDevices = config.devices.length > 0 || config.CDI_devices.length > 0;
      const hotplug = bringsDevices
        ? planContainerHotplug(live.record.topology, config, await this.deps.readPcieFacts(), this.deps.config.pcie.simulateVfioWith)
        : undefined;

      const id = newObjectId();
      ctx.annotate({ containerId: id });
      const rootfs = path.join(this.deps.config.stateDir, 'rootfs', id);
      let attached: AttachedDevice[] = [];
      let snapshotMade = false;
      try {
        await createContainerSnapshot(this.deps.images.rootfsFor(image.id), rootfs, { signal: ctx.signal });
        snapshotMade = true;
        if (hotplug !== undefined) {
          attached = await applyHotplug(this.requireVm(live), hotplug, ctx.logger, UNPLUG_TIMEOUT_MS);
          // QEMU confirmed every device_add: only now does the topology record change.
          live.record.topology = hotplug.topology;
        }
        if (resize?.changed) await applyResize(live, resize, (p) => this.deps.sandboxes.cgroupsFor(p), ctx.logger);
        const record: ContainerRecord = {
          id,
          sandboxId,
          state: 'CONTAINER_CREATED',
          createdAtNs: nowNs(),
          finishedAtNs: '0',
          exitCode: 0,
          reason: '',
          message: '',
          metadata: { name, attempt: config.metadata!.attempt },
          image: { requested: config.image!.image, id: image.id, ref: image.repoDigests[0] ?? image.id },
          labels: config.labels,
          annotations: config.annotations,
          logPath: logPathOf(live, config),
          rootfs,
          config: config as unknown as Record<string, unknown>,
          demand,
          devices: attached,
        };
        await this.deps.store.put(record);
        if (hotplug !== undefined || resize?.changed) await this.deps.sandboxes.save(live);
        this.containers.set(id, record);
        ctx.logger.info({ containerId: id, name, image: image.id, devices: attached, shape: live.record.shape }, 'container created');
        return id;
      } catch (err) {
        ctx.logger.warn({ err: errorMessage(err), name }, 'container creation failed; rolling back');
        if (attached.length > 0 && live.vm !== undefined) {
          live.record.topology = await detachDevices(live.vm, live.record.topology, attached, UNPLUG_TIMEOUT_MS).catch(
            () => live.record.topology,
          );
        }
        if (snapshotMade) await removeContainerSnapshot(rootfs);
        throw err;
      }
    });
  }

  private validateCreate(req: CreateContainerRequest__Output, live: LiveSandbox): ContainerConfig__Output {
    const config = req.config;
    if (config === null) throw invalid('CONTAINER_CONFIG_MISSING', 'config is required in CreateContainerRequest');
    if (config.metadata === null || config.metadata.name === '')
      throw invalid('CONTAINER_METADATA_INVALID', 'config.metadata.name must not be empty');
    if (config.image === null || config.image.image === '')
      throw invalid('CONTAINER_IMAGE_MISSING', 'config.image.image must not be empty');
    if (live.record.state !== 'SANDBOX_READY' || live.vm === undefined) {
      throw precondition(
        'SANDBOX_NOT_READY',
        `pod sandbox ${live.record.id} is not ready; containers can only be created in a running sandbox`,
      );
    }
    const { name, attempt } = config.metadata;
    const clash = this.inSandbox(live.record.id).find((c) => c.metadata.name === name && c.metadata.attempt === attempt);
    if (clash !== undefined) {
      throw alreadyExists(
        'CONTAINER_EXISTS',
        `container "${name}" (attempt ${attempt}) already exists in pod sandbox ${live.record.id}: ${clash.id}`,
      );
    }
    return config;
  }

  /** For sandboxes sized without pod_resources: does the container fit, or how must the VM grow? */
  growthFor(
    live: LiveSandbox,
    incoming: ContainerRecord['demand'],
    admitted: Array<ContainerRecord['demand']>,
    name: string,
  ): ResizePlan | undefined {
    const handler = resolveHandler(this.deps.config, live.record.handler);
    const fit = fitBudget({ containerName: name, shape: live.record.shape, handler: handler.profile, admitted, incoming });
    if (fit.fits) return undefined;
    const shape = { ...live.record.shape, vcpus: fit.grow.vcpus, memoryMiB: fit.grow.memoryMiB };
    const cpuRequest = [...admitted, incoming].reduce((sum, d) => sum + d.cpuMillicores, 0);
    return planResize(live.record, {
      vcpus: shape.vcpus,
      memoryMiB: shape.memoryMiB,
      budget: budgetForShape(live.record, shape, cpuRequest),
    });
  }

  private requireVm(live: LiveSandbox): NonNullable<LiveSandbox['vm']> {
    if (live.vm === undefined) throw precondition('SANDBOX_NOT_READY', `pod sandbox ${live.record.id} has no running VM`);
    return live.vm;
  }

  /** StopContainer: containers never run yet (StartContainer is not implemented), so this records the exit. */
  async stop(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const record = this.resolve(idOrPrefix);
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.deps.sandboxes.locks.run(record.sandboxId, async () => {
      if (record.state === 'CONTAINER_CREATED') await this.markExited(record, 'NotStarted');
    });
  }

  /** RemoveContainer: hot-plugged devices leave the VM first, then the root filesystem and record. Idempotent. */
  async remove(idOrPrefix: string, ctx: RequestContext): Promise<void> {
    const id = resolveIdPrefix(idOrPrefix, this.containers.keys());
    const record = id === undefined ? undefined : this.containers.get(id);
    if (record === undefined) return;
    ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
    await this.deps.sandboxes.locks.run(record.sandboxId, async () => {
      if (!this.containers.has(record.id)) return;
      const live = this.deps.sandboxes.find(record.sandboxId);
      if (record.devices.length > 0 && live?.vm !== undefined && live.vm.exitInfo === undefined) {
        live.record.topology = await detachDevices(live.vm, live.record.topology, record.devices, UNPLUG_TIMEOUT_MS);
        record.devices = [];
        await this.deps.sandboxes.save(live);
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

  /** Sandbox hook: its VM is gone, so are its containers. */
  private async sandboxStopped(live: LiveSandbox): Promise<void> {
    for (const c of this.inSandbox(live.record.id)) {
      if (c.state === 'CONTAINER_CREATED') await this.markExited(c, 'SandboxStopped');
    }
  }

  /** Sandbox hook: RemovePodSandbox removes its containers (their devices left with the VM). */
  private async sandboxRemoving(live: LiveSandbox): Promise<void> {
    for (const c of this.inSandbox(live.record.id)) await this.forget(c);
  }
}

function logPathOf(live: LiveSandbox, config: ContainerConfig__Output): string {
  const dir = (live.record.podConfig.log_directory as string | undefined) ?? '';
  if (config.log_path === '') return '';
  return dir === '' ? config.log_path : path.join(dir, config.log_path);
}
