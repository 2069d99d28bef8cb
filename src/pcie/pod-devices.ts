import path from 'node:path';
import { type CdiNameRequest, type CdiRegistry, cdiNamesFromAnnotations, parseQualifiedName, resolveCdiDevices } from './cdi.js';
import { getKubeletPodResources, type KubeletPodResources } from './podresources.js';
import type { VfioDeviceRequest } from './types.js';

/** The slice of a decoded CRI `PodResourceConfig` (keepCase) this module reads. */
export interface PodResourceConfigLike {
  containers?: Array<{
    name?: string;
    type?: string | number;
    devices?: Array<{ container_path?: string; host_path?: string; permissions?: string }> | null;
    CDI_devices?: Array<{ name?: string }> | null;
  }> | null;
}

export type PodDeviceSource = 'pod_resources' | 'cdi_annotations' | 'kubelet_podresources';

export interface PodVfioDevices {
  /** Which inputs contributed (empty when the pod brings no device). */
  sources: PodDeviceSource[];
  /** What the PCIe planner takes. */
  requests: VfioDeviceRequest[];
  /** CDI names seen, deduplicated, in order. */
  cdiNames: CdiNameRequest[];
  /** CDI devices without a VFIO node: delivered into the guest some other way, not as PCI. */
  nonVfio: Array<{ name: string; origin: string; nodes: string[] }>;
  warnings: string[];
}

export interface PodDeviceInputs {
  /** `PodSandboxConfig.pod_resources`; null/undefined when the kubelet sent none (KEP-4112 absent). */
  podResources?: PodResourceConfigLike | null;
  /** `PodSandboxConfig.annotations` (for `cdi.k8s.io/*`). */
  annotations?: Readonly<Record<string, string>> | null;
  /** The kubelet's PodResources answer for this pod, when it was asked (see discoverPodVfioDevices). */
  kubelet?: KubeletPodResources | null;
  cdi: CdiRegistry;
}

function isVfioPath(p: string): boolean {
  return path.posix.normalize(p).startsWith('/dev/vfio/');
}

function dedupe(names: CdiNameRequest[]): CdiNameRequest[] {
  const seen = new Set<string>();
  return names.filter((n) => {
    if (seen.has(n.name)) return false;
    seen.add(n.name);
    return true;
  });
}

/**
 * The CDI names the kubelet's PodResources answer implies. DRA claims carry CDI names; device-plugin
 * devices become `<resource_name>=<id>` (Kata's convention) and are only guesses, so the caller
 * keeps those that a spec actually defines.
 */
export function cdiNamesFromKubelet(pod: KubeletPodResources): { explicit: CdiNameRequest[]; guessed: CdiNameRequest[] } {
  const explicit: CdiNameRequest[] = [];
  const guessed: CdiNameRequest[] = [];
  for (const c of pod.containers) {
    for (const d of c.devices) {
      for (const id of d.device_ids)
        guessed.push({ name: `${d.resource_name}=${id}`, origin: `kubelet container "${c.name}" resource ${d.resource_name}` });
    }
    for (const dr of c.dynamic_resources) {
      for (const cr of dr.claim_resources) {
        for (const cdi of cr.cdi_devices)
          explicit.push({ name: cdi.name, origin: `kubelet container "${c.name}" claim ${dr.claim_namespace}/${dr.claim_name}` });
      }
    }
  }
  return { explicit, guessed };
}

/**
 * Pure: which VFIO devices the pod brings. With pod_resources (KEP-4112) that is the only source:
 * each container's device host paths under /dev/vfio and its CDI devices. Without it, the
 * `cdi.k8s.io/*` annotations plus (when asked) the kubelet's PodResources answer.
 */
export function podVfioDevices(input: PodDeviceInputs): PodVfioDevices {
  const out: PodVfioDevices = { sources: [], requests: [], cdiNames: [], nonVfio: [], warnings: [] };
  let names: CdiNameRequest[] = [];
  if (input.podResources !== null && input.podResources !== undefined) {
    for (const c of input.podResources.containers ?? []) {
      const who = `container "${c.name ?? ''}"`;
      for (const d of c.devices ?? []) {
        if (d.host_path !== undefined && isVfioPath(d.host_path))
          out.requests.push({ hostPath: d.host_path, origin: `pod_resources ${who} device ${d.host_path}` });
      }
      for (const cdi of c.CDI_devices ?? []) if (cdi.name) names.push({ name: cdi.name, origin: `pod_resources ${who}` });
    }
    if (out.requests.length > 0 || names.length > 0) out.sources.push('pod_resources');
  } else {
    const annotated = cdiNamesFromAnnotations(input.annotations);
    if (annotated.length > 0) out.sources.push('cdi_annotations');
    names.push(...annotated);
    if (input.kubelet) {
      const { explicit, guessed } = cdiNamesFromKubelet(input.kubelet);
      const known = guessed.filter((g) => {
        const ok = parseQualifiedName(g.name) !== undefined && input.cdi.devices[g.name] !== undefined;
        if (!ok) out.warnings.push(`${g.origin}: no CDI device "${g.name}", not a VFIO device kata-ts can place`);
        return ok;
      });
      if (explicit.length + known.length > 0) out.sources.push('kubelet_podresources');
      names.push(...explicit, ...known);
    }
  }
  names = dedupe(names);
  out.cdiNames = names;
  const resolved = resolveCdiDevices(input.cdi, names);
  out.requests.push(...resolved.requests);
  out.nonVfio = resolved.nonVfio;
  return out;
}

export interface DiscoverOptions extends Omit<PodDeviceInputs, 'kubelet'> {
  podName: string;
  podNamespace: string;
  /** `pcie.podResourcesSocket` from the config; null = do not ask the kubelet. */
  podResourcesSocket: string | null;
  timeoutMs: number;
}

/**
 * podVfioDevices plus the one effect it may need: asking the kubelet's PodResources API, only
 * when the pod brought no pod_resources and a socket is configured.
 */
export async function discoverPodVfioDevices(options: DiscoverOptions): Promise<PodVfioDevices> {
  let kubelet: KubeletPodResources | null = null;
  if ((options.podResources === null || options.podResources === undefined) && options.podResourcesSocket !== null) {
    kubelet = await getKubeletPodResources(options.podResourcesSocket, options.podNamespace, options.podName, {
      timeoutMs: options.timeoutMs,
    });
  }
  return podVfioDevices({ podResources: options.podResources, annotations: options.annotations, kubelet, cdi: options.cdi });
}
