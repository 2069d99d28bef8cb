import type { CgroupDriverName, HandlerProfile, KataConfig, PoolConfig } from './types.js';

export const DEFAULT_CONFIG_PATH = '/etc/kata-ts/config.json';
export const DEFAULT_SOCKET_PATH = '/run/kata-ts/kata-ts.sock';
export const DEFAULT_STATE_DIR = '/var/lib/kata-ts';
/** Where `scripts/setup.sh` puts the guest kernel and initramfs it builds. */
export const DEFAULT_GUEST_DIR = '/usr/local/share/kata-ts/guest';
/** Where the shim binary keeps its sockets and its pods' state (see ShimConfig). */
export const DEFAULT_SHIM_STATE_ROOT = '/run/kata-ts/shim';
/** Where the runtime's mount namespace is bound (a tmpfs: a reboot ends the namespace anyway). */
export const DEFAULT_MOUNT_NAMESPACE_PATH = '/run/kata-ts/ns/mnt';
export const DEFAULT_HANDLER = 'kata-ts';
/**
 * Confined QEMUs' uids and gids: far above the ranges distributions hand out to accounts (below
 * 60000) and to /etc/subuid (100000 upwards in steps of 65536 for the first users).
 */
export const DEFAULT_VMM_FIRST_ID = 2_000_000_000;
export const DEFAULT_VMM_ID_COUNT = 65_536;
/** Node-wide (the daemon and every shim): the leases of the identities in use. */
export const DEFAULT_VMM_LEASE_DIR = '/var/lib/kata-ts/vmm-identities';
/**
 * A released identity rests this long (and until nothing of it is left) before reuse: long enough
 * for a killed QEMU's last threads and a shim's late clean-up to be gone, short against the range.
 */
export const DEFAULT_VMM_QUARANTINE_MS = 30_000;
/**
 * Tasks beyond vCPUs and iothreads in a VMM's cgroup (pids.max). Measured and counted in
 * src/cgroups/limits.ts (VMM_PIDS_MARGIN_PARTS): QEMU's fixed threads, its AIO worker pool, the
 * C virtiofsd placed beside it with its thread pool, and the launch helpers.
 */
export const DEFAULT_VMM_PIDS_MARGIN = 192;
export const CONFIDENTIAL_HANDLER = 'kata-ts-cvm';
/**
 * Debian's firmware builds: OVMF's 4 MiB non-secboot code and vars (package ovmf), the SEV build
 * (package ovmf-amdsev) and the TDX build (package ovmf-inteltdx; sid ships only the `.ms` image,
 * Secure Boot on with Microsoft's keys; trixie has neither SNP nor TDX firmware).
 */
export const DEFAULT_FIRMWARE = {
  ovmfCodePath: '/usr/share/OVMF/OVMF_CODE_4M.fd',
  ovmfVarsPath: '/usr/share/OVMF/OVMF_VARS_4M.fd',
  snpFirmwarePath: '/usr/share/ovmf/OVMF.amdsev.fd',
  tdxFirmwarePath: '/usr/share/ovmf/OVMF.inteltdx.ms.fd',
} as const;
/** Debian's swtpm packages, and the node's EK CA made by setup (`kata-ts tpm-ca`). */
export const DEFAULT_TPM = {
  swtpmBinary: '/usr/bin/swtpm',
  swtpmSetupBinary: '/usr/bin/swtpm_setup',
  caDir: '/var/lib/kata-ts/tpm-ca',
} as const;
/**
 * The pool's cgroup (pool.cgroupParent null) per cgroup driver: beside the kubelet's `kubepods`
 * at the top of the hierarchy, where its low weight counts against all pods together.
 * The slice has no "-" in its name: a dash would nest it under another slice.
 */
export const DEFAULT_POOL_CGROUP_PARENT = { cgroupfs: '/kata-ts-pool', systemd: 'kata_ts_pool.slice' } as const;
/** The pool's CPU weight: the kernel's least cpu.shares (cgroup v2 cpu.weight 1); a pod gets 1024 per CPU requested. */
export const DEFAULT_POOL_CPU_SHARES = 2;

/**
 * Where VM templates live (docs/templates.md): a directory on a memory file system (the guest RAM
 * files clones map must not be paged through a disk); /dev/shm is tmpfs on every Linux node.
 */
export const DEFAULT_TEMPLATE_ROOT = '/dev/shm/kata-ts-templates';
/** The pool's cgroup for a driver: the configured one, else that driver's default. */
export function poolCgroupParent(pool: Pick<PoolConfig, 'cgroupParent'>, driver: CgroupDriverName): string {
  return pool.cgroupParent ?? DEFAULT_POOL_CGROUP_PARENT[driver];
}

/** The general-purpose profile: grows by CPU and memory hot-plug, VFIO devices hot-plugged. */
export function defaultHandlerProfile(): HandlerProfile {
  return {
    confidential: false,
    description: 'General-purpose VM: hot-plug capable, grows within planned headroom',
    vm: {
      defaultVcpus: 1,
      defaultMemoryMiB: 512,
      minMemoryMiB: 256,
      maxVcpus: 32,
      maxMemoryMiB: 65536,
      hotplugVcpus: 4,
      hotplugMemoryMiB: 4096,
      freePageReporting: true,
    },
    guestOverhead: { cpuMillicores: 250, memoryMiB: 160 },
    vmmOverhead: { cpuMillicores: 100, memoryMiB: 96 },
    pcie: {
      vfioPolicy: 'hot-plug',
      portType: 'root-port',
      sparePorts: 2,
      pref64ReserveFloorMiB: 256,
      memReserveFloorMiB: 16,
    },
    vmmConfinement: { seccomp: true, unprivileged: true, optOutReason: null },
    tee: { kind: 'none' },
  };
}

/** The confidential profile: sized once at boot, devices cold-plugged, never reconfigured. */
export function confidentialHandlerProfile(): HandlerProfile {
  const base = defaultHandlerProfile();
  return {
    ...base,
    confidential: true,
    description: 'Confidential VM: static size, cold-plug only, no reconfiguration after boot',
    tee: { kind: 'auto' },
    // No free page reporting: the host would discard pages that are private (encrypted, validated)
    // to the guest, which the guest kernel does not validate again before reusing them.
    vm: { ...base.vm, hotplugVcpus: 0, hotplugMemoryMiB: 0, freePageReporting: false },
    pcie: { ...base.pcie, vfioPolicy: 'cold-plug', sparePorts: 0 },
  };
}

/** Built-in defaults: `kata-ts serve` runs with no config file at all. */
export function defaultConfig(): KataConfig {
  return {
    socketPath: DEFAULT_SOCKET_PATH,
    stateDir: DEFAULT_STATE_DIR,
    mountNamespacePath: DEFAULT_MOUNT_NAMESPACE_PATH,
    logLevel: 'info',
    metricsAddress: '127.0.0.1:9464',
    cgroupDriver: 'auto',
    cgroupRoot: '/sys/fs/cgroup',
    dbusAddress: null,
    systemdRuntimeDir: '/run/systemd/system',
    hypervisor: {
      qemuBinary: 'qemu-system-x86_64',
      acceleration: 'auto',
      kernelPath: `${DEFAULT_GUEST_DIR}/vmlinuz`,
      initrdPath: `${DEFAULT_GUEST_DIR}/initramfs.cpio.gz`,
      guestImagePath: `${DEFAULT_GUEST_DIR}/guest.img`,
      // Debian's QEMU 7.2 ships the C virtiofsd here (package qemu-system-common).
      virtiofsdBinary: '/usr/lib/qemu/virtiofsd',
      kernelParams: [],
      readyTimeoutMs: 90_000,
      stopTimeoutMs: 10_000,
      qmpTimeoutMs: 10_000,
      agentKeepalive: { intervalMs: 10_000, misses: 3 },
      tcgTranslationCacheMiB: 64,
      vmmIdentities: {
        firstId: DEFAULT_VMM_FIRST_ID,
        count: DEFAULT_VMM_ID_COUNT,
        leaseDir: DEFAULT_VMM_LEASE_DIR,
        quarantineMs: DEFAULT_VMM_QUARANTINE_MS,
      },
      vmmPidsMargin: DEFAULT_VMM_PIDS_MARGIN,
      firmware: { ...DEFAULT_FIRMWARE },
      tpm: { ...DEFAULT_TPM },
    },
    pcie: {
      sysfsRoot: '/sys',
      devRoot: '/dev',
      cdiSpecDirs: ['/etc/cdi', '/var/run/cdi'],
      podResourcesSocket: null,
      devNumbersFile: null,
      simulateVfioWith: null,
    },
    images: { registriesConfigPath: null },
    // The standard CNI layout, then where Debian's containernetworking-plugins installs them.
    network: { mode: 'cni', cniConfDir: '/etc/cni/net.d', cniBinDirs: ['/opt/cni/bin', '/usr/lib/cni'], cniTimeoutMs: 30_000 },
    streaming: {
      address: '127.0.0.1:0',
      tlsCertPath: null,
      tlsKeyPath: null,
      tokenTtlMs: 60_000,
      maxTokensInFlight: 1000,
      streamCreationTimeoutMs: 30_000,
      // containerd's stream_idle_timeout and the kubelet's streaming default: 4 hours.
      streamIdleTimeoutMs: 4 * 60 * 60 * 1000,
    },
    shim: { stateRoot: DEFAULT_SHIM_STATE_ROOT, mode: 'pod' },
    defaultHandler: DEFAULT_HANDLER,
    handlers: {
      [DEFAULT_HANDLER]: defaultHandlerProfile(),
      [CONFIDENTIAL_HANDLER]: confidentialHandlerProfile(),
    },
    pool: { sizes: {}, cgroupParent: null, cpuShares: DEFAULT_POOL_CPU_SHARES, claimTimeoutMs: 30_000 },
    templates: { handlers: [], root: DEFAULT_TEMPLATE_ROOT },
  };
}
