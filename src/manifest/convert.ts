import { createHash } from 'node:crypto';
import type {
  ContainerResourceConfigInput,
  KubernetesResourcesInput,
  LinuxContainerResourcesInput,
  MountInput,
  PodResourceConfigInput,
} from '../sizing/input.js';
import { parseRequirements } from '../sizing/resources.js';
import { applyApiDefaults, manifestPaths, podContainers } from './defaults.js';
import { type KubeletCgroupDriver, overheadLinuxResources, podCgroupParent, qosClass, sandboxLinuxResources } from './kubelet.js';
import { containerMounts } from './mounts.js';
import { type PodManifest, type ResourceRequirementsManifest, readPodManifest } from './pod.js';

/**
 * Kubernetes Pod manifest -> RunPodSandboxRequest, in the shape proto-loader decodes requests
 * into, the way a kubelet with KEP-4112 would build it: API-server defaulting first, then the
 * sandbox config (metadata, hostname, log directory, labels, annotations, port mappings), the
 * Linux part a kubelet >= 1.23 fills (cgroup parent, resources, overhead, sysctls) and
 * `pod_resources` listing every container (init containers in order, `restartPolicy: Always` ones
 * as sidecars, then the regular ones) with its requests/limits and mounts. `runtimeClassName`
 * becomes runtime_handler (assuming the RuntimeClass's handler has the same name, the usual
 * convention). Devices and CDI devices come from device plugins/DRA at admission, not from the
 * manifest, so they are empty.
 */

export interface ConvertOptions {
  /** How the kubelet names the pod cgroup (default cgroupfs). */
  cgroupDriver?: KubeletCgroupDriver;
  /** The kubelet's --root-dir (default /var/lib/kubelet). */
  kubeletRoot?: string;
  /** Where pod logs go (default /var/log/pods). */
  podLogsRoot?: string;
}

export interface ConvertedPortMapping {
  protocol: 'TCP' | 'UDP' | 'SCTP';
  container_port: number;
  host_port: number;
  host_ip: string;
}

export interface ConvertedPodSandboxConfig {
  metadata: { name: string; uid: string; namespace: string; attempt: number };
  hostname: string;
  log_directory: string;
  dns_config: null;
  port_mappings: ConvertedPortMapping[];
  labels: Record<string, string>;
  annotations: Record<string, string>;
  linux: {
    cgroup_parent: string;
    security_context: null;
    sysctls: Record<string, string>;
    overhead: LinuxContainerResourcesInput;
    resources: LinuxContainerResourcesInput;
  };
  windows: null;
  pod_resources: {
    containers: Array<ContainerResourceConfigInput & { mounts: MountInput[] }>;
    kubernetes_resources: KubernetesResourcesInput | null;
  } & PodResourceConfigInput;
}

export interface ConvertedRunPodSandboxRequest {
  config: ConvertedPodSandboxConfig;
  runtime_handler: string;
}

/** A stable, UUID-shaped uid for a manifest without metadata.uid (so plans are reproducible). */
export function synthesizedUid(namespace: string, name: string): string {
  const h = createHash('sha1').update(`kata-ts/${namespace}/${name}`).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-5${h.slice(13, 16)}-${((parseInt(h[16]!, 16) & 0x3) | 0x8).toString(16)}${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

function kubernetesResources(r: ResourceRequirementsManifest): KubernetesResourcesInput {
  const wrap = (m: Record<string, string>) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, { string: v }]));
  return { requests: wrap(r.requests), limits: wrap(r.limits) };
}

/** The kubelet adds ports of regular containers only, once per (protocol, container port). */
function portMappings(pod: PodManifest): ConvertedPortMapping[] {
  const seen = new Set<string>();
  const out: ConvertedPortMapping[] = [];
  for (const c of pod.containers) {
    for (const p of c.ports) {
      const key = `${p.protocol}/${p.containerPort}`;
      if (seen.has(key)) continue;
      seen.add(key);
      out.push({ protocol: p.protocol, container_port: p.containerPort, host_port: p.hostPort, host_ip: p.hostIP });
    }
  }
  return out;
}

/** Convert a validated Pod model. */
export function podToRunPodSandboxRequest(manifest: PodManifest, options: ConvertOptions = {}): ConvertedRunPodSandboxRequest {
  // Check what the user wrote before defaulting copies limits into requests, so errors name
  // the field as written.
  for (const { c } of podContainers(manifest)) parseRequirements(c.resources, manifestPaths(`${c.at}.resources`));
  if (manifest.resources !== null) parseRequirements(manifest.resources, manifestPaths('spec.resources'));
  const pod = applyApiDefaults(manifest);
  const uid = pod.uid !== '' ? pod.uid : synthesizedUid(pod.namespace, pod.name);
  const kubeletRoot = options.kubeletRoot ?? '/var/lib/kubelet';
  const containers = podContainers(pod).map(({ c, type }) => ({
    name: c.name,
    type,
    kubernetes_resources: kubernetesResources(c.resources),
    mounts: containerMounts(pod, uid, c, kubeletRoot),
    devices: [],
    CDI_devices: [],
  }));
  return {
    config: {
      metadata: { name: pod.name, uid, namespace: pod.namespace, attempt: 0 },
      hostname: pod.hostname,
      log_directory: `${options.podLogsRoot ?? '/var/log/pods'}/${pod.namespace}_${pod.name}_${uid}`,
      dns_config: null,
      port_mappings: portMappings(pod),
      labels: {
        ...pod.labels,
        'io.kubernetes.pod.name': pod.name,
        'io.kubernetes.pod.namespace': pod.namespace,
        'io.kubernetes.pod.uid': uid,
      },
      annotations: { ...pod.annotations },
      linux: {
        cgroup_parent: podCgroupParent(qosClass(pod), uid, options.cgroupDriver ?? 'cgroupfs'),
        security_context: null,
        sysctls: { ...pod.sysctls },
        overhead: overheadLinuxResources(pod),
        resources: sandboxLinuxResources(pod),
      },
      windows: null,
      pod_resources: {
        containers,
        kubernetes_resources: pod.resources === null ? null : kubernetesResources(pod.resources),
      },
    },
    runtime_handler: pod.runtimeClassName,
  };
}

/** Validate a parsed manifest document (kind: Pod) and convert it. */
export function manifestToRunPodSandboxRequest(doc: unknown, options: ConvertOptions = {}): ConvertedRunPodSandboxRequest {
  return podToRunPodSandboxRequest(readPodManifest(doc), options);
}
