import { describe, expect, it } from 'vitest';
import type { KataError } from '../../../src/common/errors.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import type { PodSandboxConfigInput } from '../../../src/sizing/input.js';
import { planSizing } from '../../../src/sizing/shape.js';
import { BIG_HOST, type ContainerSpec, failureOf, handlerNamed, podWith } from '../../helpers/sizing-pods.js';

const MiB = 1024 * 1024;

function plan(config: PodSandboxConfigInput, handler = 'kata-ts', host: { cpus: number; memoryMiB: number } = BIG_HOST) {
  return planSizing({ config, handler: handlerNamed(handler), host });
}

function planOf(containers: ContainerSpec[], podLevel?: { requests?: Record<string, string>; limits?: Record<string, string> }) {
  return plan(podWith(containers, podLevel));
}

describe('planSizing: VM shape from pod_resources (default handler: guest 250m/160Mi, vmm 100m/96Mi)', () => {
  it('gives a BestEffort pod the handler defaults, with hot-plug headroom', () => {
    const p = planOf([{ name: 'app' }]);
    expect(p.source).toBe('pod_resources');
    expect(p.vm).toEqual({ vcpus: 1, maxVcpus: 5, memoryMiB: 512, maxMemoryMiB: 512 + 4096, hugepages: [], kernelParams: [] });
    expect(p.host).toEqual({ memoryLimitBytes: (512 + 96) * MiB, cpuQuotaMillicores: 1100, cpuRequestMillicores: 100 });
  });

  it('adds the guest overhead and rounds vCPUs up', () => {
    const p = planOf([{ name: 'app', requests: { cpu: '1', memory: '1Gi' }, limits: { cpu: '1750m', memory: '1Gi' } }]);
    expect(p.workload.cpuLimitMillicores).toBe(1750);
    expect(p.vm.vcpus).toBe(2); // ceil((1750 + 250) / 1000)
    expect(p.vm.memoryMiB).toBe(1024 + 160);
    expect(p.host.cpuQuotaMillicores).toBe(2100);
    expect(p.host.cpuRequestMillicores).toBe(1100);
  });

  it('counts a container without a limit with its request', () => {
    const p = planOf([
      { name: 'a', requests: { cpu: '1500m', memory: '300Mi' } },
      { name: 'b', requests: { cpu: '500m', memory: '100Mi' }, limits: { cpu: '1', memory: '200Mi' } },
    ]);
    expect(p.workload.cpuLimitMillicores).toBe(2500);
    expect(p.workload.memoryLimitBytes).toBe(500 * MiB);
    expect(p.containers.map((c) => [c.name, c.cpuLimitMillicores, c.memoryLimitBytes])).toEqual([
      ['a', null, null],
      ['b', 1000, 200 * MiB],
    ]);
  });

  it('floors a small, fully bounded pod at minMemoryMiB, and an unbounded one at the default', () => {
    expect(planOf([{ name: 'app', limits: { cpu: '100m', memory: '32Mi' } }]).vm.memoryMiB).toBe(256);
    // A second container that states no memory may use any amount: the default applies.
    expect(planOf([{ name: 'app', limits: { cpu: '100m', memory: '32Mi' } }, { name: 'free' }]).vm.memoryMiB).toBe(512);
  });

  it('rounds memory up to whole MiB and aligns boot memory to 2 MiB', () => {
    // 1000M = 953.67 MiB -> 954 MiB, + 160 = 1114 (even)
    expect(planOf([{ name: 'a', limits: { cpu: '1', memory: '1000M' } }]).vm.memoryMiB).toBe(954 + 160);
    expect(planOf([{ name: 'a', limits: { cpu: '1', memory: '1001Mi' } }]).vm.memoryMiB).toBe(1162); // 1161 -> 1162
  });

  it('reserves hugepages in the guest and adds them to VM memory', () => {
    const p = planOf([
      {
        name: 'db',
        limits: { cpu: '2', memory: '2Gi', 'hugepages-1Gi': '2Gi', 'hugepages-2Mi': '100Mi' },
      },
    ]);
    expect(p.vm.hugepages).toEqual([
      { pageSize: '2Mi', pageSizeBytes: 2 * MiB, count: 50 },
      { pageSize: '1Gi', pageSizeBytes: 1024 * MiB, count: 2 },
    ]);
    expect(p.vm.kernelParams).toEqual(['hugepagesz=2M', 'hugepages=50', 'hugepagesz=1G', 'hugepages=2']);
    expect(p.vm.memoryMiB).toBe(2048 + 160 + 100 + 2048);
    expect(p.workload.hugepages).toEqual({ '2Mi': 100 * MiB, '1Gi': 2048 * MiB });
  });

  it('treats hugepages-2048Ki as the 2Mi pool and rounds a partial page up', () => {
    const p = planOf([{ name: 'a', limits: { cpu: '1', memory: '1Gi', 'hugepages-2048Ki': '3Mi' } }]);
    expect(p.vm.hugepages).toEqual([{ pageSize: '2Mi', pageSizeBytes: 2 * MiB, count: 2 }]);
  });

  it('carries extended resources through', () => {
    const p = planOf([
      { name: 'a', limits: { cpu: '1', memory: '1Gi', 'nvidia.com/gpu': '2' } },
      { name: 'b', limits: { cpu: '1', memory: '1Gi', 'example.com/fpga': '1', 'nvidia.com/gpu': '1' } },
    ]);
    expect(p.workload.extended).toEqual({ 'example.com/fpga': '1', 'nvidia.com/gpu': '3' });
  });

  it('sizes for the peak of init containers and sidecars', () => {
    const p = planOf([
      { name: 'proxy', type: 'SIDECAR_CONTAINER', limits: { cpu: '500m', memory: '128Mi' } },
      { name: 'migrate', type: 'INIT_CONTAINER', limits: { cpu: '3', memory: '2Gi' } },
      { name: 'app', limits: { cpu: '1', memory: '512Mi' } },
    ]);
    expect(p.workload.cpuLimitMillicores).toBe(3500);
    expect(p.workload.memoryLimitBytes).toBe(2048 * MiB + 128 * MiB);
  });

  it('lets pod-level resources replace the aggregate for the resources they name', () => {
    const p = planOf(
      [
        { name: 'a', requests: { cpu: '500m', memory: '256Mi' } },
        { name: 'b', requests: { cpu: '500m', memory: '256Mi' }, limits: { memory: '1Gi' } },
      ],
      { limits: { cpu: '4' } },
    );
    expect(p.workload.cpuRequestMillicores).toBe(1000); // defaulted to the containers' requests
    expect(p.workload.cpuLimitMillicores).toBe(4000);
    expect(p.workload.memoryLimitBytes).toBe(256 * MiB + 1024 * MiB); // not named: aggregate
    expect(p.vm.vcpus).toBe(5);
  });

  it('defaults a pod-level request to the pod-level limit when no container requests it', () => {
    const p = planOf([{ name: 'a' }], { limits: { cpu: '2', memory: '1Gi' } });
    expect(p.workload).toMatchObject({ cpuRequestMillicores: 2000, cpuLimitMillicores: 2000, memoryRequestBytes: 1024 * MiB });
    expect(p.vm.memoryMiB).toBe(1024 + 160); // pod-level memory bounds the pod: no default floor
  });

  const withOverhead = (cpuQuota: number, memoryMiB: number) => {
    const config = podWith([{ name: 'a', limits: { cpu: '1', memory: '1Gi' } }]);
    config.linux = {
      cgroup_parent: '',
      overhead: { cpu_period: '100000', cpu_quota: String(cpuQuota), cpu_shares: '256', memory_limit_in_bytes: String(memoryMiB * MiB) },
      resources: null,
    };
    return plan(config);
  };

  it('gives the VMM what a RuntimeClass overhead leaves after the guest overhead, so the budget is the limits plus the overhead', () => {
    const p = withOverhead(40000, 300); // 400m / 300Mi: guest 250m / 160Mi, the VMM the rest
    expect(p.vmmOverhead).toEqual({ cpuSource: 'pod_overhead', memorySource: 'pod_overhead', cpuMillicores: 150, memoryBytes: 140 * MiB });
    expect(p.host.memoryLimitBytes).toBe((1024 + 160 + 140) * MiB);
    expect(p.host.memoryLimitBytes).toBe((1024 + 300) * MiB); // what the kubelet gives the pod's cgroup
    expect(p.host.cpuQuotaMillicores).toBe(2 * 1000 + 150);
    expect(p.overheadShortfallBytes).toBeUndefined();
  });

  it("keeps the handler's VMM overhead under a RuntimeClass overhead too small for the VM, and says by how much it falls short", () => {
    const p = withOverhead(25000, 160); // 250m / 160Mi: only the guest's share
    expect(p.vmmOverhead).toEqual({ cpuSource: 'handler', memorySource: 'handler', cpuMillicores: 100, memoryBytes: 96 * MiB });
    expect(p.host.memoryLimitBytes).toBe((1024 + 160 + 96) * MiB);
    expect(p.overheadShortfallBytes).toBe(96 * MiB); // budget - (1024 limits + 160 overhead)
    // An empty overhead (a RuntimeClass without one): the whole guest and VMM overhead is short.
    expect(withOverhead(0, 0).overheadShortfallBytes).toBe((160 + 96) * MiB);
    // No overhead field at all (a shim behind containerd is told none): unknown, so not reported.
    expect(plan(podWith([{ name: 'a', limits: { cpu: '1', memory: '1Gi' } }])).overheadShortfallBytes).toBeUndefined();
  });

  it('reports no shortfall for a pod whose memory is unbounded (the kubelet sets no limit to fall short of)', () => {
    expect(plan(podWith([{ name: 'a' }])).overheadShortfallBytes).toBeUndefined();
  });

  it('bounds hot-plug headroom by the handler, the host and 128 MiB blocks', () => {
    const p = plan(podWith([{ name: 'a', limits: { cpu: '2', memory: '1Gi' } }]), 'kata-ts', { cpus: 4, memoryMiB: 3000 });
    expect(p.vm.vcpus).toBe(3);
    expect(p.vm.maxVcpus).toBe(4); // 3 + 4 bounded by 4 host CPUs
    // 3000 - 1184 = 1816 MiB of room -> 14 blocks of 128 MiB = 1792
    expect(p.vm.maxMemoryMiB).toBe(1184 + 1792);
    expect((p.vm.maxMemoryMiB - p.vm.memoryMiB) % 128).toBe(0);
  });

  it('gives the confidential handler no headroom: max == boot', () => {
    const p = plan(podWith([{ name: 'a', limits: { cpu: '2', memory: '1Gi' } }]), 'kata-ts-cvm');
    expect(p.vm.maxVcpus).toBe(p.vm.vcpus);
    expect(p.vm.maxMemoryMiB).toBe(p.vm.memoryMiB);
  });
});

describe('planSizing: refusals', () => {
  it.each<[string, ContainerSpec[], string]>([
    ['limit below request', [{ name: 'a', requests: { cpu: '2' }, limits: { cpu: '1' } }], 'invalid/SIZING_LIMIT_BELOW_REQUEST'],
    ['duplicate names', [{ name: 'a' }, { name: 'a', type: 'INIT_CONTAINER' }], 'invalid/SIZING_DUPLICATE_CONTAINER'],
    ['empty name', [{ name: '' }], 'invalid/SIZING_CONTAINER_NAME_MISSING'],
    ['unknown type name', [{ name: 'a', type: 'EPHEMERAL_CONTAINER' }], 'invalid/SIZING_CONTAINER_TYPE_UNKNOWN'],
    ['unknown type number', [{ name: 'a', type: 7 }], 'invalid/SIZING_CONTAINER_TYPE_UNKNOWN'],
    ['unknown resource', [{ name: 'a', limits: { gpu: '1' } }], 'invalid/SIZING_RESOURCE_UNKNOWN'],
    ['kubernetes.io resource', [{ name: 'a', limits: { 'kubernetes.io/batch-cpu': '1' } }], 'invalid/SIZING_RESOURCE_UNKNOWN'],
    [
      'unsupported hugepage size',
      [{ name: 'a', limits: { memory: '1Gi', 'hugepages-16Gi': '16Gi' } }],
      'invalid/SIZING_HUGEPAGE_SIZE_UNSUPPORTED',
    ],
    ['malformed quantity', [{ name: 'a', limits: { cpu: 'lots' } }], 'invalid/QUANTITY_MALFORMED'],
    ['negative quantity', [{ name: 'a', requests: { memory: '-1Gi' } }], 'invalid/QUANTITY_NEGATIVE'],
    ['fractional GPU', [{ name: 'a', limits: { 'nvidia.com/gpu': '500m' } }], 'invalid/SIZING_EXTENDED_NOT_INTEGER'],
    [
      'GPU request differs from limit',
      [{ name: 'a', requests: { 'nvidia.com/gpu': '1' }, limits: { 'nvidia.com/gpu': '2' } }],
      'invalid/SIZING_REQUEST_NOT_EQUAL_LIMIT',
    ],
    ['more vCPUs than the handler allows', [{ name: 'a', limits: { cpu: '40' } }], 'exhausted/SIZING_VCPUS_EXCEED_HANDLER'],
    ['more memory than the handler allows', [{ name: 'a', limits: { memory: '70Gi' } }], 'exhausted/SIZING_MEMORY_EXCEEDS_HANDLER'],
  ])('%s', (_name, containers, expected) => {
    expect(failureOf(() => planOf(containers))).toBe(expected);
  });

  it('refuses pod_resources without containers', () => {
    expect(failureOf(() => planOf([]))).toBe('invalid/SIZING_POD_RESOURCES_EMPTY');
  });

  it('treats a zero limit as no limit, like the kubelet', () => {
    expect(planOf([{ name: 'a', limits: { cpu: '1', memory: '0' } }]).vm.memoryMiB).toBe(512);
    expect(planOf([{ name: 'a', limits: { cpu: '1', memory: '64Mi' } }]).vm.memoryMiB).toBe(256);
  });

  it.each<[string, { requests?: Record<string, string>; limits?: Record<string, string> }, string]>([
    ['pod-level extended resource', { limits: { 'nvidia.com/gpu': '1' } }, 'invalid/SIZING_POD_LEVEL_RESOURCE_UNSUPPORTED'],
    ['pod-level request below the containers', { requests: { cpu: '500m' } }, 'invalid/SIZING_POD_REQUEST_BELOW_CONTAINERS'],
    ['pod-level limit below the containers requests', { limits: { memory: '100Mi' } }, 'invalid/SIZING_LIMIT_BELOW_REQUEST'],
    ['pod-level limit below its request', { requests: { cpu: '3' }, limits: { cpu: '2' } }, 'invalid/SIZING_LIMIT_BELOW_REQUEST'],
  ])('%s', (_name, podLevel, expected) => {
    const containers: ContainerSpec[] = [{ name: 'a', requests: { cpu: '1', memory: '200Mi' } }];
    expect(failureOf(() => planOf(containers, podLevel))).toBe(expected);
  });

  it('refuses a container limit above the pod-level limit', () => {
    const containers: ContainerSpec[] = [{ name: 'a', requests: { cpu: '1' }, limits: { cpu: '3' } }];
    expect(failureOf(() => planOf(containers, { requests: { cpu: '2' }, limits: { cpu: '2' } }))).toBe(
      'invalid/SIZING_CONTAINER_LIMIT_ABOVE_POD_LIMIT',
    );
  });

  it('refuses a pod larger than the host, with the numbers in the message', () => {
    try {
      plan(podWith([{ name: 'a', limits: { cpu: '3', memory: '1Gi' } }]), 'kata-ts', { cpus: 2, memoryMiB: 8192 });
      expect.unreachable();
    } catch (err) {
      const e = err as KataError;
      expect(`${e.kind}/${e.reason}`).toBe('exhausted/SIZING_VCPUS_EXCEED_HOST');
      expect(e.message).toBe('pod default/test needs 4 vCPUs (3000m workload + 250m guest overhead) but this host has 2 CPUs');
    }
    expect(failureOf(() => plan(podWith([{ name: 'a', limits: { memory: '3Gi' } }]), 'kata-ts', { cpus: 8, memoryMiB: 3000 }))).toBe(
      'exhausted/SIZING_MEMORY_EXCEEDS_HOST',
    );
  });

  it('names the offending field in an invalid-input message', () => {
    try {
      planOf([{ name: 'a' }, { name: 'b', requests: { memory: '2Gi' }, limits: { memory: '1Gi' } }]);
      expect.unreachable();
    } catch (err) {
      expect((err as Error).message).toBe(
        'config.pod_resources.containers[1].kubernetes_resources.limits["memory"] is 1Gi, below its request of 2Gi',
      );
    }
  });

  it('does not depend on anything but its inputs (config objects are not modified)', () => {
    const config = podWith([{ name: 'a', limits: { cpu: '1', memory: '1Gi' } }]);
    const before = JSON.stringify(config);
    const first = plan(config);
    expect(JSON.stringify(config)).toBe(before);
    expect(plan(config)).toEqual(first);
    expect(defaultConfig().handlers['kata-ts']!.vm.defaultVcpus).toBe(1);
  });
});
