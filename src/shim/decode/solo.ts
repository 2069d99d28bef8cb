/**
 * A bundle that no Kubernetes container manager wrote (`ctr run`, `nerdctl run`, a containerd
 * client of its own): a container with neither containerd's nor CRI-O's CRI annotations. It has no
 * pod, so it becomes a pod of its own, as Kata runs it (a single-container sandbox): the pod is
 * synthesized from the container's own config.json and the containerd namespace, and the
 * container runs in it. Pure: one decode into both typed specs, before anything changes.
 *
 * | SandboxSpec | from |
 * |---|---|
 * | `metadata.name`, `.uid` | the container id (`_` read as `-` in the name: a pod name has none) |
 * | `metadata.namespace` | the containerd namespace, lower-cased, `.` and `_` read as `-` (`k8s.io` -> `k8s-io`) |
 * | `hostname` | `hostname` |
 * | `linux.resources` | the container's `linux.resources`: CPU period, quota, shares, memory limit, hugepage limits; so the sizing planner sizes the VM from them as from a kubelet's pod resources |
 * | `linux.cgroup_parent` | `linux.cgroupsPath` as for a pod (ctr: `/<namespace>/<id>` -> `/<namespace>`) |
 * | `privileged` | `isPrivilegedSpec`: containerd's allow-all device rule (`ctr run --privileged`) or WithPrivileged's marks |
 * | network | `linux.namespaces[type=network].path` when it names one (joined); else the VM has no NIC |
 *
 * The container shares the guest pod's network and IPC namespaces (it is the pod) and has a PID
 * namespace of its own; everything else is decoded as for an app container (decode/container.ts).
 */
import { invalid } from '../../common/errors.js';
import type { LinuxContainerResources__Output } from '../../generated/runtime/v1/LinuxContainerResources.js';
import type { PodSandboxConfig__Output } from '../../generated/runtime/v1/PodSandboxConfig.js';
import type { ContainerSpec } from '../../runtime/spec/container.js';
import { refuseNames, sandboxNameProblems } from '../../runtime/spec/names.js';
import { decodeSandboxSpec, type SandboxSpec } from '../../runtime/spec/sandbox.js';
import { CGROUP_NUMBER_MIN, parseCgroupNumber } from '../../sizing/linux-resources.js';
import { CONTAINERD_ANNOTATIONS, CRIO_ANNOTATIONS, renameProblems } from './annotations.js';
import { assembleContainerSpec, isPrivilegedSpec, type TaskContainerDecodeOptions } from './container.js';
import { namespaceOf, namespaceOptions } from './namespaces.js';
import { type CgroupPlacement, cgroupPlacementOf } from './pod.js';
import './reasons.js';
import { type OciRuntimeSpec, parseOciRuntimeSpec } from './spec.js';

/** The annotations whose presence makes a bundle part of a Kubernetes pod (either manager's). */
const POD_ANNOTATIONS = [
  CONTAINERD_ANNOTATIONS.containerType,
  CONTAINERD_ANNOTATIONS.sandboxId,
  CRIO_ANNOTATIONS.containerType,
  CRIO_ANNOTATIONS.sandboxId,
] as const;

/**
 * containerd's namespace rule (namespaces.Validate): letters and digits in runs joined by single
 * `.`, `_` or `-`, at most 76 characters.
 */
const CONTAINERD_NAMESPACE = /^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$/;
const MAX_CONTAINERD_NAMESPACE = 76;
/** A Kubernetes namespace is a DNS label of at most 63 bytes. */
const MAX_POD_NAMESPACE = 63;

/** Whether a config.json (untrusted JSON) names no pod: neither manager's CRI annotations are there. */
export function isSoloBundle(oci: unknown): boolean {
  const annotations = (oci as { annotations?: unknown } | null)?.annotations;
  if (typeof annotations !== 'object' || annotations === null || Array.isArray(annotations)) return true;
  return !POD_ANNOTATIONS.some((key) => Object.hasOwn(annotations, key));
}

export interface SoloDecodeOptions extends Pick<TaskContainerDecodeOptions, 'seccompProfilePath' | 'hostDevicePath'> {
  /** The containerd namespace the task is in (the shim's `-namespace`). */
  namespace: string;
  /** The task's id: the container's, and the synthesized pod's. */
  id: string;
  /** Whether the task has a stdin (a stdin FIFO in Create). */
  stdin: boolean;
}

/** A single-container sandbox: the pod made for the container, and the container. */
export interface SoloTask {
  pod: SandboxSpec;
  /** The network namespace to join (the spec's network namespace path); null: the VM gets no NIC. */
  netnsPath: string | null;
  /** Where `linux.cgroupsPath` puts the VMM; null: none given. */
  cgroup: CgroupPlacement | null;
  container: ContainerSpec;
}

/** The pod's Kubernetes namespace for a containerd namespace (pure), or a refusal naming `-namespace`. */
export function podNamespaceFor(containerdNamespace: string): string {
  if (containerdNamespace.length > MAX_CONTAINERD_NAMESPACE || !CONTAINERD_NAMESPACE.test(containerdNamespace)) {
    throw invalid(
      'SHIM_SOLO_INVALID',
      `the containerd namespace ${JSON.stringify(containerdNamespace.slice(0, 80))} is not one containerd accepts`,
      {
        details: { field: 'namespace' },
      },
    );
  }
  const label = containerdNamespace.toLowerCase().replace(/[._]/g, '-').slice(0, MAX_POD_NAMESPACE).replace(/-+$/, '');
  return label;
}

/** The pod's name for a container id: containerd's ids may hold `_`, which a pod name may not. */
export function podNameFor(id: string): string {
  return id.replace(/_/g, '-');
}

/**
 * The pod's cgroup numbers: the container's own CPU and memory limits, read with the sizing
 * planner's integer rules (each named by its config.json field); null when the spec sets none.
 */
export function soloPodResources(spec: OciRuntimeSpec): LinuxContainerResources__Output | null {
  const r = spec.linux?.resources;
  const cpu = r?.cpu;
  const memory = r?.memory;
  const hugepages = r?.hugepageLimits ?? [];
  if (
    cpu?.period === undefined &&
    cpu?.quota === undefined &&
    cpu?.shares === undefined &&
    memory?.limit === undefined &&
    hugepages.length === 0
  ) {
    return null;
  }
  const read = (value: number | undefined, field: string, min: bigint) => parseCgroupNumber(value, field, min).toString();
  return {
    cpu_period: read(cpu?.period, 'linux.resources.cpu.period', CGROUP_NUMBER_MIN.cpu_period),
    cpu_quota: read(cpu?.quota, 'linux.resources.cpu.quota', CGROUP_NUMBER_MIN.cpu_quota),
    cpu_shares: read(cpu?.shares, 'linux.resources.cpu.shares', CGROUP_NUMBER_MIN.cpu_shares),
    // -1 is "no limit" in a runtime spec's memory limit; the planner reads 0 as that.
    memory_limit_in_bytes:
      memory?.limit === -1 ? '0' : read(memory?.limit, 'linux.resources.memory.limit', CGROUP_NUMBER_MIN.memory_limit_in_bytes),
    oom_score_adj: '0',
    cpuset_cpus: '',
    cpuset_mems: '',
    hugepage_limits: hugepages.map((h, i) => ({
      page_size: h.pageSize,
      limit: read(h.limit, `linux.resources.hugepageLimits[${i}].limit`, CGROUP_NUMBER_MIN.hugepage_limit),
    })),
    unified: {},
    memory_swap_limit_in_bytes: '0',
  };
}

/**
 * A config.json without pod annotations (untrusted JSON) -> the pod synthesized for it and the
 * container, or INVALID_ARGUMENT naming the field at fault. Nothing is read or changed.
 */
export function decodeSoloTask(oci: unknown, options: SoloDecodeOptions): SoloTask {
  const spec = parseOciRuntimeSpec(oci);
  if (!isSoloBundle(spec)) {
    throw invalid('SHIM_SOLO_INVALID', 'the config.json belongs to a pod (it has CRI annotations); it is not a container of its own', {
      details: { field: 'annotations' },
    });
  }
  const namespace = podNamespaceFor(options.namespace);
  const name = podNameFor(options.id);
  const network = namespaceOf(spec, 'network');
  const netnsPath = network?.path === undefined || network.path === '' ? null : network.path;
  if (netnsPath !== null && !netnsPath.startsWith('/')) {
    throw invalid(
      'SHIM_SOLO_INVALID',
      `linux.namespaces[type=network].path must be absolute, got ${JSON.stringify(netnsPath.slice(0, 256))}`,
      {
        details: { field: 'linux.namespaces' },
      },
    );
  }
  const cgroup = cgroupPlacementOf(spec.linux?.cgroupsPath);
  const privileged = isPrivilegedSpec(spec);
  const config: PodSandboxConfig__Output = {
    metadata: { name, uid: options.id, namespace, attempt: 0 },
    hostname: spec.hostname ?? '',
    log_directory: '',
    dns_config: null,
    port_mappings: [],
    labels: {},
    annotations: { ...(spec.annotations ?? {}) },
    linux: {
      cgroup_parent: cgroup?.parent ?? '',
      security_context: {
        // The pod is the VM: its network is the joined namespace's, or none; the container shares it.
        namespace_options: { ...namespaceOptions({ network: 'POD', ipc: 'POD', pid: 'CONTAINER' }), userns_options: null },
        selinux_options: null,
        run_as_user: null,
        readonly_rootfs: false,
        supplemental_groups: [],
        privileged,
        seccomp_profile_path: '',
        run_as_group: null,
        seccomp: null,
        apparmor: null,
        supplemental_groups_policy: 'Merge',
      },
      sysctls: { ...(spec.linux?.sysctl ?? {}) },
      overhead: null,
      resources: soloPodResources(spec),
    },
    windows: null,
    pod_resources: null,
  };
  refuseNames(
    renameProblems(sandboxNameProblems(config), {
      'config.metadata.name': 'id',
      'config.metadata.namespace': 'namespace',
      'config.metadata.uid': 'id',
      'config.hostname': 'hostname',
      'config.annotations': 'annotations',
    }),
  );
  const pod = decodeSandboxSpec(config);
  const imageAnnotation = spec.annotations?.[CONTAINERD_ANNOTATIONS.imageName];
  const container = assembleContainerSpec(
    spec,
    options.id,
    {
      name,
      attempt: 0,
      // containerd keeps the image; the rootfs is its snapshot. The name is only a label here.
      image: imageAnnotation !== undefined && imageAnnotation !== '' ? imageAnnotation : `${options.namespace}/${options.id}`,
      nameField: 'id',
    },
    false,
    {
      ...(options.seccompProfilePath === undefined ? {} : { seccompProfilePath: options.seccompProfilePath }),
      ...(options.hostDevicePath === undefined ? {} : { hostDevicePath: options.hostDevicePath }),
      stdin: options.stdin,
      namespaces: { network: 'POD', ipc: 'POD', pid: 'CONTAINER' },
    },
  );
  return { pod, netnsPath, cgroup, container };
}
