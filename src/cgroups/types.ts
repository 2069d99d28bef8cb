import type { Logger } from '../common/logger.js';
import type { CgroupDriverName } from '../config/types.js';

export type { CgroupDriverName };

/**
 * How the host mounts cgroups: `v2` (one cgroup2 hierarchy at the root), `v1` (one hierarchy per
 * controller, tmpfs at the root) or `hybrid` (v1 controllers plus an empty cgroup2 at `unified`,
 * which systemd uses for process tracking).
 */
export type CgroupMode = 'v1' | 'v2' | 'hybrid';

/**
 * What the VMM's cgroup is limited to. Same field names as `HostBudget` in src/sizing/types.ts so
 * that a budget can be passed as is.
 */
export interface VmmLimits {
  /** CPU limit; 0 means no CFS quota at all. */
  cpuQuotaMillicores: number;
  /** CPU request, converted to cpu.shares / cpu.weight the way the kubelet does. */
  cpuRequestMillicores: number;
  /** Memory limit; 0 means no limit. */
  memoryLimitBytes: number;
}

/**
 * Where a sandbox's VMM was placed, persisted with the sandbox so that teardown, resize and
 * recovery after a restart need nothing but this record.
 */
export interface PlacementRecord {
  driver: CgroupDriverName;
  /** The cgroup_parent as the kubelet sent it ('' when none). */
  cgroupParent: string;
  /** The cgroup layout the placement was made under. */
  mode: CgroupMode;
  /** systemd driver: the transient scope, `kata-ts-<sandbox id>.scope`. */
  unit?: string;
  /** systemd driver: the slice the scope lives in, as systemd reports it. */
  slice?: string;
  /**
   * Hierarchy key -> absolute directory holding the VMM. Keys are the hierarchy's controllers
   * joined by ',' (`cpu`, `memory`, `cpu,cpuacct`), `systemd` for the named hierarchy and
   * `unified` for cgroup2.
   */
  paths: Record<string, string>;
  /**
   * cgroupfs driver: ancestors of the VMM's directories that did not exist and were created by
   * this placement, top-down, so that teardown removes exactly those (deepest first).
   */
  createdParents?: string[];
  limits: VmmLimits;
  /**
   * The pids.max written (systemd: TasksMax set); absent when none was asked for, or the pids
   * controller is not available where the VMM was placed (logged as a warning then).
   */
  pidsMax?: number;
}

export interface PlaceRequest {
  sandboxId: string;
  cgroupParent: string;
  /** The VMM's pid, still paused (`-S`), as seen in this process's pid namespace. */
  pid: number;
  /**
   * The sandbox's other host processes that share the VMM's budget (virtiofsd), placed in the
   * same cgroup together with it; same namespace rule as `pid`.
   */
  extraPids?: number[];
  limits: VmmLimits;
  /**
   * Tasks the VMM's cgroup may hold (pids.max, systemd TasksMax): vmmPidsMax() of the VM's
   * maximum vCPUs. Unset: no limit of kata-ts's (the parent's still applies).
   */
  pidsMax?: number;
  /**
   * The pool's cgroup (docs/pool.md): the CPU weight of the parent's last level, which kata-ts
   * then owns (made when missing, or already made by an earlier placement of the pool): cgroupfs
   * writes its cpu.shares (v2: cpu.weight by sharesToWeight); systemd sets the slice's CPUShares
   * (v2: CPUWeight). The parent must then name a level of its own (not the root). Unset for pods.
   */
  parentCpuShares?: number;
}

/** One interface, two implementations chosen by name (see createCgroupDriver). */
export interface CgroupDriver {
  readonly name: CgroupDriverName;
  /** Throws FAILED_PRECONDITION naming both styles when the parent is of the other driver's style. */
  validateParent(cgroupParent: string): void;
  place(req: PlaceRequest): Promise<PlacementRecord>;
  /** Resize: writes (or asks systemd to apply) new limits; returns the updated record. */
  update(record: PlacementRecord, limits: VmmLimits): Promise<PlacementRecord>;
  /** Idempotent; called after the VMM process is gone. */
  remove(record: PlacementRecord): Promise<void>;
  /**
   * The record a placement of this sandbox under this parent has (or would have), for cleaning up
   * after a crash that came between placing the VMM and recording the placement: pass it to
   * remove(). Parents are never listed as created here, since nothing proves who created them.
   */
  placementFor(sandboxId: string, cgroupParent: string): Promise<PlacementRecord>;
  /** Flat strings for PodSandboxStatus verbose info. */
  describe(record: PlacementRecord): Record<string, string>;
}

export interface CgroupDriverOptions {
  /** The cgroup mount root (`/sys/fs/cgroup`); tests pass a private tree. */
  cgroupRoot: string;
  /** systemd driver: D-Bus address of the manager; null means the system bus. */
  dbusAddress: string | null;
  logger: Logger;
  /** systemd driver: how long to wait for the bus and for a job; 30 s by default. */
  timeoutMs?: number;
  /** Overrides detection (statfs of cgroupRoot); tests of the v2 layout on a directory tree use it. */
  mode?: CgroupMode;
  /** cgroupfs driver: the file operations; the real kernel interface by default. */
  fs?: CgroupFs;
}

/**
 * The few file operations the cgroupfs driver performs. The real one (fsops.ts) talks to the
 * kernel; unit tests of the v2 layout pass one that imitates cgroup2 on a plain directory tree,
 * because this kind of machine has no cgroup2 hierarchy with controllers to write for real.
 */
export interface CgroupFs {
  /** Creates one directory (not recursive); rejects with EEXIST when it is there. */
  mkdir(dir: string): Promise<void>;
  /** Removes one empty cgroup directory (the kernel allows it despite its interface files). */
  rmdir(dir: string): Promise<void>;
  readFile(file: string): Promise<string>;
  /** Writes an existing interface file in one write(2), never creating it. */
  writeFile(file: string, value: string): Promise<void>;
  realpath(p: string): Promise<string>;
  /** The filesystem magic of the mount holding `p` (statfs f_type). */
  fsMagic(p: string): Promise<number>;
}
