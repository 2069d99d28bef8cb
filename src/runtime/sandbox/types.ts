/**
 * The sandbox floor's shared types, in a file of their own so that the manager, recovery, stop
 * and the floors above (resize, container) can name them without importing the manager: a type
 * import of the manager from a file it imports would close a circle.
 */
import type { AgentClient } from '../../agent-client/index.js';
import type { CgroupDriver, CgroupDriverName, PlacementRecord } from '../../cgroups/index.js';
import type { Logger } from '../../common/logger.js';
import type { VmProcess } from '../../hypervisor/index.js';
import type { RuntimeMetrics } from '../metrics.js';
import type { CreateDeps } from './create-types.js';
import type { SandboxRecord } from './record.js';

export interface SandboxManagerDeps extends CreateDeps {
  logger: Logger;
  metrics: RuntimeMetrics;
  /** A driver of the given name (for placements made under an earlier config); see cgroupsFor. */
  cgroupDriverNamed(name: CgroupDriverName): CgroupDriver;
  /** Told, under the sandbox's lock, when a sandbox stops or is removed (the container layer). */
  listener: SandboxListener;
}

/** A sandbox as the daemon holds it: its persisted record and, while it runs, its QEMU handle. */
export interface LiveSandbox {
  record: SandboxRecord;
  vm: VmProcess | undefined;
  /**
   * The guest agent's client: connected once the guest is up (RunPodSandbox), connected again
   * (a new session; the agent kept running) after a daemon restart; undefined when the VM is gone.
   * The connection re-dials by itself when a session drops; calls wait for it within their deadline.
   */
  agent: AgentClient | undefined;
  /** Set while StopPodSandbox brings the VM down, so its exit is not mistaken for a crash. */
  stopping: boolean;
}

/** What the layers above (containers) hear of a sandbox's lifecycle; given at construction. */
export interface SandboxListener {
  /**
   * Called under the sandbox's lock at the start of StopPodSandbox (and RemovePodSandbox's stop)
   * while the VM and its agent are still up, so that containers are stopped with their own
   * timeouts before the VM goes. Must settle within `deadlineMs` (a share of the stop deadline);
   * the VM is shut down afterwards whatever happened.
   */
  sandboxStopping(sandboxId: string, deadlineMs: number): Promise<void>;
  /** Called under the sandbox's lock after its VM is gone (stop, or death), before its record is saved. */
  sandboxStopped(sandboxId: string): Promise<void>;
  /** Called under the sandbox's lock before its record is deleted. */
  sandboxRemoving(sandboxId: string): Promise<void>;
}

/**
 * A sandbox held under its lock (see SandboxManager.withSandbox): the record to change, the VM,
 * and the one way to persist a change. Valid only inside the callback it was handed to.
 */
export interface SandboxHandle {
  readonly record: SandboxRecord;
  readonly vm: VmProcess | undefined;
  /** The guest agent's client (see LiveSandbox.agent). */
  readonly agent: AgentClient | undefined;
  /** Write the record as it is now (after a hot-plug, a resize). */
  persist(): Promise<void>;
  /** The cgroup driver that made `placement` (see cgroupsFor). */
  cgroupsFor(placement: PlacementRecord): CgroupDriver;
}

/** What the layers above need of the SandboxManager: find a sandbox to read, lock one to change it. */
export interface SandboxAccess {
  /** A visible sandbox by full id or unique prefix; undefined when there is none. */
  find(idOrPrefix: string): LiveSandbox | undefined;
  /** Run `fn` under the sandbox's lock (NOT_FOUND when it does not exist, or no longer). */
  withSandbox<T>(idOrPrefix: string, fn: (sandbox: SandboxHandle) => Promise<T>): Promise<T>;
  /** Run `fn` under the lock of sandbox `id`, handing it undefined when that sandbox does not exist. */
  withSandboxIfPresent<T>(id: string, fn: (sandbox: SandboxHandle | undefined) => Promise<T>): Promise<T>;
}

/**
 * Which sandboxes a listing wants, as any face asks it: unset parts do not filter. The id matches
 * a full id or a prefix of one (crictl prints short ids); the labels must all be present with
 * the same values.
 */
export interface SandboxFilter {
  idPrefix?: string;
  state?: SandboxRecord['state'];
  labels?: Record<string, string>;
}

/**
 * The driver that made a placement. New placements always use the advertised driver, but a
 * record made before the config changed driver must be resized and torn down by its own.
 */
export function cgroupsFor(deps: Pick<SandboxManagerDeps, 'cgroups' | 'cgroupDriverNamed'>, driver: CgroupDriverName): CgroupDriver {
  return driver === deps.cgroups.name ? deps.cgroups : deps.cgroupDriverNamed(driver);
}

/**
 * How a face asks for a sandbox beyond its spec. The CRI server sets none of these; the shim v2
 * face runs the pod containerd already named and attached to a network.
 */
export interface SandboxRunOptions {
  /**
   * The sandbox's id (containerd's pause container id); a new 64-hex one when absent. It must
   * follow containerd's identifier rule (letters and digits in runs separated by one `.`, `_` or
   * `-`, at most 76 characters: INVALID_ARGUMENT `SANDBOX_ID_INVALID` naming `id`) and name no
   * sandbox, also none being made (ALREADY_EXISTS `SANDBOX_ID_EXISTS`).
   */
  id?: string;
  /**
   * A network namespace the caller made and attached (containerd ran CNI ADD in it), by path: the
   * VM joins it with the same TAP + tc mirred wiring, and nothing of it but that wiring is made or
   * removed here (no namespace, no CNI ADD or DEL), whatever the configured network mode; the guest
   * is told what its `eth0` holds. A path in /run/netns or /var/run/netns is used by name
   * (`ip -n`), any other absolute path through `nsenter --net=`. Refused: a path that is not
   * absolute and normalised (INVALID_ARGUMENT), one that does not exist, is not a network
   * namespace, or has no `eth0` with an address (FAILED_PRECONDITION), each naming `joinNetns`.
   * Absent: the configured pod networking (CNI mode) or none. See docs/networking.md.
   */
  joinNetns?: string;
}
