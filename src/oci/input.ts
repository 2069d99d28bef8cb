/**
 * What `buildOciSpec` reads. The container and sandbox parts use the CRI's own field names
 * (snake_case, int64 as decimal strings, enums by name, as proto-loader decodes them), so a
 * decoded `ContainerConfig` / `PodSandboxConfig`, or any typed spec of the same shape, satisfies
 * them structurally. Everything is optional where the CRI leaves it unset; `null` is accepted
 * wherever proto-loader produces it for an unset message.
 */
import type { OciLinuxDevice } from './spec-types.js';

export type NamespaceModeName = 'POD' | 'CONTAINER' | 'NODE' | 'TARGET';
export type ProfileTypeName = 'RuntimeDefault' | 'Unconfined' | 'Localhost';

export interface OciKeyValue {
  key: string;
  value: string;
}

/** CRI `Mount`: host_path is not read (the guest sees the source at `guest.mountSources`). */
export interface OciMountInput {
  container_path: string;
  host_path?: string;
  readonly?: boolean;
  selinux_relabel?: boolean;
  propagation?: 'PROPAGATION_PRIVATE' | 'PROPAGATION_HOST_TO_CONTAINER' | 'PROPAGATION_BIDIRECTIONAL';
  uidMappings?: readonly unknown[];
  gidMappings?: readonly unknown[];
  recursive_read_only?: boolean;
  image?: { image?: string } | null;
}

export interface OciDeviceInput {
  container_path: string;
  host_path?: string;
  permissions?: string;
}

export interface OciSecurityProfileInput {
  profile_type?: ProfileTypeName;
  localhost_ref?: string;
}

export interface OciNamespaceOptionsInput {
  network?: NamespaceModeName;
  pid?: NamespaceModeName;
  ipc?: NamespaceModeName;
  target_id?: string;
  userns_options?: { mode?: NamespaceModeName } | null;
}

export interface OciSelinuxInput {
  user?: string;
  role?: string;
  type?: string;
  level?: string;
}

/** CRI `LinuxContainerSecurityContext`. */
export interface OciContainerSecurityInput {
  capabilities?: {
    add_capabilities?: readonly string[];
    drop_capabilities?: readonly string[];
    add_ambient_capabilities?: readonly string[];
  } | null;
  privileged?: boolean;
  namespace_options?: OciNamespaceOptionsInput | null;
  selinux_options?: OciSelinuxInput | null;
  run_as_user?: { value: string } | null;
  run_as_group?: { value: string } | null;
  run_as_username?: string;
  readonly_rootfs?: boolean;
  supplemental_groups?: readonly string[];
  supplemental_groups_policy?: 'Merge' | 'Strict';
  apparmor_profile?: string;
  apparmor?: OciSecurityProfileInput | null;
  seccomp_profile_path?: string;
  seccomp?: OciSecurityProfileInput | null;
  no_new_privs?: boolean;
  /**
   * undefined or null: the default masked paths. An empty list: none (the kubelet's Unmasked
   * procMount). proto3 cannot tell an empty repeated field from an absent one, so the caller
   * decides which of the two an empty CRI field means.
   */
  masked_paths?: readonly string[] | null;
  /** As `masked_paths`. */
  readonly_paths?: readonly string[] | null;
}

/** CRI `LinuxContainerResources` (int64 fields as decimal strings, "0"/"" = unset). */
export interface OciResourcesInput {
  cpu_period?: string;
  cpu_quota?: string;
  cpu_shares?: string;
  memory_limit_in_bytes?: string;
  oom_score_adj?: string;
  cpuset_cpus?: string;
  cpuset_mems?: string;
  hugepage_limits?: readonly { page_size: string; limit: string }[];
  unified?: Readonly<Record<string, string>>;
  memory_swap_limit_in_bytes?: string;
}

/** CRI `ContainerConfig`, the fields a config.json is made of. */
export interface OciContainerInput {
  command?: readonly string[];
  args?: readonly string[];
  working_dir?: string;
  envs?: readonly OciKeyValue[];
  mounts?: readonly OciMountInput[];
  devices?: readonly OciDeviceInput[];
  annotations?: Readonly<Record<string, string>>;
  tty?: boolean;
  stdin?: boolean;
  stdin_once?: boolean;
  stop_signal?: string;
  linux?: {
    resources?: OciResourcesInput | null;
    security_context?: OciContainerSecurityInput | null;
  } | null;
}

/** CRI `PodSandboxConfig`, the fields every container of the pod inherits. */
export interface OciSandboxInput {
  hostname?: string;
  log_directory?: string;
  dns_config?: { servers?: readonly string[]; searches?: readonly string[]; options?: readonly string[] } | null;
  linux?: {
    sysctls?: Readonly<Record<string, string>>;
    security_context?: {
      namespace_options?: OciNamespaceOptionsInput | null;
      privileged?: boolean;
    } | null;
  } | null;
}

/** The `config` object of the image's config blob (OCI image-spec config.md). */
export interface OciImageInput {
  User?: string;
  Env?: readonly string[] | null;
  Entrypoint?: readonly string[] | null;
  Cmd?: readonly string[] | null;
  WorkingDir?: string;
  StopSignal?: string;
}

/**
 * Where things are inside the guest. The host translates; this function never sees a host path.
 * Namespace paths are `/proc/<pid>/ns/<type>` of the process that holds the pod's namespaces.
 */
export interface OciGuestLayout {
  /** The container's root filesystem as the guest sees it. */
  rootfsPath: string;
  /** The container's cgroup in the guest (cgroup2, a path under the guest's cgroup root). */
  cgroupsPath: string;
  /** CRI mount container_path -> where its source appears in the guest. Every mount needs one. */
  mountSources: Readonly<Record<string, string>>;
  /**
   * CRI mount container_path -> the host mounts below its source, relative to it. The guest sees
   * a volume as one virtio-fs mount, so a read-only bind would make these read-only too; a
   * read-only, non-recursive mount gets them bound again with their own (writable) flags.
   */
  mountSubmounts?: Readonly<Record<string, readonly string[]>>;
  /** CRI device container_path -> the device node as the guest knows it (type, major, minor). */
  devices?: Readonly<Record<string, Omit<OciLinuxDevice, 'path'>>>;
  /** The guest's device nodes, given to a privileged container. */
  privilegedDevices?: readonly OciLinuxDevice[];
  /** The pod's namespaces. */
  namespaces: { network: string; ipc: string; uts: string; pid: string };
  /** With pid TARGET: the target container's PID namespace. */
  targetPidNamespace?: string;
  /** The pod's /dev/shm (a tmpfs the guest keeps per pod). */
  shmPath: string;
  /** A per-pod guest directory where the caller writes `files` (hosts, resolv.conf, hostname). */
  etcDir: string;
}

/** Everything `buildOciSpec` needs, all data: it reads no file and asks nothing. */
export interface OciSpecInput {
  container: OciContainerInput;
  sandbox: OciSandboxInput;
  /** The image config's `config` object; null/undefined when the image has none. */
  image?: OciImageInput | null;
  /** The text of the image's /etc/passwd and /etc/group, undefined when the image has none. */
  imagePasswd?: string;
  imageGroup?: string;
  /** The text of the Localhost seccomp profile the container names, when it names one. */
  seccompLocalhostProfile?: string;
  guest: OciGuestLayout;
}
