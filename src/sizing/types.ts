/**
 * The decided shape of a pod's VM and of its host-side budget. Produced by the sizing planner
 * (pure), consumed by the QEMU argv builder, the cgroup drivers and the admission/resize code.
 */

/** A guest hugepage pool reserved on the kernel command line (`hugepagesz=2M hugepages=N`). */
export interface HugepageReservation {
  /** Kubernetes spelling of the size, as in the resource name `hugepages-2Mi`. */
  pageSize: string;
  pageSizeBytes: number;
  count: number;
}

export interface VmShape {
  /** vCPUs online at boot. */
  vcpus: number;
  /** vCPUs the VM may grow to by CPU hot-plug; equals `vcpus` for static (confidential) VMs. */
  maxVcpus: number;
  /** Boot RAM, including hugepage pools and the guest's own overhead. */
  memoryMiB: number;
  /** RAM the VM may grow to (virtio-mem); equals `memoryMiB` for static VMs. */
  maxMemoryMiB: number;
  hugepages: HugepageReservation[];
  /** Guest kernel parameters the shape needs (hugepage pools). */
  kernelParams: string[];
}

/** What the VMM's cgroup (systemd scope or cgroupfs directory) is limited to on the host. */
export interface HostBudget {
  /** VM memory + VMM overhead. */
  memoryLimitBytes: number;
  /** CPU limit for the VMM: the VM's vCPUs plus the VMM's own overhead. */
  cpuQuotaMillicores: number;
  /** CPU request (for shares / weight): workload requests plus the VMM overhead. */
  cpuRequestMillicores: number;
}

/** Which input the sizing came from, in order of precedence. */
export type SizingSource =
  | 'pod_resources' // KEP-4112 PodSandboxConfig.pod_resources
  | 'linux_resources' // LinuxPodSandboxConfig.resources / .overhead (kubelet >= 1.23)
  | 'containerd_annotations' // io.kubernetes.cri.sandbox-* annotations
  | 'crio_annotations' // io.kubernetes.cri-o.PodLinuxResources / PodLinuxOverhead
  | 'handler_defaults'; // nothing given

/** What the host offers (read once by the caller: os.cpus(), os.totalmem()); the planner does no I/O. */
export interface HostCapacity {
  cpus: number;
  memoryMiB: number;
}

/** KEP-4112 container types, spelled as in the CRI enum. */
export type SizingContainerType = 'INIT_CONTAINER' | 'SIDECAR_CONTAINER' | 'REGULAR_CONTAINER';

/** The pod's demand after aggregation (Kubernetes' sidecar-aware rules, pod-level overrides). */
export interface WorkloadResources {
  cpuRequestMillicores: number;
  /** Sum of limits, where a container without a limit counts with its request. */
  cpuLimitMillicores: number;
  memoryRequestBytes: number;
  /** Sum of limits, where a container without a limit counts with its request. */
  memoryLimitBytes: number;
  /** Page size as in the resource name ("2Mi", "1Gi") -> bytes. */
  hugepages: Record<string, number>;
  /** Extended resources (e.g. "nvidia.com/gpu") -> whole count, as a decimal string. */
  extended: Record<string, string>;
}

/** One container's resolved resources, as announced in pod_resources (for admission later). */
export interface ContainerResourcesPlan {
  name: string;
  type: SizingContainerType;
  cpuRequestMillicores: number;
  /** null: no limit given (sizing counts the request). */
  cpuLimitMillicores: number | null;
  memoryRequestBytes: number;
  /** null: no limit given (sizing counts the request). */
  memoryLimitBytes: number | null;
  hugepages: Record<string, number>;
  extended: Record<string, string>;
}

/** Where the VMM overhead in the host budget came from. */
export type VmmOverheadSource =
  | 'pod_overhead' // LinuxPodSandboxConfig.overhead (RuntimeClass overhead, kubelet >= 1.23)
  | 'crio_annotations' // io.kubernetes.cri-o.PodLinuxOverhead
  | 'handler'; // the handler profile's vmmOverhead

export interface VmmOverheadPlan {
  /** Per resource: a RuntimeClass overhead naming only memory still takes CPU from the handler. */
  cpuSource: VmmOverheadSource;
  memorySource: VmmOverheadSource;
  cpuMillicores: number;
  memoryBytes: number;
  /**
   * QEMU's translated-code cache under TCG, on top of memoryBytes (0 under KVM). Optional only
   * because plans recorded before it existed lack it.
   */
  translationCacheBytes?: number;
  /**
   * The free-page-reporting balloon device (handler vm.freePageReporting), on top of memoryBytes:
   * QEMU's device state and virtqueues. Absent when the VM has no balloon (and in older plans).
   */
  balloonBytes?: number;
}

/** The sizing planner's answer for one pod. */
export interface SizingPlan {
  source: SizingSource;
  workload: WorkloadResources;
  vm: VmShape;
  host: HostBudget;
  vmmOverhead: VmmOverheadPlan;
  /** Per container, in pod order; empty when the source is not pod_resources. */
  containers: ContainerResourcesPlan[];
  /**
   * How far the host budget exceeds the containers' memory limits plus the pod overhead the
   * kubelet sent (an empty one: 0), when the pod states its memory and an overhead was sent (a
   * shim behind containerd is told none, so it cannot say). The kubelet limits the pod's cgroup,
   * the VMM's parent, to that sum when every container has a limit: this much of the VM can then
   * be OOM-killed before its containers reach their limits. Absent when there is none (the
   * RuntimeClass's podFixed, `kata-ts plan --overhead`, covers the VM) or the pod is unbounded.
   */
  overheadShortfallBytes?: number;
}
