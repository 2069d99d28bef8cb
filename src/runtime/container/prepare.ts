/**
 * CreateContainer's guest half: the OCI spec is built first (so a refusal such as host network
 * happens before anything changes on the host), then the root filesystem and the CRI mounts are
 * bind-mounted into the sandbox's shared directory and the etc files written there.
 */
import path from 'node:path';
import type { Logger } from '../../common/logger.js';
import { buildOciSpec, type OciSpecInput } from '../../oci/index.js';
import type { ContainerSpec } from '../spec/container.js';
import { type GuestPod, guestLayout, ociInput, readFileInRoot, readSeccompProfile } from './guest-spec.js';
import type { ContainerGuestPlan } from './record.js';
import { containerDirs, type HostMountRequest, hostSubmounts, SharedDirMounts } from './shared-dir.js';

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
  pod: GuestPod;
  logger: Logger;
  /** Build and check the spec only (no guest pod to run it in): nothing is mounted, plan is null. */
  checkOnly?: boolean;
}

/**
 * Build the spec and prepare the shared directory. On failure nothing stays mounted or written;
 * on success the caller registers `unmountAndRemove(plan.hostDir, plan.bindMounts)` as its rollback.
 */
export async function prepareGuest(input: PrepareInput): Promise<{ plan: ContainerGuestPlan | null }> {
  const dirs = containerDirs(input.sharedHostDir, input.sharedGuestDir, input.containerId);
  const criMounts: HostMountRequest[] = input.spec.mounts.map((m) => ({
    container_path: m.container_path,
    host_path: m.host_path,
    readonly: m.readonly,
    recursive_read_only: m.recursive_read_only,
    propagation: m.propagation,
  }));
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
  // Hot-plugged devices reach the guest as PCI functions; the device nodes their guest drivers
  // create are not mapped into the container's spec yet (README, known limits): said, not hidden.
  if (input.spec.devices.length > 0) {
    input.logger.warn(
      { devices: input.spec.devices.map((d) => d.container_path) },
      "the container's devices are hot-plugged into the VM but their guest device nodes are not mapped into the container yet",
    );
  }
  const container = { ...input.spec, devices: [] };
  const built = buildOciSpec(ociInput({ container, sandbox: input.sandboxSpec, image: input.imageConfig, passwd, group, seccomp, guest }));
  if (input.checkOnly === true) return { plan: null };
  const mounts = new SharedDirMounts(dirs, input.logger);
  try {
    await mounts.bindRootfs(input.rootfs);
    await mounts.bindCriMounts(criMounts);
    await mounts.writeFiles(built.files);
  } catch (err) {
    await mounts.undo();
    throw err;
  }
  return {
    plan: {
      ociSpec: built.spec as unknown as Record<string, unknown>,
      stopSignal: built.stopSignal,
      rootfsGuestPath,
      hostDir: dirs.hostDir,
      bindMounts: [...mounts.bindMounts],
    },
  };
}
