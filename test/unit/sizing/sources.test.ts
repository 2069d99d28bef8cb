import { describe, expect, it } from 'vitest';
import type { LinuxContainerResourcesInput, PodSandboxConfigInput } from '../../../src/sizing/input.js';
import { planSizing } from '../../../src/sizing/shape.js';
import type { SizingSource, VmmOverheadSource } from '../../../src/sizing/types.js';
import { BIG_HOST, failureOf, handlerNamed, podWith } from '../../helpers/sizing-pods.js';

const MiB = 1024 * 1024;

function sandbox(parts: {
  resources?: LinuxContainerResourcesInput | null;
  overhead?: LinuxContainerResourcesInput | null;
  annotations?: Record<string, string>;
}): PodSandboxConfigInput {
  return {
    metadata: { name: 'p', namespace: 'ns', uid: 'u', attempt: 0 },
    annotations: parts.annotations ?? {},
    linux: { cgroup_parent: '/kubepods/burstable/podu', resources: parts.resources ?? null, overhead: parts.overhead ?? null },
    pod_resources: null,
  };
}

/** What a kubelet >= 1.23 sends for a pod with the given summed requests/limits (cgroup numbers). */
function kubeletResources(shares: number, quota: number, memory: number): LinuxContainerResourcesInput {
  return {
    cpu_period: '100000',
    cpu_quota: String(quota),
    cpu_shares: String(shares),
    memory_limit_in_bytes: String(memory),
    oom_score_adj: '0',
    cpuset_cpus: '',
    cpuset_mems: '',
    hugepage_limits: [],
    unified: {},
    memory_swap_limit_in_bytes: '0',
  };
}

/** An empty LinuxContainerResources as proto-loader decodes it (what a kubelet sends for "no overhead"). */
function zeroResources(): LinuxContainerResourcesInput {
  return { ...kubeletResources(0, 0, 0), cpu_period: '0' };
}

interface SourceCase {
  name: string;
  config: PodSandboxConfigInput;
  source: SizingSource;
  cpuRequestMillicores: number;
  cpuLimitMillicores: number;
  memoryLimitBytes: number;
  vcpus: number;
  memoryMiB: number;
}

const CASES: SourceCase[] = [
  {
    name: 'pod_resources wins over everything else',
    config: {
      ...podWith([{ name: 'a', limits: { cpu: '1', memory: '256Mi' } }]),
      linux: { resources: kubeletResources(4096, 400000, 4096 * MiB), overhead: null },
      annotations: { 'io.kubernetes.cri.sandbox-cpu-quota': '800000' },
    },
    source: 'pod_resources',
    cpuRequestMillicores: 1000,
    cpuLimitMillicores: 1000,
    memoryLimitBytes: 256 * MiB,
    vcpus: 2,
    memoryMiB: 416,
  },
  {
    name: 'linux.resources of a Guaranteed pod (2 CPUs, 1Gi)',
    config: sandbox({ resources: kubeletResources(2048, 200000, 1024 * MiB) }),
    source: 'linux_resources',
    cpuRequestMillicores: 2000,
    cpuLimitMillicores: 2000,
    memoryLimitBytes: 1024 * MiB,
    vcpus: 3,
    memoryMiB: 1184,
  },
  {
    name: 'linux.resources of a Burstable pod whose limits cover only some containers (shares > quota)',
    config: sandbox({ resources: kubeletResources(1536, 50000, 0) }),
    source: 'linux_resources',
    cpuRequestMillicores: 1500,
    cpuLimitMillicores: 1500,
    memoryLimitBytes: 0,
    vcpus: 2,
    memoryMiB: 512,
  },
  {
    name: 'linux.resources of a BestEffort pod (2 shares = no request): handler defaults',
    config: sandbox({ resources: kubeletResources(2, 0, 0) }),
    source: 'linux_resources',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 0,
    memoryLimitBytes: 0,
    vcpus: 1,
    memoryMiB: 512,
  },
  {
    name: 'linux.resources with a non-default CFS period',
    config: sandbox({ resources: { cpu_period: '50000', cpu_quota: '75000', memory_limit_in_bytes: String(512 * MiB) } }),
    source: 'linux_resources',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 1500,
    memoryLimitBytes: 512 * MiB,
    vcpus: 2,
    memoryMiB: 672,
  },
  {
    name: 'an all-zero linux.resources falls through to containerd annotations',
    config: sandbox({
      resources: zeroResources(),
      annotations: {
        'io.kubernetes.cri.sandbox-cpu-period': '100000',
        'io.kubernetes.cri.sandbox-cpu-quota': '150000',
        'io.kubernetes.cri.sandbox-cpu-shares': '1536',
        'io.kubernetes.cri.sandbox-memory': String(512 * MiB),
      },
    }),
    source: 'containerd_annotations',
    cpuRequestMillicores: 1500,
    cpuLimitMillicores: 1500,
    memoryLimitBytes: 512 * MiB,
    vcpus: 2,
    memoryMiB: 672,
  },
  {
    name: 'containerd memory annotation alone',
    config: sandbox({ annotations: { 'io.kubernetes.cri.sandbox-memory': String(2048 * MiB) } }),
    source: 'containerd_annotations',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 0,
    memoryLimitBytes: 2048 * MiB,
    vcpus: 1,
    memoryMiB: 2208,
  },
  {
    name: 'CRI-O PodLinuxResources as CRI-O writes it (Go json tags: snake_case, numbers)',
    config: sandbox({
      annotations: {
        'io.kubernetes.cri-o.PodLinuxResources': JSON.stringify({
          cpu_period: 100000,
          cpu_quota: 300000,
          cpu_shares: 3072,
          memory_limit_in_bytes: 2048 * MiB,
        }),
      },
    }),
    source: 'crio_annotations',
    cpuRequestMillicores: 3000,
    cpuLimitMillicores: 3000,
    memoryLimitBytes: 2048 * MiB,
    vcpus: 4,
    memoryMiB: 2208,
  },
  {
    name: 'CRI-O PodLinuxResources in protobuf-JSON spelling (camelCase, int64 as strings)',
    config: sandbox({
      annotations: {
        'io.kubernetes.cri-o.PodLinuxResources': JSON.stringify({
          cpuPeriod: '100000',
          cpuQuota: '100000',
          memoryLimitInBytes: String(256 * MiB),
        }),
      },
    }),
    source: 'crio_annotations',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 1000,
    memoryLimitBytes: 256 * MiB,
    vcpus: 2,
    memoryMiB: 416,
  },
  {
    name: 'CRI-O new-style annotation name wins over the old one',
    config: sandbox({
      annotations: {
        'io.kubernetes.cri-o.PodLinuxResources': JSON.stringify({ cpu_quota: 900000 }),
        'pod-linux-resources.crio.io': JSON.stringify({ cpu_quota: 100000, memory_limit_in_bytes: 1024 * MiB }),
      },
    }),
    source: 'crio_annotations',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 1000,
    memoryLimitBytes: 1024 * MiB,
    vcpus: 2,
    memoryMiB: 1184,
  },
  {
    name: 'CRI-O "null" (a nil message marshalled) states nothing: handler defaults',
    config: sandbox({ annotations: { 'io.kubernetes.cri-o.PodLinuxResources': 'null' } }),
    source: 'handler_defaults',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 0,
    memoryLimitBytes: 0,
    vcpus: 1,
    memoryMiB: 512,
  },
  {
    name: 'nothing at all: handler defaults',
    config: { metadata: null, annotations: {}, linux: null, pod_resources: null },
    source: 'handler_defaults',
    cpuRequestMillicores: 0,
    cpuLimitMillicores: 0,
    memoryLimitBytes: 0,
    vcpus: 1,
    memoryMiB: 512,
  },
];

describe('planSizing: sources in order of precedence', () => {
  it.each(CASES)('$name', (c) => {
    const p = planSizing({ config: c.config, handler: handlerNamed(), host: BIG_HOST });
    expect(p.source).toBe(c.source);
    expect(p.workload).toMatchObject({
      cpuRequestMillicores: c.cpuRequestMillicores,
      cpuLimitMillicores: c.cpuLimitMillicores,
      memoryLimitBytes: c.memoryLimitBytes,
    });
    expect({ vcpus: p.vm.vcpus, memoryMiB: p.vm.memoryMiB }).toEqual({ vcpus: c.vcpus, memoryMiB: c.memoryMiB });
    if (c.source !== 'pod_resources') expect(p.containers).toEqual([]);
  });

  it('reads hugepage limits in the hugetlb cgroup spelling, skipping the zero entries the kubelet adds', () => {
    const resources = {
      ...kubeletResources(1024, 100000, 1024 * MiB),
      hugepage_limits: [
        { page_size: '2MB', limit: String(128 * MiB) },
        { page_size: '1GB', limit: '0' },
      ],
    };
    const p = planSizing({ config: sandbox({ resources }), handler: handlerNamed(), host: BIG_HOST });
    expect(p.vm.hugepages).toEqual([{ pageSize: '2Mi', pageSizeBytes: 2 * MiB, count: 64 }]);
    expect(p.vm.memoryMiB).toBe(1024 + 160 + 128);
  });

  it.each([
    [
      'a containerd annotation that is not an integer',
      sandbox({ annotations: { 'io.kubernetes.cri.sandbox-memory': '1Gi' } }),
      'invalid/SIZING_INTEGER_INVALID',
    ],
    [
      'a CRI-O annotation that is not JSON',
      sandbox({ annotations: { 'io.kubernetes.cri-o.PodLinuxResources': '{cpu' } }),
      'invalid/SIZING_ANNOTATION_INVALID',
    ],
    [
      'a CRI-O annotation that is a list',
      sandbox({ annotations: { 'io.kubernetes.cri-o.PodLinuxResources': '[]' } }),
      'invalid/SIZING_ANNOTATION_INVALID',
    ],
    [
      'a CRI-O field of the wrong type',
      sandbox({ annotations: { 'io.kubernetes.cri-o.PodLinuxResources': '{"cpu_quota": 1.5}' } }),
      'invalid/SIZING_INTEGER_INVALID',
    ],
    [
      'a hugepage size the guest lacks',
      sandbox({ resources: { hugepage_limits: [{ page_size: '64KB', limit: '65536' }] } }),
      'invalid/SIZING_HUGEPAGE_SIZE_UNSUPPORTED',
    ],
    [
      'a cgroup memory limit beyond the handler',
      sandbox({ resources: kubeletResources(2, 0, 128 * 1024 * MiB) }),
      'exhausted/SIZING_MEMORY_EXCEEDS_HANDLER',
    ],
  ])('refuses %s', (_name, config, expected) => {
    expect(failureOf(() => planSizing({ config, handler: handlerNamed(), host: BIG_HOST }))).toBe(expected);
  });

  it('names the annotation in the error', () => {
    try {
      planSizing({
        config: sandbox({ annotations: { 'io.kubernetes.cri.sandbox-cpu-quota': 'many' } }),
        handler: handlerNamed(),
        host: BIG_HOST,
      });
      expect.unreachable();
    } catch (err) {
      expect((err as Error).message).toBe('config.annotations["io.kubernetes.cri.sandbox-cpu-quota"] must be an integer, got "many"');
    }
  });
});

describe('planSizing: VMM overhead for the host budget', () => {
  const workload = kubeletResources(1024, 100000, 1024 * MiB);
  it.each<[string, PodSandboxConfigInput, VmmOverheadSource, VmmOverheadSource, number, number]>([
    ['the handler when nothing is given', sandbox({ resources: workload }), 'handler', 'handler', 100, 96 * MiB],
    // The kubelet sends an empty (all-zero) overhead for a pod without spec.overhead.
    [
      'the handler when linux.overhead is all zero',
      sandbox({ resources: workload, overhead: zeroResources() }),
      'handler',
      'handler',
      100,
      96 * MiB,
    ],
    // An overhead covers the guest's 250m / 160Mi first; the VMM gets the rest when it beats the handler's.
    [
      'linux.overhead (RuntimeClass podFixed 500m / 400Mi)',
      sandbox({ resources: workload, overhead: kubeletResources(512, 50000, 400 * MiB) }),
      'pod_overhead',
      'pod_overhead',
      250,
      240 * MiB,
    ],
    [
      'the handler when linux.overhead covers less than the guest overhead and the handler VMM',
      sandbox({ resources: workload, overhead: kubeletResources(256, 25000, 160 * MiB) }),
      'handler',
      'handler',
      100,
      96 * MiB,
    ],
    [
      'linux.overhead naming only memory: CPU from the handler',
      sandbox({ resources: workload, overhead: kubeletResources(2, 0, 512 * MiB) }),
      'handler',
      'pod_overhead',
      100,
      352 * MiB,
    ],
    [
      'CRI-O PodLinuxOverhead when linux.overhead is absent',
      sandbox({
        resources: workload,
        annotations: { 'io.kubernetes.cri-o.PodLinuxOverhead': JSON.stringify({ cpu_shares: 1024, memory_limit_in_bytes: 320 * MiB }) },
      }),
      'crio_annotations',
      'crio_annotations',
      750,
      160 * MiB,
    ],
  ])('%s', (_name, config, cpuSource, memorySource, cpu, memory) => {
    const p = planSizing({ config, handler: handlerNamed(), host: BIG_HOST });
    expect(p.vmmOverhead).toEqual({ cpuSource, memorySource, cpuMillicores: cpu, memoryBytes: memory });
    expect(p.host.memoryLimitBytes).toBe(p.vm.memoryMiB * MiB + memory);
    expect(p.host.cpuQuotaMillicores).toBe(p.vm.vcpus * 1000 + cpu);
    expect(p.host.cpuRequestMillicores).toBe(p.workload.cpuRequestMillicores + cpu);
  });
});

describe('planSizing: sizing annotations that cannot be parsed are refused, naming them', () => {
  const cd = (key: string, value: string) => sandbox({ annotations: { [`io.kubernetes.cri.sandbox-${key}`]: value } });
  const crio = (doc: unknown) => sandbox({ annotations: { 'io.kubernetes.cri-o.PodLinuxResources': JSON.stringify(doc) } });
  const message = (config: PodSandboxConfigInput): string => {
    try {
      planSizing({ config, handler: handlerNamed(), host: BIG_HOST });
    } catch (err) {
      return `${failureOf(() => {
        throw err;
      })} ${(err as Error).message}`;
    }
    return 'accepted';
  };
  it.each<[string, PodSandboxConfigInput, string]>([
    ['a negative containerd memory', cd('memory', '-5'), 'io.kubernetes.cri.sandbox-memory"] must be at least 0, got "-5"'],
    ['an empty containerd memory', cd('memory', ''), 'io.kubernetes.cri.sandbox-memory"] must be an integer, got ""'],
    ['a quantity where containerd writes bytes', cd('memory', '1Gi'), 'io.kubernetes.cri.sandbox-memory"] must be an integer, got "1Gi"'],
    ['a memory beyond int64', cd('memory', '99999999999999999999'), 'io.kubernetes.cri.sandbox-memory"] is out of the int64 range'],
    ['a quota below -1', cd('cpu-quota', '-2'), 'io.kubernetes.cri.sandbox-cpu-quota"] must be at least -1, got "-2"'],
    ['negative shares', cd('cpu-shares', '-1024'), 'io.kubernetes.cri.sandbox-cpu-shares"] must be at least 0'],
    ['a negative period', cd('cpu-period', '-100000'), 'io.kubernetes.cri.sandbox-cpu-period"] must be at least 0'],
    ['a period with spaces', cd('cpu-period', ' 100000'), 'io.kubernetes.cri.sandbox-cpu-period"] must be an integer'],
    [
      'a negative CRI-O memory',
      crio({ memory_limit_in_bytes: -5 }),
      'io.kubernetes.cri-o.PodLinuxResources"].memory_limit_in_bytes must be at least 0',
    ],
    ['a CRI-O document that is a list', crio([1]), 'must be a JSON object'],
    [
      'a negative CRI-O hugepage limit',
      crio({ hugepage_limits: [{ page_size: '2MB', limit: -1 }] }),
      'hugepage_limits[0].limit must be at least 0',
    ],
    [
      'a negative linux.resources memory',
      sandbox({ resources: { memory_limit_in_bytes: '-1' } }),
      'config.linux.resources.memory_limit_in_bytes must be at least 0',
    ],
  ])('%s', (_name, config, expected) => {
    const got = message(config);
    expect(got.startsWith('invalid/SIZING_')).toBe(true);
    expect(got).toContain(expected);
  });

  it.each<[string, PodSandboxConfigInput]>([
    // containerd's form for "no resources" (every number zero) and the kernel's "no quota".
    [
      'all-zero containerd annotations',
      sandbox({ annotations: { 'io.kubernetes.cri.sandbox-memory': '0', 'io.kubernetes.cri.sandbox-cpu-quota': '0' } }),
    ],
    ['a quota of -1 (no limit)', cd('cpu-quota', '-1')],
    // CRI-O marshals a nil LinuxContainerResources as null.
    ['a CRI-O null document', sandbox({ annotations: { 'io.kubernetes.cri-o.PodLinuxResources': 'null' } })],
  ])('reads %s as nothing given (handler defaults)', (_name, config) => {
    expect(planSizing({ config, handler: handlerNamed(), host: BIG_HOST }).source).toBe('handler_defaults');
  });
});
