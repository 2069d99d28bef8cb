import { type AggregationEntry, aggregatePodAmounts } from '../sizing/aggregate.js';
import { formatNanos } from '../sizing/quantity.js';
import { amountsOf, classifyResourceName, parseRequirements, type RequirementPaths } from '../sizing/resources.js';
import type { SizingContainerType } from '../sizing/types.js';
import type { ContainerManifest, PodManifest, ResourceRequirementsManifest } from './pod.js';

/**
 * The API server's defaulting of a Pod's resources (pkg/apis/core/v1 SetDefaults_Pod), which every
 * pod a kubelet sees has been through:
 * - a container resource with a limit and no request requests its limit;
 * - with pod-level resources (KEP-2837): hugepage pod limits default to the containers' aggregated
 *   hugepage limits; pod-level requests default to the containers' aggregated requests (cpu,
 *   memory) or else to the pod-level limit; pod-level cpu/memory limits default to the containers'
 *   aggregated limits when every container has one.
 */

/** Manifest paths for a requirements list: `spec.containers[0].resources.limits.cpu`. */
export function manifestPaths(at: string): RequirementPaths {
  return {
    list: (which) => `${at}.${which}`,
    entry: (which, name) => `${at}.${which}.${name}`,
  };
}

export function containerType(c: ContainerManifest, init: boolean): SizingContainerType {
  if (!init) return 'REGULAR_CONTAINER';
  return c.restartPolicy === 'Always' ? 'SIDECAR_CONTAINER' : 'INIT_CONTAINER';
}

/** Containers in pod order with their CRI type. */
export function podContainers(pod: PodManifest): Array<{ c: ContainerManifest; type: SizingContainerType }> {
  return [
    ...pod.initContainers.map((c) => ({ c, type: containerType(c, true) })),
    ...pod.containers.map((c) => ({ c, type: containerType(c, false) })),
  ];
}

function defaultContainer(c: ContainerManifest): ContainerManifest {
  const requests = { ...c.resources.requests };
  for (const [name, limit] of Object.entries(c.resources.limits)) if (!(name in requests)) requests[name] = limit;
  return { ...c, resources: { requests, limits: { ...c.resources.limits } } };
}

const POD_LEVEL_KINDS = new Set(['cpu', 'memory', 'hugepages']);

function canonicalKeys(list: Record<string, string>, at: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const name of Object.keys(list)) out.set(classifyResourceName(name, at).key, name);
  return out;
}

function defaultPodLevel(pod: PodManifest, resources: ResourceRequirementsManifest): ResourceRequirementsManifest {
  const entries = podContainers(pod).map(({ c, type }) => ({
    type,
    parsed: parseRequirements(c.resources, manifestPaths(`${c.at}.resources`)),
  }));
  const aggregate = (which: 'requests' | 'limits'): Map<string, bigint> =>
    aggregatePodAmounts(entries.map((e): AggregationEntry => ({ type: e.type, amounts: amountsOf(e.parsed[which]) })));
  const requests = { ...resources.requests };
  const limits = { ...resources.limits };
  const kindOf = (key: string): string => classifyResourceName(key, 'spec.resources').kind;
  const supported = (key: string): boolean => POD_LEVEL_KINDS.has(kindOf(key));
  const overcommittable = (key: string): boolean => kindOf(key) === 'cpu' || kindOf(key) === 'memory';

  // Hugepage pod limits from the containers' limits (unless the pod requests that size itself).
  if (Object.keys(requests).length + Object.keys(limits).length > 0) {
    const reqKeys = canonicalKeys(requests, 'spec.resources.requests');
    const limKeys = canonicalKeys(limits, 'spec.resources.limits');
    for (const [key, nanos] of aggregate('limits')) {
      if (kindOf(key) === 'hugepages' && !reqKeys.has(key) && !limKeys.has(key)) limits[key] = formatNanos(nanos);
    }
  }
  // Pod requests from the containers' requests (cpu, memory), else from the pod limits.
  if (Object.keys(limits).length > 0) {
    const reqKeys = canonicalKeys(requests, 'spec.resources.requests');
    for (const [key, nanos] of aggregate('requests')) {
      if (!reqKeys.has(key) && supported(key) && overcommittable(key)) {
        requests[key] = formatNanos(nanos);
        reqKeys.set(key, key);
      }
    }
    for (const [key, name] of canonicalKeys(limits, 'spec.resources.limits')) {
      if (!reqKeys.has(key) && supported(key)) requests[name] = limits[name]!;
    }
  }
  // Pod cpu/memory limits from the containers' limits, when the pod sets requests but no limits.
  const limKeys = canonicalKeys(limits, 'spec.resources.limits');
  const anyLimit = [...limKeys.keys()].some(supported);
  const anyRequest = [...canonicalKeys(requests, 'spec.resources.requests').keys()].some(supported);
  if (!anyLimit && anyRequest) {
    for (const [key, nanos] of aggregate('limits')) {
      if (limKeys.has(key) || !overcommittable(key)) continue;
      if (entries.every((e) => e.parsed.limits.has(key))) limits[key] = formatNanos(nanos);
    }
  }
  return { requests, limits };
}

/** The pod as the API server would have stored it (resources defaulted). Does not modify `pod`. */
export function applyApiDefaults(pod: PodManifest): PodManifest {
  const defaulted: PodManifest = {
    ...pod,
    initContainers: pod.initContainers.map(defaultContainer),
    containers: pod.containers.map(defaultContainer),
  };
  if (pod.resources !== null) defaulted.resources = defaultPodLevel(defaulted, pod.resources);
  return defaulted;
}
