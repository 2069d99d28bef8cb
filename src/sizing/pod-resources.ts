import { invalid } from '../common/errors.js';
import { aggregatePodAmounts } from './aggregate.js';
import { type ContainerDemand, type PodDemand, splitAmounts } from './demand.js';
import type { PodResourceConfigInput } from './input.js';
import {
  amountsOf,
  defaultRequestsToLimits,
  formatAmount,
  isOvercommitAllowed,
  type ParsedRequirements,
  parseRequirements,
  protoPaths,
} from './resources.js';
import type { SizingContainerType } from './types.js';

const CONTAINER_TYPES: ReadonlySet<string> = new Set(['INIT_CONTAINER', 'SIDECAR_CONTAINER', 'REGULAR_CONTAINER']);

interface CheckedContainer {
  name: string;
  type: SizingContainerType;
  parsed: ParsedRequirements;
  requests: Map<string, bigint>;
  /** limit ?? request, per resource the container mentions. */
  effectiveLimits: Map<string, bigint>;
  at: string;
}

function checkContainers(podResources: PodResourceConfigInput, at: string): CheckedContainer[] {
  const seen = new Map<string, number>();
  return (podResources.containers ?? []).map((container, index) => {
    const here = `${at}.containers[${index}]`;
    const name = container.name;
    if (typeof name !== 'string' || name === '') {
      throw invalid('SIZING_CONTAINER_NAME_MISSING', `${here}.name is empty; every container needs a name`);
    }
    const first = seen.get(name);
    if (first !== undefined) {
      throw invalid(
        'SIZING_DUPLICATE_CONTAINER',
        `${here}.name "${name}" repeats ${at}.containers[${first}].name; container names must be unique in a pod`,
        { details: { name, indexes: [first, index] } },
      );
    }
    seen.set(name, index);
    const type = container.type;
    if (typeof type !== 'string' || !CONTAINER_TYPES.has(type)) {
      throw invalid(
        'SIZING_CONTAINER_TYPE_UNKNOWN',
        `${here}.type ${JSON.stringify(type)} of container "${name}" is not INIT_CONTAINER, SIDECAR_CONTAINER or REGULAR_CONTAINER`,
        { details: { name, type } },
      );
    }
    const parsed = defaultRequestsToLimits(parseRequirements(container.kubernetes_resources, protoPaths(`${here}.kubernetes_resources`)));
    const requests = amountsOf(parsed.requests);
    const effectiveLimits = new Map(requests);
    for (const [key, nanos] of amountsOf(parsed.limits)) effectiveLimits.set(key, nanos);
    return { name, type: type as SizingContainerType, parsed, requests, effectiveLimits, at: here };
  });
}

function containerDemand(c: CheckedContainer): ContainerDemand {
  const requests = splitAmounts(c.requests);
  const limits = splitAmounts(amountsOf(c.parsed.limits));
  const effective = splitAmounts(c.effectiveLimits);
  return {
    name: c.name,
    type: c.type,
    cpuRequestMillis: requests.cpuMillis ?? 0n,
    cpuLimitMillis: limits.cpuMillis ?? null,
    memoryRequestBytes: requests.memoryBytes ?? 0n,
    memoryLimitBytes: limits.memoryBytes ?? null,
    hugepageBytes: effective.hugepageBytes,
    extended: effective.extended,
  };
}

/**
 * Apply pod-level resources (KEP-2837) over the containers' aggregates: for every resource the
 * pod names, its values replace the aggregate, after the API server's defaulting (a pod-level
 * request missing beside a pod-level limit defaults to the containers' aggregated request for
 * cpu/memory when they state one, else to the limit) and Kubernetes' consistency rules (the pod
 * requests at least what its containers request together; no container's limit exceeds the
 * pod's).
 */
function applyPodLevel(
  podResources: PodResourceConfigInput,
  at: string,
  containers: CheckedContainer[],
  requests: Map<string, bigint>,
  effectiveLimits: Map<string, bigint>,
): Set<string> {
  const here = `${at}.kubernetes_resources`;
  const paths = protoPaths(here);
  const pod = parseRequirements(podResources.kubernetes_resources, paths);
  const named = new Set([...pod.requests.keys(), ...pod.limits.keys()]);
  for (const key of named) {
    const cls = (pod.requests.get(key) ?? pod.limits.get(key))!.cls;
    if (cls.kind !== 'cpu' && cls.kind !== 'memory' && cls.kind !== 'hugepages') {
      throw invalid(
        'SIZING_POD_LEVEL_RESOURCE_UNSUPPORTED',
        `${here} names "${key}"; pod-level resources may only set cpu, memory and hugepages-<size>`,
        {
          details: { key },
        },
      );
    }
    const aggregatedRequest = requests.get(key);
    const podLimit = pod.limits.get(key)?.quantity.nanos;
    let podRequest = pod.requests.get(key)?.quantity.nanos;
    if (podRequest === undefined && podLimit !== undefined) {
      podRequest = aggregatedRequest !== undefined && isOvercommitAllowed(cls) ? aggregatedRequest : podLimit;
    }
    if (podRequest !== undefined && aggregatedRequest !== undefined && podRequest < aggregatedRequest) {
      throw invalid(
        'SIZING_POD_REQUEST_BELOW_CONTAINERS',
        `${here} gives the pod ${key} ${pod.requests.get(key)?.quantity.text ?? pod.limits.get(key)?.quantity.text}, less than its containers request together (${formatAmount(key, aggregatedRequest)})`,
        { details: { key, podRequestNanos: String(podRequest), containersNanos: String(aggregatedRequest) } },
      );
    }
    if (podLimit !== undefined && podRequest !== undefined && podLimit < podRequest) {
      // Only reachable through defaulting: the explicit pair was checked by parseRequirements.
      throw invalid(
        'SIZING_LIMIT_BELOW_REQUEST',
        `${paths.entry('limits', key)} is ${pod.limits.get(key)!.quantity.text}, below the ${formatAmount(key, podRequest)} of ${key} its containers request together`,
        { details: { key } },
      );
    }
    if (podLimit !== undefined) {
      for (const c of containers) {
        const limit = c.parsed.limits.get(key);
        if (limit !== undefined && limit.quantity.nanos > podLimit) {
          throw invalid(
            'SIZING_CONTAINER_LIMIT_ABOVE_POD_LIMIT',
            `${c.at} ("${c.name}") limits ${key} to ${limit.quantity.text}, above the pod-level limit ${pod.limits.get(key)!.quantity.text}`,
            { details: { key, container: c.name } },
          );
        }
      }
    }
    if (podRequest !== undefined) requests.set(key, podRequest);
    const aggregatedLimit = effectiveLimits.get(key) ?? 0n;
    const limit = podLimit ?? (podRequest !== undefined && podRequest > aggregatedLimit ? podRequest : aggregatedLimit);
    effectiveLimits.set(key, limit);
  }
  return named;
}

/**
 * The demand of a pod announced through KEP-4112 `pod_resources`: containers checked (unique
 * names, known types, consistent requirements), aggregated with Kubernetes' rules, pod-level
 * resources applied. `at` prefixes field paths in errors.
 */
export function demandFromPodResources(podResources: PodResourceConfigInput, at = 'config.pod_resources'): PodDemand {
  const containers = checkContainers(podResources, at);
  if (containers.length === 0) {
    throw invalid('SIZING_POD_RESOURCES_EMPTY', `${at}.containers is empty; pod_resources must list every container of the pod`);
  }
  const requests = aggregatePodAmounts(containers.map((c) => ({ type: c.type, amounts: c.requests })));
  const effectiveLimits = aggregatePodAmounts(containers.map((c) => ({ type: c.type, amounts: c.effectiveLimits })));
  const podLevel = applyPodLevel(podResources, at, containers, requests, effectiveLimits);
  // A container with no non-zero request or limit for a resource may use any amount of it (a
  // zero limit means "no limit" to the kubelet too).
  const unbounded = (key: string): boolean => !podLevel.has(key) && containers.some((c) => (c.effectiveLimits.get(key) ?? 0n) === 0n);
  const req = splitAmounts(requests);
  const lim = splitAmounts(effectiveLimits);
  return {
    source: 'pod_resources',
    cpuRequestMillis: req.cpuMillis ?? 0n,
    cpuLimitMillis: lim.cpuMillis ?? 0n,
    memoryRequestBytes: req.memoryBytes ?? 0n,
    memoryLimitBytes: lim.memoryBytes ?? 0n,
    hugepageBytes: lim.hugepageBytes,
    extended: lim.extended,
    cpuUnbounded: unbounded('cpu'),
    memoryUnbounded: unbounded('memory'),
    containers: containers.map(containerDemand),
  };
}
