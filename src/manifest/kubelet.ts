import { aggregatePodAmounts } from '../sizing/aggregate.js';
import type { LinuxContainerResourcesInput } from '../sizing/input.js';
import { nanosToMillis, nanosToUnits, parseQuantity } from '../sizing/quantity.js';
import { amountsOf, classifyResourceName, parseRequirements } from '../sizing/resources.js';
import { manifestPaths, podContainers } from './defaults.js';
import type { PodManifest } from './pod.js';

/**
 * What a kubelet (>= 1.23) derives from a pod for the sandbox, from pkg/kubelet/kuberuntime:
 * `linux.resources` = cgroup numbers of PodRequests/PodLimits without overhead, `linux.overhead` =
 * the RuntimeClass overhead as guaranteed resources, the QoS class and the pod's cgroup parent.
 */

/** pkg/kubelet/cm: CFS defaults and the shares range. */
const QUOTA_PERIOD_US = 100_000n;
const MIN_QUOTA_PERIOD_US = 1000n;
const MIN_SHARES = 2n;
const MAX_SHARES = 262_144n;
const SHARES_PER_CPU = 1024n;

export function milliCpuToShares(milliCpu: bigint): bigint {
  if (milliCpu === 0n) return MIN_SHARES;
  const shares = (milliCpu * SHARES_PER_CPU) / 1000n;
  return shares < MIN_SHARES ? MIN_SHARES : shares > MAX_SHARES ? MAX_SHARES : shares;
}

export function milliCpuToQuota(milliCpu: bigint, period: bigint): bigint {
  if (milliCpu === 0n) return 0n;
  const quota = (milliCpu * period) / 1000n;
  return quota < MIN_QUOTA_PERIOD_US ? MIN_QUOTA_PERIOD_US : quota;
}

/** calculateLinuxResources(cpuRequest, cpuLimit, memoryLimit) with the CFS quota enabled. */
function linuxResources(
  cpuRequestMillis: bigint | undefined,
  cpuLimitMillis: bigint,
  memoryLimitBytes: bigint,
): LinuxContainerResourcesInput {
  // A missing request defaults to the limit (the API server does so for new pods; the kubelet repeats it).
  const shares = milliCpuToShares(cpuRequestMillis ?? cpuLimitMillis);
  return {
    cpu_period: String(QUOTA_PERIOD_US),
    cpu_quota: String(milliCpuToQuota(cpuLimitMillis, QUOTA_PERIOD_US)),
    cpu_shares: String(shares),
    memory_limit_in_bytes: String(memoryLimitBytes),
    oom_score_adj: '0',
    cpuset_cpus: '',
    cpuset_mems: '',
    hugepage_limits: [],
    unified: {},
    memory_swap_limit_in_bytes: '0',
  };
}

/** An empty LinuxContainerResources, as proto-loader decodes an all-default message. */
export function emptyLinuxResources(): LinuxContainerResourcesInput {
  return { ...linuxResources(undefined, 0n, 0n), cpu_period: '0', cpu_quota: '0', cpu_shares: '0' };
}

const POD_LEVEL_KINDS = new Set(['cpu', 'memory', 'hugepages']);

/** PodRequests / PodLimits (ExcludeOverhead), nanos per canonical resource key. */
export function podRequestsAndLimits(pod: PodManifest): { requests: Map<string, bigint>; limits: Map<string, bigint> } {
  const parsed = podContainers(pod).map(({ c, type }) => ({ type, p: parseRequirements(c.resources, manifestPaths(`${c.at}.resources`)) }));
  const requests = aggregatePodAmounts(parsed.map(({ type, p }) => ({ type, amounts: amountsOf(p.requests) })));
  const limits = aggregatePodAmounts(parsed.map(({ type, p }) => ({ type, amounts: amountsOf(p.limits) })));
  if (pod.resources !== null) {
    const podLevel = parseRequirements(pod.resources, manifestPaths('spec.resources'));
    for (const [key, { quantity, cls }] of podLevel.requests) if (POD_LEVEL_KINDS.has(cls.kind)) requests.set(key, quantity.nanos);
    for (const [key, { quantity, cls }] of podLevel.limits) if (POD_LEVEL_KINDS.has(cls.kind)) limits.set(key, quantity.nanos);
  }
  return { requests, limits };
}

/** kubeGenericRuntimeManager.calculateSandboxResources. */
export function sandboxLinuxResources(pod: PodManifest): LinuxContainerResourcesInput {
  const { requests, limits } = podRequestsAndLimits(pod);
  const cpuRequest = requests.get('cpu');
  return linuxResources(
    cpuRequest === undefined ? undefined : nanosToMillis(cpuRequest),
    nanosToMillis(limits.get('cpu') ?? 0n),
    nanosToUnits(limits.get('memory') ?? 0n),
  );
}

/** convertOverheadToLinuxResources: overhead is treated as guaranteed (request == limit). */
export function overheadLinuxResources(pod: PodManifest): LinuxContainerResourcesInput {
  if (Object.keys(pod.overhead).length === 0) return emptyLinuxResources();
  let cpu = 0n;
  let memory = 0n;
  for (const [name, text] of Object.entries(pod.overhead)) {
    const at = `spec.overhead.${name}`;
    const cls = classifyResourceName(name, 'spec.overhead');
    const q = parseQuantity(text, at);
    if (cls.kind === 'cpu') cpu = nanosToMillis(q.nanos);
    if (cls.kind === 'memory') memory = nanosToUnits(q.nanos);
  }
  return linuxResources(cpu, cpu, memory);
}

export type QosClass = 'Guaranteed' | 'Burstable' | 'BestEffort';

/** ComputePodQOS: from pod-level cpu/memory when set, else from every container's. */
export function qosClass(pod: PodManifest): QosClass {
  const sources =
    pod.resources !== null &&
    [...Object.keys(pod.resources.requests), ...Object.keys(pod.resources.limits)].some((n) => n === 'cpu' || n === 'memory')
      ? [{ resources: pod.resources, at: 'spec.resources' }]
      : podContainers(pod).map(({ c }) => ({ resources: c.resources, at: `${c.at}.resources` }));
  const requests = new Map<string, bigint>();
  const limits = new Map<string, bigint>();
  let guaranteed = true;
  for (const { resources, at } of sources) {
    const p = parseRequirements(resources, manifestPaths(at));
    for (const [key, { quantity }] of p.requests) {
      if ((key === 'cpu' || key === 'memory') && quantity.nanos > 0n) requests.set(key, (requests.get(key) ?? 0n) + quantity.nanos);
    }
    const found = new Set<string>();
    for (const [key, { quantity }] of p.limits) {
      if ((key === 'cpu' || key === 'memory') && quantity.nanos > 0n) {
        limits.set(key, (limits.get(key) ?? 0n) + quantity.nanos);
        found.add(key);
      }
    }
    if (!found.has('cpu') || !found.has('memory')) guaranteed = false;
  }
  if (requests.size === 0 && limits.size === 0) return 'BestEffort';
  if (guaranteed && [...requests].every(([k, v]) => limits.get(k) === v) && requests.size === limits.size) return 'Guaranteed';
  return 'Burstable';
}

export type KubeletCgroupDriver = 'cgroupfs' | 'systemd';

/** The pod cgroup the kubelet puts in LinuxPodSandboxConfig.cgroup_parent. */
export function podCgroupParent(qos: QosClass, uid: string, driver: KubeletCgroupDriver): string {
  const tier = qos === 'Guaranteed' ? '' : qos.toLowerCase();
  if (driver === 'cgroupfs') return `/kubepods/${tier === '' ? '' : `${tier}/`}pod${uid}`;
  // The systemd driver names the leaf slice; systemd escapes '-' in unit names, hence '_'.
  return `kubepods-${tier === '' ? '' : `${tier}-`}pod${uid.replace(/-/g, '_')}.slice`;
}
