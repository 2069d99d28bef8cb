import { invalid } from '../common/errors.js';
import type { HandlerProfile } from '../config/types.js';
import { emptyDemand, type PodDemand } from './demand.js';
import type { PodSandboxConfigInput } from './input.js';
import {
  CGROUP_NUMBER_MIN,
  type CgroupNumbers,
  cgroupNumbersOf,
  demandFromCgroupNumbers,
  parseCgroupNumber,
  quotaMillis,
  readCgroupNumbers,
  saysSomething,
  sharesMillis,
} from './linux-resources.js';
import { demandFromPodResources } from './pod-resources.js';
import type { VmmOverheadSource } from './types.js';

/**
 * Where a pod's size comes from, in order of precedence:
 * 1. `pod_resources` (KEP-4112): every container's requests and limits;
 * 2. `linux.resources` (kubelet >= 1.23: the pod's summed requests/limits as cgroup numbers);
 * 3. containerd's sandbox annotations (what containerd hands a shim, derived from 2.);
 * 4. CRI-O's PodLinuxResources annotation (CRI-O's JSON copy of 2.);
 * 5. nothing: the handler's defaults.
 * A source that is present but all zero states nothing and falls through to the next.
 */

/** containerd pkg/cri/annotations: integer strings set from LinuxPodSandboxConfig.resources. */
export const CONTAINERD_ANNOTATIONS = {
  cpuPeriod: 'io.kubernetes.cri.sandbox-cpu-period',
  cpuQuota: 'io.kubernetes.cri.sandbox-cpu-quota',
  cpuShares: 'io.kubernetes.cri.sandbox-cpu-shares',
  memory: 'io.kubernetes.cri.sandbox-memory',
} as const;

/**
 * CRI-O pkg/annotations: json.Marshal of LinuxPodSandboxConfig.resources / .overhead. Recent CRI-O
 * also writes the `*.crio.io` spellings, which win when both are present.
 */
export const CRIO_ANNOTATIONS = {
  resources: ['pod-linux-resources.crio.io', 'io.kubernetes.cri-o.PodLinuxResources'],
  overhead: ['pod-linux-overhead.crio.io', 'io.kubernetes.cri-o.PodLinuxOverhead'],
} as const;

function annotationPath(key: string): string {
  return `config.annotations[${JSON.stringify(key)}]`;
}

function containerdNumbers(annotations: Record<string, string>): CgroupNumbers | undefined {
  const keys = Object.values(CONTAINERD_ANNOTATIONS);
  if (!keys.some((k) => k in annotations)) return undefined;
  // containerd writes strconv.FormatInt of each number, never an empty string: '' is refused too.
  const read = (key: string, min: bigint): bigint => {
    if (annotations[key] === '') throw invalid('SIZING_INTEGER_INVALID', `${annotationPath(key)} must be an integer, got ""`);
    return parseCgroupNumber(annotations[key], annotationPath(key), min);
  };
  return {
    period: read(CONTAINERD_ANNOTATIONS.cpuPeriod, CGROUP_NUMBER_MIN.cpu_period),
    quota: read(CONTAINERD_ANNOTATIONS.cpuQuota, CGROUP_NUMBER_MIN.cpu_quota),
    shares: read(CONTAINERD_ANNOTATIONS.cpuShares, CGROUP_NUMBER_MIN.cpu_shares),
    memoryBytes: read(CONTAINERD_ANNOTATIONS.memory, CGROUP_NUMBER_MIN.memory_limit_in_bytes),
    hugepageBytes: new Map(),
  };
}

function snakeToCamel(name: string): string {
  return name.replace(/_(.)/g, (_m, c: string) => c.toUpperCase());
}

/** CRI-O's JSON annotation, accepting snake_case (Go json tags) and camelCase (protobuf JSON). */
function crioNumbers(annotations: Record<string, string>, keys: readonly string[]): CgroupNumbers | undefined {
  const key = keys.find((k) => k in annotations);
  if (key === undefined) return undefined;
  const at = annotationPath(key);
  let doc: unknown;
  try {
    doc = JSON.parse(annotations[key]!);
  } catch (cause) {
    throw invalid('SIZING_ANNOTATION_INVALID', `${at} is not JSON`, { cause });
  }
  // CRI-O marshals a nil message as `null`.
  if (doc === null) return undefined;
  if (typeof doc !== 'object' || Array.isArray(doc)) {
    throw invalid('SIZING_ANNOTATION_INVALID', `${at} must be a JSON object (LinuxContainerResources)`);
  }
  const object = doc as Record<string, unknown>;
  return readCgroupNumbers((name) => object[name] ?? object[snakeToCamel(name)], at);
}

/** Decide the pod's demand from the first source that states something. */
export function resolveDemand(config: PodSandboxConfigInput): PodDemand {
  if (config.pod_resources !== null && config.pod_resources !== undefined) {
    return demandFromPodResources(config.pod_resources);
  }
  const resources = config.linux?.resources;
  if (resources !== null && resources !== undefined) {
    const numbers = cgroupNumbersOf(resources, 'config.linux.resources');
    if (saysSomething(numbers)) return demandFromCgroupNumbers(numbers, 'linux_resources');
  }
  const annotations = config.annotations ?? {};
  const containerd = containerdNumbers(annotations);
  if (containerd !== undefined && saysSomething(containerd)) return demandFromCgroupNumbers(containerd, 'containerd_annotations');
  const crio = crioNumbers(annotations, CRIO_ANNOTATIONS.resources);
  if (crio !== undefined && saysSomething(crio)) return demandFromCgroupNumbers(crio, 'crio_annotations');
  return emptyDemand('handler_defaults');
}

/** The VMM's own consumption on the host, per resource, with where each number came from. */
export interface VmmOverhead {
  cpuMillis: bigint;
  memoryBytes: bigint;
  cpuSource: VmmOverheadSource;
  memorySource: VmmOverheadSource;
  /**
   * The memory of the pod overhead sent: 0 when one was sent without memory (a kubelet sends an
   * empty `linux.overhead` for a RuntimeClass without overhead); undefined when nothing says
   * (behind containerd, which passes no overhead to a shim, or a client that sends none).
   */
  podOverheadMemoryBytes?: bigint;
}

/** What a pod overhead covers besides the VMM: the guest's own overhead and QEMU's extra devices. */
export interface CoveredBesidesVmm {
  cpuMillis: bigint;
  memoryBytes: bigint;
}

const MIB = 1024n * 1024n;

/**
 * The VMM's own share of the host budget. A RuntimeClass overhead (the kubelet's `linux.overhead`,
 * else CRI-O's PodLinuxOverhead annotation) is what the pod costs beyond its containers, which is
 * what the kubelet adds to the pod's cgroup: the guest's overhead inside the VM, QEMU's translation
 * cache and balloon device (`covered`), and the VMM itself. What is left after `covered` goes to
 * the VMM, but never less than the handler's `vmmOverhead` (what QEMU needs whatever a RuntimeClass
 * says); so a RuntimeClass with exactly `kata-ts plan --overhead`'s podFixed plans the same VM and
 * budget as no overhead at all. Decided per resource, since a RuntimeClass may name only one. The
 * kubelet treats overhead as guaranteed, so quota and shares carry the same CPU.
 */
export function resolveVmmOverhead(config: PodSandboxConfigInput, handler: HandlerProfile, covered: CoveredBesidesVmm): VmmOverhead {
  const candidates: Array<{ numbers: CgroupNumbers; source: VmmOverheadSource }> = [];
  const overhead = config.linux?.overhead;
  if (overhead !== null && overhead !== undefined) {
    candidates.push({ numbers: cgroupNumbersOf(overhead, 'config.linux.overhead'), source: 'pod_overhead' });
  }
  const crio = crioNumbers(config.annotations ?? {}, CRIO_ANNOTATIONS.overhead);
  if (crio !== undefined) candidates.push({ numbers: crio, source: 'crio_annotations' });

  const result: VmmOverhead = {
    cpuMillis: BigInt(handler.vmmOverhead.cpuMillicores),
    memoryBytes: BigInt(handler.vmmOverhead.memoryMiB) * MIB,
    cpuSource: 'handler',
    memorySource: 'handler',
  };
  const cpu = candidates.find((c) => (quotaMillis(c.numbers) ?? sharesMillis(c.numbers)) !== undefined);
  if (cpu !== undefined) {
    const left = (quotaMillis(cpu.numbers) ?? sharesMillis(cpu.numbers)!) - covered.cpuMillis;
    if (left > result.cpuMillis) {
      result.cpuMillis = left;
      result.cpuSource = cpu.source;
    }
  }
  if (candidates.length > 0) result.podOverheadMemoryBytes = 0n;
  const memory = candidates.find((c) => c.numbers.memoryBytes > 0n);
  if (memory !== undefined) {
    result.podOverheadMemoryBytes = memory.numbers.memoryBytes;
    const left = memory.numbers.memoryBytes - covered.memoryBytes;
    if (left > result.memoryBytes) {
      result.memoryBytes = left;
      result.memorySource = memory.source;
    }
  }
  return result;
}
