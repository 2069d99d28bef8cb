/**
 * CreateContainer's guest half: the OCI spec is built first (so a refusal such as host network
 * happens before anything changes on the host), then the root filesystem and the CRI mounts are
 * bind-mounted into the sandbox's shared directory and the etc files written there.
 */
import { lstat } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '../../common/logger.js';
import { buildOciSpec, type GuestPod, guestLayout, type OciSpecInput } from '../../oci/index.js';
import type { PcieTopology } from '../../pcie/index.js';
import type { ContainerSpec } from '../spec/container.js';
import { type HostNodeType, planGuestDevices } from './guest-devices.js';
import { ociInput, readFileInRoot, readSeccompProfile } from './guest-spec.js';
import { checkMountSources, makeMissingSources, removeMadeSources } from './mount-sources.js';
import type { ContainerGuestPlan } from './record.js';
import { containerDirs, type HostMountRequest, hostSubmounts, type RuntimeMountRoot, SharedDirMounts } from './shared-dir.js';

export interface PrepareInput {
  sandboxId: string;
  containerId: string;
  spec: ContainerSpec;
  sandboxSpec: OciSpecInput['sandbox'];
  /** The image config's `config` object. */
  imageConfig: Record<string, unknown> | null;
  /** The container's snapshot on the host. */
  rootfs: string;
  /** The sandbox's shared directory on the host and in the guest. */
  sharedHostDir: string;
  sharedGuestDir: string;
  /** The directories the runtime's own mounts are under (see SharedDirMounts). */
  runtimeMountRoots: readonly RuntimeMountRoot[];
  pod: GuestPod;
  logger: Logger;
  /** Where the container's hot-plugged devices are in the VM (needed when the container has devices). */
  devices?: GuestDeviceFacts;
  /** Build and check the spec only (no guest pod to run it in): nothing is mounted, plan is null. */
  checkOnly?: boolean;
}

/** The VM's PCIe layout once the container's devices are plugged, and each VFIO group's functions. */
export interface GuestDeviceFacts {
  topology: PcieTopology;
  vfioFunctions: Readonly<Record<string, readonly string[]>>;
}

async function hostNodeType(p: string): Promise<HostNodeType> {
  const st = await lstat(p).catch(() => undefined);
  if (st === undefined) return 'missing';
  return st.isCharacterDevice() ? 'char' : st.isBlockDevice() ? 'block' : 'other';
}

/** How a refusal names mount i (as SharedDirMounts.bindCriMounts does). */
export function mountField(i: number, containerPath: string): string {
  return `container.mounts[${i}] (${containerPath})`;
}

/**
 * Build the spec and prepare the shared directory. On failure nothing stays mounted, written or
 * made; on success the caller registers `unmountAndRemove(plan.hostDir, plan.bindMounts)`, then
 * `removeMadeSources(madeSources)` (the missing host_path directories made for it), as its rollback.
 */
export async function prepareGuest(input: PrepareInput): Promise<{ plan: ContainerGuestPlan | null; madeSources: string[] }> {
  const dirs = containerDirs(input.sharedHostDir, input.sharedGuestDir, input.containerId);
  const criMounts: HostMountRequest[] = input.spec.mounts.map((m) => ({
    container_path: m.container_path,
    host_path: m.host_path,
    readonly: m.readonly,
    recursive_read_only: m.recursive_read_only,
    propagation: m.propagation,
  }));
  // Every source is looked at before any is made (a refusal for the last leaves no directory of the first).
  const sourceChecks = await checkMountSources(
    criMounts.map((m) => m.host_path),
    (i) => mountField(i, criMounts[i]?.container_path ?? ''),
  );
  // Guest paths are known before anything is mounted: the spec (and its refusals) comes first.
  const mountSources = Object.fromEntries(criMounts.map((m, i) => [m.container_path, path.posix.join(dirs.guestDir, 'mounts', String(i))]));
  const mountSubmounts: Record<string, string[]> = {};
  for (const m of criMounts) {
    if (!m.readonly || m.recursive_read_only === true) continue;
    const subs = await hostSubmounts(m.host_path);
    if (subs === undefined) {
      input.logger.warn({ mount: m.container_path }, 'too many host mounts below a read-only volume: the guest sees all of them read-only');
    } else if (subs.length > 0) mountSubmounts[m.container_path] = subs;
  }
  const rootfsGuestPath = path.posix.join(dirs.guestDir, 'rootfs');
  const [passwd, group, seccomp] = await Promise.all([
    readFileInRoot(input.rootfs, 'etc/passwd'),
    readFileInRoot(input.rootfs, 'etc/group'),
    readSeccompProfile(input.spec),
  ]);
  const guest = guestLayout({
    sandboxId: input.sandboxId,
    containerId: input.containerId,
    rootfsGuestPath,
    guestDir: dirs.guestDir,
    mountSources,
    mountSubmounts,
    pod: input.pod,
  });
  // Device nodes exist in the guest only once its kernel bound the hot-plugged function: the
  // agent resolves these to nodes (guest/agent/containers/devices.ts), so the spec gets none.
  const guestDevices =
    input.spec.devices.length === 0
      ? []
      : planGuestDevices({
          devices: input.spec.devices,
          topology: input.devices?.topology,
          vfioFunctions: input.devices?.vfioFunctions ?? {},
          hostNodeTypes: Object.fromEntries(
            await Promise.all(input.spec.devices.map(async (d) => [d.host_path, await hostNodeType(d.host_path)] as const)),
          ),
        });
  const container = { ...input.spec, devices: [] };
  const built = buildOciSpec(ociInput({ container, sandbox: input.sandboxSpec, image: input.imageConfig, passwd, group, seccomp, guest }));
  if (input.checkOnly === true) return { plan: null, madeSources: [] };
  const mounts = new SharedDirMounts(dirs, input.runtimeMountRoots, input.logger);
  const madeSources: string[] = [];
  try {
    await makeMissingSources(sourceChecks, madeSources);
    await mounts.bindRootfs(input.rootfs);
    await mounts.bindCriMounts(criMounts);
    await mounts.writeFiles(built.files);
  } catch (err) {
    await mounts.undo();
    await removeMadeSources(madeSources, input.logger);
    throw err;
  }
  return {
    madeSources,
    plan: {
      ociSpec: built.spec,
      guestDevices,
      stopSignal: built.stopSignal,
      rootfsGuestPath,
      hostDir: dirs.hostDir,
      bindMounts: [...mounts.bindMounts],
    },
  };
}
