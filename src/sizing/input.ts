/**
 * The parts of a RunPodSandboxRequest the sizing planner reads, as structural types.
 *
 * They match the objects proto-loader produces with PROTO_LOADER_OPTIONS (snake_case keys, int64
 * as decimal strings with "0" meaning unset, enums by name, absent messages as null, maps as plain
 * objects), so a decoded request from src/generated/ fits them without a cast. Fields are optional
 * so hand-written objects (tests, the manifest converter) only state what matters; the planner
 * treats a missing field like its proto3 default.
 */

/** k8s.io/apimachinery Quantity on the wire: one (proto3 optional) field named `string`. */
export interface QuantityInput {
  string?: string | null;
}

export interface KubernetesResourcesInput {
  requests?: Record<string, QuantityInput | null | undefined> | null;
  limits?: Record<string, QuantityInput | null | undefined> | null;
}

/** CRI enum names; anything else (an unknown name or a bare number) is refused. */
export type ContainerTypeName = 'INIT_CONTAINER' | 'SIDECAR_CONTAINER' | 'REGULAR_CONTAINER';

export interface ImageSpecInput {
  image?: string;
}

export interface MountInput {
  container_path?: string;
  host_path?: string;
  readonly?: boolean;
  selinux_relabel?: boolean;
  propagation?: string | number;
  recursive_read_only?: boolean;
  image?: ImageSpecInput | null;
  image_sub_path?: string;
}

export interface DeviceInput {
  container_path?: string;
  host_path?: string;
  permissions?: string;
}

export interface CdiDeviceInput {
  name?: string;
}

/** KEP-4112: one container of the pod as announced before the sandbox starts. */
export interface ContainerResourceConfigInput {
  name?: string;
  type?: ContainerTypeName | string | number;
  kubernetes_resources?: KubernetesResourcesInput | null;
  mounts?: MountInput[];
  devices?: DeviceInput[];
  CDI_devices?: CdiDeviceInput[];
}

/** KEP-4112: every container in pod order, plus optional pod-level resources (KEP-2837). */
export interface PodResourceConfigInput {
  containers?: ContainerResourceConfigInput[];
  kubernetes_resources?: KubernetesResourcesInput | null;
}

export interface HugepageLimitInput {
  /** "2MB", "1GB": the hugetlb cgroup file spelling. */
  page_size?: string;
  limit?: string | number;
}

/** CRI LinuxContainerResources; int64 fields as decimal strings ("0" = not specified). */
export interface LinuxContainerResourcesInput {
  cpu_period?: string | number;
  cpu_quota?: string | number;
  cpu_shares?: string | number;
  memory_limit_in_bytes?: string | number;
  oom_score_adj?: string | number;
  cpuset_cpus?: string;
  cpuset_mems?: string;
  hugepage_limits?: HugepageLimitInput[];
  unified?: Record<string, string>;
  memory_swap_limit_in_bytes?: string | number;
}

export interface LinuxPodSandboxConfigInput {
  cgroup_parent?: string;
  /** RuntimeClass overhead (kubelet >= 1.23). */
  overhead?: LinuxContainerResourcesInput | null;
  /** Sum of the containers' resources (kubelet >= 1.23). */
  resources?: LinuxContainerResourcesInput | null;
}

export interface PodSandboxMetadataInput {
  name?: string;
  uid?: string;
  namespace?: string;
  attempt?: number;
}

export interface PodSandboxConfigInput {
  metadata?: PodSandboxMetadataInput | null;
  annotations?: Record<string, string>;
  linux?: LinuxPodSandboxConfigInput | null;
  pod_resources?: PodResourceConfigInput | null;
}

export interface RunPodSandboxRequestInput {
  config?: PodSandboxConfigInput | null;
  runtime_handler?: string;
}
