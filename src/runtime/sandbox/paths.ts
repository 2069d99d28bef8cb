import path from 'node:path';
import { shortIdKey } from '../../common/ids.js';
import type { HypervisorConfig } from '../../config/types.js';
import { type VmPaths, type VmSocketPaths, vmPaths } from '../../hypervisor/index.js';
import type { SandboxTeePaths } from '../plan.js';

/**
 * A sandbox's runtime directory: its QMP and ready sockets, the QEMU log and the guest console.
 * Keyed by 16 hex digits of the id (shortIdKey: an object id's first 16, a caller's other id's
 * hash) rather than the whole id, because a unix socket path must fit in 108 bytes (sun_path) and
 * `<stateDir>/vm/<64 hex>/ready.sock` would not under a long state dir. 16 hex digits (64 random
 * bits) do not collide in practice; a collision is still detected at creation (the directory
 * must not exist).
 */
export function sandboxWorkDir(stateDir: string, sandboxId: string): string {
  return path.join(sandboxVmRoot(stateDir), shortIdKey(sandboxId));
}

/** The directory holding every sandbox's work dir (made at start, so a refused request creates nothing). */
export function sandboxVmRoot(stateDir: string): string {
  return path.join(stateDir, 'vm');
}

/**
 * `<stateDir>/pool-vm/<16 hex>`: where a pooled VM (src/runtime/pool) was booted. A claim renames
 * it to the sandbox's work dir, but QEMU's command line keeps naming the paths under this one.
 */
export function poolVmWorkDir(stateDir: string, poolVmId: string): string {
  return path.join(poolVmRoot(stateDir), shortIdKey(poolVmId));
}

/** `<stateDir>/pool-vm`: pooled VMs' work dirs, apart from `vm/`, whose strays recovery removes. */
export function poolVmRoot(stateDir: string): string {
  return path.join(stateDir, 'pool-vm');
}

/** QEMU's `-name guest=` value, what `ps` shows next to the pid. */
export function vmNameFor(sandboxId: string): string {
  return `kata-ts-${shortIdKey(sandboxId)}`;
}

/**
 * The host directory a sandbox's virtiofsd shares with its guest (the guest sees it at
 * GUEST_SHARED_DIR, `/run/kata-ts/shared`). The sandbox layer owns the directory itself (created
 * 0700, a bind mount of itself with shared propagation, so that bind mounts added under it later
 * reach virtiofsd's mount namespace); containers' files go under `containers/<containerId>/`.
 */
export function sandboxSharedDir(stateDir: string, sandboxId: string): string {
  return path.join(sandboxWorkDir(stateDir, sandboxId), 'shared');
}

/**
 * A confined QEMU's own directory, `<workDir>/vmm`: owned by its identity (0700), holding what
 * QEMU creates or connects to (QMP, ready, agent and virtio-fs sockets, the guest console). The
 * work dir itself stays root's: a QEMU owning it could swap `shared` for a symlink the daemon
 * would then mount through.
 */
export function sandboxVmmDir(workDir: string): string {
  return path.join(workDir, 'vmm');
}

/** A confined QEMU's chroot, `<workDir>/jail` (src/runtime/sandbox/jail.ts). */
export function sandboxJailDir(workDir: string): string {
  return path.join(workDir, 'jail');
}

/**
 * Every path of a sandbox's VM: QMP, ready, console and QEMU log (vmPaths), plus the agent's
 * port socket and virtiofsd's socket (short: sun_path holds 107 bytes). Unconfined, all in the
 * work dir; `confined`, what QEMU itself opens is in the VMM dir (sandboxVmmDir), the logs the
 * daemon writes stay in the work dir.
 */
export function sandboxVmPaths(
  workDir: string,
  confined = false,
): VmPaths & { agentSocket: string; virtiofsSocket: string; virtiofsdLog: string } {
  const own = confined ? sandboxVmmDir(workDir) : workDir;
  return {
    ...vmPaths(own),
    qemuLog: path.join(workDir, 'qemu.log'),
    agentSocket: path.join(own, 'agent.sock'),
    virtiofsSocket: path.join(own, 'vfs.sock'),
    virtiofsdLog: path.join(workDir, 'virtiofsd.log'),
  };
}

/**
 * The sockets the QEMU argv names, as RunPodSandbox (and `kata-ts plan`) builds it: with a guest
 * image (which carries the agent) the VM gets the agent's port and virtio-fs; without one it runs
 * no containers and gets neither. `confined`: in the VMM dir (sandboxVmPaths).
 */
export function sandboxArgvPaths(workDir: string, hypervisor: Pick<HypervisorConfig, 'guestImagePath'>, confined = false): VmSocketPaths {
  const { agentSocket, virtiofsSocket, virtiofsdLog: _log, qemuLog: _qemuLog, ...paths } = sandboxVmPaths(workDir, confined);
  return hypervisor.guestImagePath === null ? paths : { ...paths, agentSocket, virtiofsSocket };
}

/**
 * A sandbox's TEE files (vtpm): OVMF's variable store copy in QEMU's own dir (the VMM dir when
 * confined, which QEMU's identity owns; the work dir otherwise), swtpm's state and log in
 * `<workDir>/tpm` (swtpm's own), and its control socket in `<workDir>/tpm-sock`, a dir swtpm
 * owns and QEMU's group may enter, bound into QEMU's jail at its own path.
 */
export function sandboxTeePaths(workDir: string, confined = false): SandboxTeePaths {
  const own = confined ? sandboxVmmDir(workDir) : workDir;
  return {
    ovmfVarsCopy: path.join(own, 'OVMF_VARS.fd'),
    tpmStateDir: path.join(workDir, 'tpm'),
    tpmSocket: path.join(sandboxTpmSocketDir(workDir), 'ctrl.sock'),
    tpmLog: path.join(workDir, 'swtpm.log'),
    // Root's, read-only to QEMU (bound into its jail at this path).
    initdata: path.join(workDir, 'initdata.toml'),
  };
}

/** The dir holding swtpm's control socket (see sandboxTeePaths). */
export function sandboxTpmSocketDir(workDir: string): string {
  return path.join(workDir, 'tpm-sock');
}

/** swtpm's chroot (src/tpm/swtpm.ts swtpmJailSpec, built like QEMU's): `<workDir>/tpm-jail`. */
export function sandboxTpmJailDir(workDir: string): string {
  return path.join(workDir, 'tpm-jail');
}
