/**
 * CreateContainer for a spec a face has validated: admission (pure) against the sandbox's
 * announcement or its budget, device hot-plug, resize, the snapshot, the guest half (spec first,
 * then the shared directory), the record. Every step that changed something registers its undo;
 * a failure runs them newest first.
 */
import path from 'node:path';
import { alreadyExists, errorMessage, notFound, precondition } from '../../common/errors.js';
import { newObjectId } from '../../common/ids.js';
import type { Logger } from '../../common/logger.js';
import type { VmProcess } from '../../hypervisor/index.js';
import { createContainerSnapshot, removeContainerSnapshot } from '../../images/snapshot.js';
import type { OciSpecInput } from '../../oci/index.js';
import { admissionError, admitAnnounced, containerDemand } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import { applyResize, type ResizePlan, resizeCheckpoint, revertResize } from '../resize/index.js';
import { RollbackSteps } from '../rollback.js';
import { nowNs } from '../sandbox/record.js';
import type { SandboxHandle } from '../sandbox/types.js';
import type { ContainerSpec } from '../spec/container.js';
import { announcedPodResources, type SandboxSpec } from '../spec/sandbox.js';
import { applyHotplug, detachDevices, planContainerHotplug, vfioGroupFunctions } from './devices.js';
import { type GuestDeviceFacts, prepareGuest } from './prepare.js';
import type { AttachedDevice, ContainerRecord } from './record.js';
import { unmountAndRemove } from './shared-dir.js';
import type { ContainerLookup, ContainerManagerDeps } from './types.js';

/** How long a detached device may take to leave the guest (the guest acknowledges the unplug). */
export const UNPLUG_TIMEOUT_MS = 30_000;

/** What CreateContainer needs of the manager. */
export interface CreateHost extends Pick<ContainerLookup, 'inSandbox' | 'growthFor'> {
  deps: ContainerManagerDeps;
  /** The record is stored: make it visible (map, CREATED event). */
  register(record: ContainerRecord): void;
}

/** CreateContainer under the sandbox's lock; returns the new container's id. */
export async function createContainer(
  host: CreateHost,
  sandboxIdOrPrefix: string,
  spec: ContainerSpec,
  ctx: RequestContext,
): Promise<string> {
  const { deps } = host;
  return deps.sandboxes.withSandbox(sandboxIdOrPrefix, async (sandbox) => {
    const sandboxId = sandbox.record.id;
    ctx.annotate({ sandboxId });
    validateCreate(host, spec, sandbox);
    const { name } = spec.metadata;
    const image = deps.images.resolveImage(spec.image.image);
    if (image === undefined) throw notFound('IMAGE_NOT_FOUND', `image "${spec.image.image}" is not present; pull it first`);

    // Admission (pure): nothing below runs for a container the VM was not shaped for.
    const announced = announcedPodResources(sandbox.record.spec);
    const demand = containerDemand(spec);
    let resize: ResizePlan | undefined;
    if (announced !== undefined) {
      const result = admitAnnounced(announced, spec);
      if (!result.ok) throw admissionError(name, result.differences);
    } else {
      const admitted = host
        .inSandbox(sandboxId)
        .filter((c) => c.state === 'CONTAINER_CREATED')
        .map((c) => c.demand);
      resize = host.growthFor(sandbox.record, demand, admitted, name);
    }
    // The host inventory is read only for a container that brings devices at all.
    const bringsDevices = spec.devices.length > 0 || spec.CDI_devices.length > 0;
    const facts = bringsDevices ? await deps.readPcieFacts() : undefined;
    const hotplug = facts ? planContainerHotplug(sandbox.record.topology, spec, facts, deps.config.pcie.simulateVfioWith) : undefined;
    // The guest finds each device's node by where the hot-plug puts it (the planned topology).
    const devices: GuestDeviceFacts = {
      topology: hotplug?.topology ?? sandbox.record.topology,
      vfioFunctions: facts && spec.devices.length > 0 ? vfioGroupFunctions(facts.inventory, spec.devices) : {},
    };

    const id = newObjectId();
    ctx.annotate({ containerId: id });
    const rootfs = path.join(deps.config.stateDir, 'rootfs', id);
    const log = ctx.logger.child({ containerId: id, name });
    // Every step that changed something pushes its undo; a failure runs them newest first.
    const undo = new RollbackSteps(log);
    try {
      await createContainerSnapshot(deps.images.rootfsFor(image.id), rootfs, { signal: ctx.signal });
      undo.push('remove root filesystem', () => removeContainerSnapshot(rootfs));
      const guest = await prepareContainerGuest(deps, sandbox, id, spec, image.id, rootfs, log, devices);
      if (guest !== null) undo.push('unmount the shared directory', () => unmountAndRemove(guest.hostDir, guest.bindMounts, log));
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
        startedAtNs: '0',
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
        guest,
      };
      await deps.store.put(record);
      undo.push('delete container record', () => deps.store.delete(id));
      if (hotplug !== undefined || resize?.changed) await sandbox.persist();
      host.register(record);
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

/** The sandbox must run, and the name and attempt must be free in it. */
function validateCreate(host: CreateHost, spec: ContainerSpec, sandbox: SandboxHandle): void {
  if (sandbox.record.state !== 'SANDBOX_READY' || sandbox.vm === undefined) {
    throw precondition(
      'SANDBOX_NOT_READY',
      `pod sandbox ${sandbox.record.id} is not ready; containers can only be created in a running sandbox`,
    );
  }
  const { name, attempt } = spec.metadata;
  const clash = host.inSandbox(sandbox.record.id).find((c) => c.metadata.name === name && c.metadata.attempt === attempt);
  if (clash !== undefined) {
    throw alreadyExists(
      'CONTAINER_EXISTS',
      `container "${name}" (attempt ${attempt}) already exists in pod sandbox ${sandbox.record.id}: ${clash.id}`,
    );
  }
}

/**
 * The OCI spec (built first: a refusal changes nothing) and the shared directory. A sandbox
 * whose guest has no pod (an older record, or a guest without one) gets the spec checked and no
 * guest plan: such a container can be stopped and removed, not started.
 */
async function prepareContainerGuest(
  deps: ContainerManagerDeps,
  sandbox: SandboxHandle,
  containerId: string,
  spec: ContainerSpec,
  imageId: string,
  rootfs: string,
  logger: Logger,
  devices: GuestDeviceFacts,
): Promise<ContainerRecord['guest']> {
  const sandboxId = sandbox.record.id;
  const pod = deps.guests.guestPodOf(sandboxId);
  const { plan } = await prepareGuest({
    sandboxId,
    containerId,
    spec,
    sandboxSpec: sandbox.record.spec as OciSpecInput['sandbox'],
    imageConfig: await deps.images.imageConfig(imageId),
    rootfs,
    sharedHostDir: deps.guests.sharedDirOf(sandboxId),
    sharedDirsRoot: deps.guests.sharedDirsRoot,
    sharedGuestDir: deps.guests.guestSharedDir,
    pod: pod ?? { pausePid: 1, shmPath: '/dev/shm' },
    logger,
    devices,
    checkOnly: pod === null,
  });
  return plan;
}

function requireVm(sandbox: SandboxHandle): VmProcess {
  if (sandbox.vm === undefined) throw precondition('SANDBOX_NOT_READY', `pod sandbox ${sandbox.record.id} has no running VM`);
  return sandbox.vm;
}

function logPathOf(sandbox: SandboxSpec, container: ContainerSpec): string {
  if (container.log_path === '') return '';
  return sandbox.log_directory === '' ? container.log_path : path.join(sandbox.log_directory, container.log_path);
}
