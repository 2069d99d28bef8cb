/**
 * The container floor's shared types, in a file of their own so that CreateContainer, the
 * resource updates and the stats collector can name what they need of the manager without
 * importing it (a type import back into the manager would close a circle).
 */
import type { AgentClient } from '../../agent-client/index.js';
import type { Logger } from '../../common/logger.js';
import type { KataConfig } from '../../config/types.js';
import type { KubernetesResources__Output } from '../../generated/runtime/v1/KubernetesResources.js';
import type { LinuxContainerResources__Output } from '../../generated/runtime/v1/LinuxContainerResources.js';
import type { LinuxPodSandboxConfig__Output } from '../../generated/runtime/v1/LinuxPodSandboxConfig.js';
import type { RootfsSource } from '../../images/rootfs.js';
import type { GuestPod } from '../../oci/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { ResizePlan } from '../resize/index.js';
import type { SandboxRecord } from '../sandbox/record.js';
import type { SandboxAccess } from '../sandbox/types.js';
import type { SandboxSpec } from '../spec/sandbox.js';
import type { RecordStore } from '../store.js';
import type { ContainerRecord, ContainerState, ContainerStdio } from './record.js';

/** What the container layer needs of the image store. */
export interface ImageLookup {
  resolveImage(ref: string): { id: string; repoDigests: string[] } | undefined;
  /** What a container's root filesystem is made from: the image's layers (overlay) or its flat tree (copy). */
  rootfsSourceFor(imageId: string): RootfsSource;
  /** The image config's `config` object (User, Env, Entrypoint, Cmd, WorkingDir, StopSignal). */
  imageConfig(imageId: string): Promise<Record<string, unknown> | null>;
}

/** What the container layer needs of a sandbox's guest (the sandbox layer provides it). */
export interface SandboxGuestAccess {
  /** The agent of a sandbox whose VM runs; undefined otherwise. */
  agentOf(sandboxId: string): AgentClient | undefined;
  /** The sandbox's shared directory on the host (virtio-fs source). */
  sharedDirOf(sandboxId: string): string;
  /** The directory every sandbox's shared directory is under (the state dir's `vm/`). */
  sharedDirsRoot: string;
  /** Where the shared directory is in the guest. */
  guestSharedDir: string;
  /** The pod's namespaces holder and /dev/shm in the guest; null when the guest has none (no container can start). */
  guestPodOf(sandboxId: string): GuestPod | null;
}

export interface ContainerManagerDeps {
  config: KataConfig;
  logger: Logger;
  store: RecordStore<ContainerRecord>;
  sandboxes: SandboxAccess;
  images: ImageLookup;
  host: HostCapacity;
  readPcieFacts(): Promise<PcieHostFacts>;
  guests: SandboxGuestAccess;
}

/** The containers a sandbox holds, and the budget check for sandboxes sized without pod_resources. */
export interface ContainerLookup {
  /** A container by full id or unique prefix, or NOT_FOUND. */
  resolve(idOrPrefix: string): ContainerRecord;
  /** The containers a listing's filter lets through, oldest first. */
  list(filter: ContainerFilter | null): ContainerRecord[];
  inSandbox(sandboxId: string): ContainerRecord[];
  /** Does `incoming` fit beside `admitted`, or how must the VM grow (undefined: it fits as it is)? */
  growthFor(
    record: SandboxRecord,
    incoming: ContainerRecord['demand'],
    admitted: Array<ContainerRecord['demand']>,
    name: string,
  ): ResizePlan | undefined;
}

/**
 * Which containers a listing wants, as any face asks it: unset parts do not filter. Ids match a
 * full id or a prefix; the labels must all be present with the same values.
 */
export interface ContainerFilter {
  idPrefix?: string;
  sandboxIdPrefix?: string;
  /** CONTAINER_UNKNOWN is a state no record is in: it matches none. */
  state?: ContainerState | 'CONTAINER_UNKNOWN';
  labels?: Record<string, string>;
}

/** A container's new resources (in-place resize): a part left null stays as it is. */
export interface ContainerResourceUpdate {
  linux: LinuxContainerResources__Output | null;
  kubernetes_resources: KubernetesResources__Output | null;
}

/** A pod's new resources (in-place resize): a part left null (or an empty pod_resources) stays as it is. */
export interface SandboxResourceUpdate {
  resources: LinuxPodSandboxConfig__Output['resources'];
  overhead: LinuxPodSandboxConfig__Output['overhead'];
  pod_resources: SandboxSpec['pod_resources'];
}

/**
 * How a face asks for a container beyond its spec. The CRI server sets none of these; the shim
 * v2 face passes containerd's container id, the rootfs containerd's snapshotter prepared and the
 * FIFOs containerd reads.
 */
export interface ContainerCreateOptions {
  /** The container's id (containerd's); a new one when absent. */
  id?: string;
  /**
   * A root filesystem the caller prepared and owns (mounted at `<bundle>/rootfs`): shared into the
   * guest as it is, never copied, never removed; no image is looked up (the spec's image is a name only).
   */
  rootfs?: string;
  /** Default: the CRI log. */
  stdio?: ContainerStdio;
  /**
   * The caller's container manager (containerd, CRI-O) already admitted this privileged container,
   * which it does only in a privileged pod, while the pod's spec could not say so (containerd's
   * pause config does not): the pod counts as privileged for this container. Default false: the
   * core checks the pod's own flag (the standalone CRI door, where the core is the manager).
   */
  podPrivilegeCheckedByCaller?: boolean;
}
