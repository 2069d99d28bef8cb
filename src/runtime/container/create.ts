/**
 * CreateContainer for a spec a face has validated: admission (pure) against the sandbox's
 * announcement or its budget, device hot-plug, resize, the snapshot, the guest half (spec first,
 * then the shared directory), the record. Every step that changed something registers its undo;
 * a failure runs them newest first.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { alreadyExists, errorMessage, invalid, notFound, precondition } from '../../common/errors.js';
import { CALLER_ID_MAX_LENGTH, isCallerId, newObjectId } from '../../common/ids.js';
import type { Logger } from '../../common/logger.js';
import type { VmProcess } from '../../hypervisor/index.js';
import { createContainerRootfs, type OverlayRootfsRecord, removeContainerRootfs, removeContainerSnapshot } from '../../images/rootfs.js';
import type { OciSpecInput } from '../../oci/index.js';
import { admissionError, admitAnnounced, containerDemand } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import { applyResize, type ResizePlan, resizeCheckpoint, revertResize } from '../resize/index.js';
import { RollbackSteps } from '../rollback.js';
import { POD_SECRETS_ANNOTATION, type PodSecretMount, podSecretsFor } from '../sandbox/pod-secrets.js';
import { nowNs } from '../sandbox/record.js';
import type { SandboxHandle } from '../sandbox/types.js';
import type { ContainerSpec } from '../spec/container.js';
import { announcedPodResources, type SandboxSpec } from '../spec/sandbox.js';
import { applyHotplug, detachDevices, planContainerHotplug, vfioGroupFunctions } from './devices.js';
import { checkMountSources, removeMadeSources } from './mount-sources.js';
import { type GuestDeviceFacts, mountField, prepareGuest } from './prepare.js';
import type { AttachedDevice, ContainerRecord, ContainerStdio } from './record.js';
import { containerRootfsRoot, unmountAndRemove } from './shared-dir.js';
import type { ContainerCreateOptions, ContainerLookup, ContainerManagerDeps } from './types.js';

/** How long a detached device may take to leave the guest (the guest acknowledges the unplug). */
export const UNPLUG_TIMEOUT_MS = 30_000;

/** What CreateContainer needs of the manager. */
export interface CreateHost extends Pick<ContainerLookup, 'inSandbox' | 'growthFor'> {
  deps: ContainerManagerDeps;
  /**
   * Hold a caller's id until the record is registered or the create failed (release it then):
   * ALREADY_EXISTS when a container has it or another create holds it. Synchronous, so two
   * creates in different sandboxes (different locks) cannot both take it.
   */
  claimId(id: string): () => void;
  /** The record is stored: make it visible (map, CREATED event). */
  register(record: ContainerRecord): void;
  /**
   * Count an image and the layers its overlay will stack as in use from lookup until the record is
   * registered or the create failed (call the returned release then): a RemoveImage meanwhile is
   * refused, and no collection removes those layers under the new mount.
   */
  holdImage(imageId: string, layerDirs: readonly string[]): () => void;
}

/**
 * With a terminal the guest makes the container's console socket at
 * `/run/kata-ts/bundles/<id>/console.sock` (guest/agent/containers: GUEST_PATHS.bundles), and a
 * socket path holds at most 107 bytes: 73 characters are left for the id.
 */
export const MAX_TERMINAL_CONTAINER_ID_LENGTH = 107 - '/run/kata-ts/bundles/'.length - '/console.sock'.length;

/** CreateContainer under the sandbox's lock; returns the container's id (the caller's, or a new one). */
export async function createContainer(
  host: CreateHost,
  sandboxIdOrPrefix: string,
  spec: ContainerSpec,
  ctx: RequestContext,
  options: ContainerCreateOptions = {},
): Promise<string> {
  const { deps } = host;
  const stdio = options.stdio ?? { kind: 'cri-log' };
  await validateOptions(options, stdio, spec);
  const id = options.id ?? newObjectId();
  const release = options.id === undefined ? () => {} : host.claimId(id);
  try {
    return await deps.sandboxes.withSandbox(sandboxIdOrPrefix, (sandbox) =>
      createInSandbox(host, sandbox, id, spec, ctx, {
        rootfs: options.rootfs,
        stdio,
        podPrivilegeCheckedByCaller: options.podPrivilegeCheckedByCaller === true,
      }),
    );
  } finally {
    release();
  }
}

async function createInSandbox(
  host: CreateHost,
  sandbox: SandboxHandle,
  id: string,
  spec: ContainerSpec,
  ctx: RequestContext,
  options: { rootfs: string | undefined; stdio: ContainerStdio; podPrivilegeCheckedByCaller: boolean },
): Promise<string> {
  const { deps } = host;
  const sandboxId = sandbox.record.id;
  ctx.annotate({ sandboxId });
  validateCreate(host, spec, sandbox);
  const { name } = spec.metadata;
  // The broker resources the pod asked for this container by its name (decoded at RunPodSandbox).
  const secrets = podSecretsFor(sandbox.record.podSecrets, name);
  checkSecretPaths(secrets, spec, name);
  // A caller's root filesystem comes with no image here: the spec's image is a name only.
  const image =
    options.rootfs !== undefined ? { id: spec.image.image, repoDigests: [] as string[] } : deps.images.resolveImage(spec.image.image);
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

  // Mount sources looked at (reads only) before the root filesystem is made; checked again, and
  // the missing ones made, once the spec is built (prepareGuest).
  await checkMountSources(
    spec.mounts.map((m) => m.host_path),
    (i) => mountField(i, spec.mounts[i]?.container_path ?? ''),
  );
  ctx.annotate({ containerId: id });
  const rootfsOwner = options.rootfs === undefined ? 'runtime' : 'caller';
  let rootfs = options.rootfs ?? path.join(containerRootfsRoot(deps.config.stateDir), id);
  let rootfsOverlay: OverlayRootfsRecord | null = null;
  const log = ctx.logger.child({ containerId: id, name });
  // Every step that changed something pushes its undo; a failure runs them newest first.
  const undo = new RollbackSteps(log);
  // Released once the record is registered (it then counts as in use itself) or rolled back.
  let releaseImage = (): void => {};
  try {
    // The caller's root filesystem is used as it is and never removed, not even by a rollback.
    if (rootfsOwner === 'runtime') {
      // An overlay of the image's layers where overlays work, else a copy (src/images/rootfs.ts).
      const dir = rootfs;
      const source = deps.images.rootfsSourceFor(image.id);
      releaseImage = host.holdImage(image.id, source.kind === 'layers' ? source.lowerDirs : []);
      const made = await createContainerRootfs(source, dir, { signal: ctx.signal, logger: log });
      rootfs = made.path;
      rootfsOverlay = made.overlay;
      const overlay = made.overlay;
      undo.push('remove root filesystem', () => (overlay === null ? removeContainerSnapshot(dir) : removeContainerRootfs(overlay, log)));
    }
    const imageConfig = rootfsOwner === 'runtime' ? await deps.images.imageConfig(image.id) : null;
    const { plan: guest, madeSources } = await prepareContainerGuest(
      deps,
      sandbox,
      id,
      spec,
      imageConfig,
      rootfs,
      log,
      devices,
      options.podPrivilegeCheckedByCaller,
    );
    undo.push('remove the mount sources made', () => removeMadeSources(madeSources, log));
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
      // The caller's FIFOs take the output: no CRI log of ours.
      logPath: options.stdio.kind === 'cri-log' ? logPathOf(sandbox.record.spec, spec) : '',
      rootfs,
      rootfsOwner,
      rootfsOverlay,
      stdio: options.stdio,
      pid: 0,
      spec,
      demand,
      devices: attached,
      guest: guest === null || secrets.length === 0 ? guest : { ...guest, secrets },
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
  } finally {
    releaseImage();
  }
}

/**
 * A secret's file and a mount of the container at the same place, or one inside the other: the
 * container could not have both. Refused before anything happens, naming both.
 */
function checkSecretPaths(secrets: readonly PodSecretMount[], spec: ContainerSpec, name: string): void {
  for (const secret of secrets) {
    for (const [i, m] of spec.mounts.entries()) {
      const p = m.container_path;
      if (p === secret.path || p.startsWith(`${secret.path}/`) || secret.path.startsWith(`${p.replace(/\/+$/, '')}/`)) {
        throw invalid(
          'POD_SECRETS_ANNOTATION_INVALID',
          `annotation ${POD_SECRETS_ANNOTATION}: container ${JSON.stringify(name)}'s path ${JSON.stringify(secret.path)} overlaps ${mountField(i, p)}; a secret's file needs a place of its own`,
          { details: { field: `annotations["${POD_SECRETS_ANNOTATION}"]` } },
        );
      }
    }
  }
}

/**
 * A caller's id, root filesystem and FIFOs, checked before anything happens: INVALID_ARGUMENT
 * naming the field. The id's uniqueness is checked when it is claimed.
 */
async function validateOptions(options: ContainerCreateOptions, stdio: ContainerStdio, spec: ContainerSpec): Promise<void> {
  const terminal = stdio.kind === 'fifo' ? stdio.terminal : spec.tty;
  if (options.id !== undefined) {
    if (!isCallerId(options.id)) {
      throw invalid(
        'CONTAINER_ID_INVALID',
        `id "${options.id}" is not a container id: letters and digits joined by single ".", "_" or "-", at most ${CALLER_ID_MAX_LENGTH} characters`,
      );
    }
    if (terminal && options.id.length > MAX_TERMINAL_CONTAINER_ID_LENGTH) {
      throw invalid(
        'CONTAINER_ID_INVALID',
        `id "${options.id}" is too long for a container with a terminal: at most ${MAX_TERMINAL_CONTAINER_ID_LENGTH} characters (the guest's console socket path)`,
      );
    }
  }
  if (options.rootfs !== undefined) {
    const st = path.isAbsolute(options.rootfs) ? await fsp.stat(options.rootfs).catch(() => undefined) : undefined;
    if (st === undefined || !st.isDirectory()) {
      throw invalid('CONTAINER_ROOTFS_INVALID', `rootfs "${options.rootfs}" is not an existing directory (an absolute path)`);
    }
  }
  if (stdio.kind === 'fifo') {
    if (stdio.terminal !== spec.tty) {
      throw invalid(
        'CONTAINER_STDIO_INVALID',
        `stdio.terminal is ${stdio.terminal} but the container's tty is ${spec.tty}: they must agree`,
      );
    }
    // With a terminal there is one stream: stderr is not used, whatever it names.
    const fifos = { stdin: stdio.stdin, stdout: stdio.stdout, ...(stdio.terminal ? {} : { stderr: stdio.stderr }) };
    for (const [field, p] of Object.entries(fifos)) {
      if (p === '') continue;
      const st = path.isAbsolute(p) ? await fsp.stat(p).catch(() => undefined) : undefined;
      if (st === undefined || !st.isFIFO())
        throw invalid('CONTAINER_STDIO_INVALID', `stdio.${field} "${p}" is not an existing FIFO (an absolute path)`);
    }
  }
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
  imageConfig: Record<string, unknown> | null,
  rootfs: string,
  logger: Logger,
  devices: GuestDeviceFacts,
  podPrivilegeCheckedByCaller: boolean,
): Promise<{ plan: ContainerRecord['guest']; madeSources: string[] }> {
  const sandboxId = sandbox.record.id;
  const pod = deps.guests.guestPodOf(sandboxId);
  return prepareGuest({
    sandboxId,
    containerId,
    spec,
    sandboxSpec: sandboxSpecFor(sandbox.record.spec as OciSpecInput['sandbox'], spec, podPrivilegeCheckedByCaller),
    imageConfig,
    rootfs,
    sharedHostDir: deps.guests.sharedDirOf(sandboxId),
    runtimeMountRoots: [
      { dir: deps.guests.sharedDirsRoot, shared: true },
      { dir: containerRootfsRoot(deps.config.stateDir), shared: false },
    ],
    sharedGuestDir: deps.guests.guestSharedDir,
    pod: pod ?? { pausePid: 1, shmPath: '/dev/shm' },
    logger,
    devices,
    checkOnly: pod === null,
  });
}

function requireVm(sandbox: SandboxHandle): VmProcess {
  if (sandbox.vm === undefined) throw precondition('SANDBOX_NOT_READY', `pod sandbox ${sandbox.record.id} has no running VM`);
  return sandbox.vm;
}

/**
 * The container's CRI log file: log_path beneath the pod's log_directory, or none when either is
 * empty (as containerd decides). A log_path alone is relative and would name a file beneath the
 * daemon's working directory.
 */
function logPathOf(sandbox: SandboxSpec, container: ContainerSpec): string {
  if (container.log_path === '' || sandbox.log_directory === '') return '';
  return path.join(sandbox.log_directory, container.log_path);
}

/**
 * The pod's spec as this container's OCI spec is built from it: as recorded, except that a
 * privileged container the caller's manager admitted (ContainerCreateOptions) finds its pod
 * privileged. Pure.
 */
export function sandboxSpecFor(
  recorded: OciSpecInput['sandbox'],
  container: ContainerSpec,
  podPrivilegeCheckedByCaller: boolean,
): OciSpecInput['sandbox'] {
  if (!podPrivilegeCheckedByCaller || container.linux?.security_context?.privileged !== true) return recorded;
  const linux = recorded.linux ?? null;
  return { ...recorded, linux: { ...linux, security_context: { ...linux?.security_context, privileged: true } } };
}
