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
