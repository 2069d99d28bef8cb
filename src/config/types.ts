import type { LogLevel } from '../common/logger.js';

/** How the VMM's cgroup is managed; `auto` detects (systemd when /run/systemd/system exists). */
export type CgroupDriverSetting = 'auto' | 'systemd' | 'cgroupfs';
export type CgroupDriverName = 'systemd' | 'cgroupfs';
export type AccelerationSetting = 'auto' | 'kvm' | 'tcg';

/** Where VFIO devices go: attached at boot, or onto ports reserved at boot and attached later. */
export type VfioPlugPolicy = 'cold-plug' | 'hot-plug';
/** PCIe port flavour: a pcie-root-port on the root bus, or a downstream port behind an x3130 switch. */
export type PciePortType = 'root-port' | 'switch-port';

export interface CpuMemory {
  cpuMillicores: number;
  memoryMiB: number;
}

export interface HandlerVmConfig {
  /** vCPUs of a pod that asks for nothing. */
  defaultVcpus: number;
  /** Memory of a pod that asks for nothing. */
  defaultMemoryMiB: number;
  /** No VM boots with less, whatever the pod asks. */
  minMemoryMiB: number;
  /** The handler's ceiling for one VM (further bounded by the host). */
  maxVcpus: number;
  maxMemoryMiB: number;
  /** Room planned at boot for later growth (CPU hot-plug, virtio-mem); 0 for static VMs. */
  hotplugVcpus: number;
  hotplugMemoryMiB: number;
  /**
   * Free page reporting: a virtio-balloon device with `free-page-reporting=on` through which the
   * guest kernel hands memory it freed back to the host, so an idle VM's host memory falls after a
   * burst instead of staying at its high-water mark. The balloon is never inflated. Must be off
   * for a confidential handler (a host discarding private guest pages breaks the guest's memory).
   */
  freePageReporting: boolean;
}

export interface HandlerPcieConfig {
  vfioPolicy: VfioPlugPolicy;
  portType: PciePortType;
  /** Hot-plug ports reserved beyond those of the announced devices. */
  sparePorts: number;
  /** Lower bound for a hot-plug port's 64-bit prefetchable window. */
  pref64ReserveFloorMiB: number;
  /** Lower bound for a hot-plug port's 32-bit memory window. */
  memReserveFloorMiB: number;
}

/**
 * How a handler's QEMU is confined (docs/security.md#the-vmm-jail). Both are on by default; turning
 * either off needs `optOutReason`, which is logged at every RunPodSandbox and shown by `plan`.
 */
export interface VmmConfinementConfig {
  /** QEMU's own seccomp filter (`-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny`). */
  seccomp: boolean;
  /**
   * QEMU runs as a uid/gid of its own (hypervisor.vmmIdentities), with no capabilities and
   * no_new_privs, chrooted into a jail holding /usr (read only), its own device nodes and its
   * pod's files. Off: QEMU runs as root with every capability and sees the host (as before).
   */
  unprivileged: boolean;
  /** Why this handler turns something off; null when nothing is. */
  optOutReason: string | null;
}

/**
 * The trusted execution environment a handler's VMs get (docs/confidential.md):
 * - `none`: an ordinary VM (SeaBIOS, no TPM, nothing measured);
 * - `vtpm`: OVMF and a software TPM (swtpm) per pod: a measured boot on any host, no memory encryption;
 * - `snp` / `tdx`: AMD SEV-SNP or Intel TDX guests (QEMU >= 9.1 / >= 10.1 and the hardware);
 * - `auto`: `snp` or `tdx` where the host offers one, `vtpm` elsewhere (resolved once at start).
 */
export type TeeKindSetting = 'auto' | 'none' | 'vtpm' | 'snp' | 'tdx';
/** A TEE kind once `auto` is resolved against the host. */
export type TeeKind = Exclude<TeeKindSetting, 'auto'>;

export interface HandlerTeeConfig {
  kind: TeeKindSetting;
}

export interface HandlerProfile {
  /** Confidential VMs are sized once and never reconfigured after boot. */
  confidential: boolean;
  /** What TEE the handler's VMs get (HandlerTeeConfig); only a confidential handler may have one. */
  tee: HandlerTeeConfig;
  description: string;
  vm: HandlerVmConfig;
  /** What the guest kernel and agent consume inside the VM, added to the workload. */
  guestOverhead: CpuMemory;
  /** What QEMU itself consumes on the host, added to the VMM's cgroup budget. */
  vmmOverhead: CpuMemory;
  pcie: HandlerPcieConfig;
  vmmConfinement: VmmConfinementConfig;
}

/** The firmware images of the TEE profiles (HandlerTeeConfig); read only when a handler uses them. */
export interface FirmwareConfig {
  /** `vtpm`: OVMF's code, mapped read-only as the first pflash unit (Debian's 4 MiB non-secboot build). */
  ovmfCodePath: string;
  /** `vtpm`: the variable store template, copied per pod (the copy is the second, writable pflash unit). */
  ovmfVarsPath: string;
  /** `snp`: OVMF built for SEV (`-bios`, package ovmf-amdsev). */
  snpFirmwarePath: string;
  /** `tdx`: OVMF built for TDX (`-bios`, package ovmf-inteltdx). */
  tdxFirmwarePath: string;
}

/** The per-pod software TPM of the `vtpm` profile (src/tpm/swtpm.ts). */
export interface TpmConfig {
  swtpmBinary: string;
  swtpmSetupBinary: string;
  /** The node's EK CA (`kata-ts tpm-ca`), which signs each pod TPM's EK certificate. */
  caDir: string;
}

export interface HypervisorConfig {
  qemuBinary: string;
  acceleration: AccelerationSetting;
  kernelPath: string;
  initrdPath: string;
  /**
   * The read-only guest image (node, crun, the agent) attached as a virtio-blk disk and mounted at
   * the guest's /usr; null = none (the initramfs is the whole guest, no containers can run).
   */
  guestImagePath: string | null;
  /** The vhost-user virtio-fs daemon started per sandbox to share its directory with the guest. */
  virtiofsdBinary: string;
  /** Extra guest kernel command-line parameters. */
  kernelParams: string[];
  readyTimeoutMs: number;
  stopTimeoutMs: number;
  qmpTimeoutMs: number;
  /** How the host checks that a guest's agent still answers (AgentKeepaliveConfig). */
  agentKeepalive: AgentKeepaliveConfig;
  /**
   * Under TCG, the size of QEMU's translated-code cache (`-accel tcg,tb-size=`). QEMU's own default
   * is 1 GiB, filled as the guest runs, which a VMM cgroup sized for KVM cannot hold; it is bounded
   * here and counted in the VMM's memory budget. Unused under KVM.
   */
  tcgTranslationCacheMiB: number;
  /** The uids/gids confined QEMUs run as, one per pod (see VmmIdentityConfig). */
  vmmIdentities: VmmIdentityConfig;
  /**
   * Tasks (processes and threads) the VMM's cgroup may hold beyond one per vCPU the VM may grow to
   * and one per iothread: pids.max = maxVcpus + iothreads + this (src/cgroups/limits.ts vmmPidsMax).
   */
  vmmPidsMargin: number;
  /** Firmware of the TEE profiles. */
  firmware: FirmwareConfig;
  /** The `vtpm` profile's software TPM. */
  tpm: TpmConfig;
}

/**
 * The agent connection's keepalive (src/agent-client/connection.ts): a PING every `intervalMs`
 * (0: none), each answered within the same time or missed; `misses` missed in a row end the
 * session and the host reconnects (idempotent calls in flight are sent again). A loaded TCG host
 * can leave a healthy guest unscheduled for longer than one interval: raise `misses` there.
 */
export interface AgentKeepaliveConfig {
  intervalMs: number;
  misses: number;
}

/**
 * The range a confined QEMU's identity is taken from: uid = gid = one number in
 * [firstId, firstId + count), free while no sandbox record holds it. A lease file per number in
 * `leaseDir` (node-wide: the daemon and every shim share it) names the record holding it.
 */
export interface VmmIdentityConfig {
  firstId: number;
  count: number;
  leaseDir: string;
  /**
   * How long a released identity rests before it is handed out again, on top of the checks that
   * no process, SysV IPC object or lease of it is left (src/runtime/sandbox/identities.ts).
   */
  quarantineMs: number;
}

export interface PcieHostConfig {
  sysfsRoot: string;
  devRoot: string;
  cdiSpecDirs: string[];
  /** The kubelet PodResources API socket, consulted when a pod brings no pod_resources; null = off. */
  podResourcesSocket: string | null;
  /**
   * Device numbers of the nodes under devRoot, as a JSON file, for a devRoot that is not a real
   * /dev (a fixture tree); null = stat the nodes.
   */
  devNumbersFile: string | null;
  /**
   * For hosts without VFIO hardware only: attach this emulated PCIe device model (e.g. `e1000e`)
   * wherever a vfio-pci function would go, at boot and by hot-plug, so that planning, ports and
   * QMP commands run unchanged. null (the default) = real vfio-pci.
   */
  simulateVfioWith: string | null;
}

export interface ImageConfig {
  /** Registry settings file (mirrors, plain-HTTP registries); null = none. */
  registriesConfigPath: string | null;
}

/**
 * Pod networking through CNI: `cni` runs the node's CNI configuration in a network namespace per
 * pod and joins the VM's NIC to it; `none` gives pod VMs no NIC at all (loopback only).
 */
export type NetworkMode = 'cni' | 'none';

export interface NetworkConfig {
  mode: NetworkMode;
  /** Where the CNI network configuration lives; the first file in lexical order is used (as the kubelet's runtimes do). */
  cniConfDir: string;
  /** Where CNI plugin binaries are looked up, first match wins (CNI_PATH). */
  cniBinDirs: string[];
  /** Per-plugin CNI ADD/DEL deadline. */
  cniTimeoutMs: number;
}

/** The streaming server behind Exec, Attach and PortForward (src/cri/streaming). */
export interface StreamingConfig {
  /** `host:port` it listens on; port 0 picks a free port (reported in verbose Status). */
  address: string;
  /** PEM certificate and key for TLS; both null (the default) serve plain HTTP. */
  tlsCertPath: string | null;
  tlsKeyPath: string | null;
  /** How long a streaming URL's token stays valid (single use). */
  tokenTtlMs: number;
  /** Tokens outstanding at most; more requests are refused with RESOURCE_EXHAUSTED. */
  maxTokensInFlight: number;
  /** How long a client has to open every stream of an exec or attach after upgrading. */
  streamCreationTimeoutMs: number;
  /** A stream connection with no byte either way for this long is closed (its exec is killed). */
  streamIdleTimeoutMs: number;
}

/** The containerd shim v2 binary (`containerd-shim-kata-ts-v2`, src/shim): one process per pod. */
export interface ShimConfig {
  /**
   * Where the shims keep their sockets (`s/<sha256>`) and each pod's state (`<namespace>/<id:16>/`:
   * its records, VM work dirs and `shim.json`). A tmpfs (`/run`) by default: like containerd's own
   * state, it does not outlive a reboot, and neither do the pods.
   */
  stateRoot: string;
  /**
   * Which processes serve the pods (docs/shim.md "Shim modes"): `pod`, a Node `serve` process per
   * pod; `node`, one node shim server per (stateRoot, containerd address) hosting every pod, and a
   * small relay per pod that containerd talks to.
   */
  mode: ShimMode;
}

/** `pod`: a shim process per pod; `node`: one node server for every pod, a relay per pod. */
export type ShimMode = 'node' | 'pod';

export interface KataConfig {
  socketPath: string;
  stateDir: string;
  /**
   * The file the runtime's own mount namespace is bound at (docs/architecture.md, "The runtime's
   * mount namespace"): `kata-ts serve` and the shim run in it, so their mounts stay out of the
   * host's mount table. Its directory is the runtime's: made a private mount of itself. Null: the
   * programs make their mounts in the namespace they are started in.
   */
  mountNamespacePath: string | null;
  logLevel: LogLevel;
  /** `host:port` for the Prometheus endpoint, loopback by default; null disables it. */
  metricsAddress: string | null;
  cgroupDriver: CgroupDriverSetting;
  cgroupRoot: string;
  /** D-Bus address of the systemd manager; null means the system bus. */
  dbusAddress: string | null;
  /** The directory whose presence means "systemd runs this host" (for driver detection). */
  systemdRuntimeDir: string;
  hypervisor: HypervisorConfig;
  pcie: PcieHostConfig;
  images: ImageConfig;
  network: NetworkConfig;
  streaming: StreamingConfig;
  shim: ShimConfig;
  defaultHandler: string;
  handlers: Record<string, HandlerProfile>;
  pool: PoolConfig;
  templates: TemplatesConfig;
}

/**
 * VM templates (docs/templates.md): the handlers whose pods start as clones of a template VM,
 * opt-in because clones of one template share memory pages (a side channel between the pods of
 * different tenants). A confidential handler never clones; a confined one cannot on QEMU 7.2.
 */
export interface TemplatesConfig {
  /** Handler names whose pods are cloned from the handler's template when they fit. */
  handlers: string[];
  /** On a memory file system, owned by the daemon's user and closed to others: the templates' directories. */
  root: string;
}

/**
 * Pre-booted VMs (docs/pool.md): how many each handler keeps ready, and the CPU weight the
 * refill's boots get (cgroup v1 cpu.shares of the pool's own cgroup; running pods get 1024).
 * A confidential handler is never pooled.
 */
export interface PoolConfig {
  /** Handler name -> pooled VMs kept ready (0 or absent: none). */
  sizes: Record<string, number>;
  /**
   * The pool's cgroup, under which every pooled VM's QEMU is placed (`kata-ts-<pool VM id>`) until
   * it is claimed, in the advertised driver's style: a cgroupfs path (`/kata-ts-pool`) or a bare
   * systemd slice (`kata_ts_pool.slice`). Its last level is kata-ts's: made when missing and
   * given `cpuShares`. null: the driver's default (DEFAULT_POOL_CGROUP_PARENT).
   */
  cgroupParent: string | null;
  /** cpu.shares of the pool's cgroup and of each pooled VM's (cgroup v2: cpu.weight by sharesToWeight). */
  cpuShares: number;
  /**
   * How long a claim may take (at most hypervisor.readyTimeoutMs) before it is abandoned and the
   * pod boots cold, so a pooled VM that stalls costs a pod this much, not a whole ready budget.
   */
  claimTimeoutMs: number;
}

/** A config together with where it came from, as reported by Status and `doctor`. */
export interface LoadedConfig {
  config: KataConfig;
  /** The file read, or null when only built-in defaults apply. */
  path: string | null;
}
