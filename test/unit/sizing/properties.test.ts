import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { loadPlanRequest } from '../../../src/cli/plan/load.js';
import { planJson } from '../../../src/cli/plan/output.js';
import type { PlanEnvironment } from '../../../src/cli/plan/report.js';
import { buildPlanReport } from '../../../src/cli/plan/report.js';
import { planSizing } from '../../../src/sizing/shape.js';
import type { SizingPlan } from '../../../src/sizing/types.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';
import { BIG_HOST, type ContainerSpec, handlerNamed, podWith } from '../../helpers/sizing-pods.js';

let env: PlanEnvironment;
beforeAll(async () => {
  env = await fixturePlanEnvironment({ ...BIG_HOST });
});

/**
 * An abstract pod, rendered two independent ways: as a Kubernetes manifest (converted by
 * src/manifest) and directly as the proto3-JSON RunPodSandboxRequest a KEP-4112 kubelet sends.
 * Amounts are kept within the default handler's ceilings so every generated pod is plannable.
 */
type Kind = 'INIT_CONTAINER' | 'SIDECAR_CONTAINER' | 'REGULAR_CONTAINER';

interface ModelContainer {
  kind: Kind;
  cpuRequest?: number; // millicores
  cpuLimitExtra?: number; // limit = request + extra (a limit without request when request is absent)
  memRequest?: number; // MiB
  memLimitExtra?: number;
  hugepages2Mi?: number; // pages
  gpus?: number;
}

interface ModelPod {
  containers: ModelContainer[];
  overhead?: { cpu: number; memory: number };
  podLevel?: { cpuLimit: number; cpuRequest?: number; memLimit: number; memRequest?: number };
  handler: 'kata-ts' | 'kata-ts-cvm';
  spellings: number; // picks quantity spellings
}

const containerArb: fc.Arbitrary<ModelContainer> = fc.record(
  {
    kind: fc.constantFrom<Kind>('INIT_CONTAINER', 'SIDECAR_CONTAINER', 'REGULAR_CONTAINER', 'REGULAR_CONTAINER'),
    cpuRequest: fc.integer({ min: 0, max: 1500 }),
    cpuLimitExtra: fc.integer({ min: 0, max: 500 }),
    memRequest: fc.integer({ min: 0, max: 1536 }),
    memLimitExtra: fc.integer({ min: 0, max: 512 }),
    hugepages2Mi: fc.integer({ min: 1, max: 32 }),
    gpus: fc.integer({ min: 1, max: 2 }),
  },
  { requiredKeys: ['kind'] },
);

// Pod-level limits exceed anything six containers can ask (6 x 2000m, 6 x 2048 MiB), so they are
// always consistent with the containers.
const podArb: fc.Arbitrary<ModelPod> = fc.record(
  {
    containers: fc.array(containerArb, { minLength: 1, maxLength: 6 }),
    overhead: fc.record({ cpu: fc.integer({ min: 10, max: 1000 }), memory: fc.integer({ min: 1, max: 512 }) }),
    podLevel: fc.record(
      {
        cpuLimit: fc.integer({ min: 12_000, max: 16_000 }),
        cpuRequest: fc.integer({ min: 12_000, max: 12_000 }),
        memLimit: fc.integer({ min: 12_288, max: 16_384 }),
        memRequest: fc.integer({ min: 12_288, max: 12_288 }),
      },
      { requiredKeys: ['cpuLimit', 'memLimit'] },
    ),
    handler: fc.constantFrom<ModelPod['handler']>('kata-ts', 'kata-ts-cvm'),
    spellings: fc.nat(),
  },
  { requiredKeys: ['containers', 'handler', 'spellings'] },
);

function cpuText(millis: number, variant: number): string {
  if (variant % 3 === 0 || millis % 1000 !== 0) return variant % 2 === 0 || millis % 100 !== 0 ? `${millis}m` : `${millis / 1000}`;
  return String(millis / 1000);
}

function memText(mib: number, variant: number): string {
  switch (variant % 4) {
    case 0:
      return `${mib}Mi`;
    case 1:
      return String(mib * 1024 * 1024);
    case 2:
      return `${mib * 1024}Ki`;
    default:
      return mib % 1024 === 0 && mib > 0 ? `${mib / 1024}Gi` : `${mib}Mi`;
  }
}

function amounts(c: ModelContainer, variant: number): { requests: Record<string, string>; limits: Record<string, string> } {
  const requests: Record<string, string> = {};
  const limits: Record<string, string> = {};
  if (c.cpuRequest !== undefined) requests.cpu = cpuText(c.cpuRequest, variant);
  if (c.cpuLimitExtra !== undefined) limits.cpu = cpuText((c.cpuRequest ?? 0) + c.cpuLimitExtra, variant + 1);
  if (c.memRequest !== undefined) requests.memory = memText(c.memRequest, variant);
  if (c.memLimitExtra !== undefined) limits.memory = memText((c.memRequest ?? 0) + c.memLimitExtra, variant + 1);
  if (c.hugepages2Mi !== undefined) limits['hugepages-2Mi'] = memText(c.hugepages2Mi * 2, variant);
  if (c.gpus !== undefined) limits['nvidia.com/gpu'] = String(c.gpus);
  // Kubernetes: a cpu/memory request never exceeds its limit, so a limit-less request is fine
  // and a request-less limit defaults the request to it.
  if (limits.cpu === undefined && requests.cpu === undefined) delete limits.cpu;
  return { requests, limits };
}

/** Init and sidecar containers keep their relative order; regular ones follow. */
function ordered(pod: ModelPod): Array<{ c: ModelContainer; name: string }> {
  const named = pod.containers.map((c, i) => ({ c, name: `c${i}` }));
  return [...named.filter((x) => x.c.kind !== 'REGULAR_CONTAINER'), ...named.filter((x) => x.c.kind === 'REGULAR_CONTAINER')];
}

function manifestText(pod: ModelPod): string {
  const toContainer = ({ c, name }: { c: ModelContainer; name: string }, init: boolean) => ({
    name,
    image: 'busybox',
    ...(init && c.kind === 'SIDECAR_CONTAINER' ? { restartPolicy: 'Always' } : {}),
    resources: amounts(c, pod.spellings),
  });
  const list = ordered(pod);
  const regular = list.filter((x) => x.c.kind === 'REGULAR_CONTAINER');
  const doc = {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: 'prop', namespace: 'test', uid: '00000000-0000-4000-8000-000000000001' },
    spec: {
      runtimeClassName: pod.handler,
      ...(pod.overhead === undefined ? {} : { overhead: { cpu: `${pod.overhead.cpu}m`, memory: `${pod.overhead.memory}Mi` } }),
      ...(pod.podLevel === undefined ? {} : { resources: podLevelAmounts(pod.podLevel, pod.spellings) }),
      initContainers: list.filter((x) => x.c.kind !== 'REGULAR_CONTAINER').map((x) => toContainer(x, true)),
      // A pod needs a regular container; add an idle one when the model has none.
      containers: (regular.length > 0 ? regular : [{ c: { kind: 'REGULAR_CONTAINER' as Kind }, name: 'idle' }]).map((x) =>
        toContainer(x, false),
      ),
    },
  };
  return pod.spellings % 2 === 0 ? stringify(doc) : JSON.stringify(doc);
}

function podLevelAmounts(p: NonNullable<ModelPod['podLevel']>, variant: number) {
  const requests: Record<string, string> = {};
  if (p.cpuRequest !== undefined) requests.cpu = cpuText(p.cpuRequest, variant);
  if (p.memRequest !== undefined) requests.memory = memText(p.memRequest, variant);
  return { requests, limits: { cpu: cpuText(p.cpuLimit, variant + 1), memory: memText(p.memLimit, variant + 1) } };
}

/** The RunPodSandboxRequest written by hand from the model, with other quantity spellings. */
function requestJson(pod: ModelPod): string {
  const wrap = (m: Record<string, string>) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, { string: v }]));
  const list = ordered(pod);
  const hasRegular = list.some((x) => x.c.kind === 'REGULAR_CONTAINER');
  const containers = [...list, ...(hasRegular ? [] : [{ c: { kind: 'REGULAR_CONTAINER' as Kind }, name: 'idle' }])].map(({ c, name }) => {
    const a = amounts(c, pod.spellings + 2);
    return { name, type: c.kind, kubernetesResources: { requests: wrap(a.requests), limits: wrap(a.limits) } };
  });
  const MiB = 1024 * 1024;
  const overhead =
    pod.overhead === undefined
      ? {}
      : {
          cpuPeriod: '100000',
          cpuQuota: String(pod.overhead.cpu * 100),
          cpuShares: String(Math.floor((pod.overhead.cpu * 1024) / 1000)),
          memoryLimitInBytes: String(pod.overhead.memory * MiB),
        };
  const podLevel = pod.podLevel === undefined ? undefined : podLevelAmounts(pod.podLevel, pod.spellings + 2);
  return JSON.stringify({
    config: {
      metadata: { name: 'prop', namespace: 'test', uid: '00000000-0000-4000-8000-000000000001' },
      linux: { overhead },
      podResources: {
        containers,
        ...(podLevel === undefined ? {} : { kubernetesResources: { requests: wrap(podLevel.requests), limits: wrap(podLevel.limits) } }),
      },
    },
    runtimeHandler: pod.handler,
  });
}

function planText(text: string, file: string): unknown {
  const { request } = loadPlanRequest(text, file);
  return planJson(buildPlanReport(request, env));
}

describe('sizing properties (fast-check)', () => {
  it('the manifest and the proto3 JSON request of the same pod plan identically', () => {
    fc.assert(
      fc.property(podArb, (pod) => {
        expect(planText(manifestText(pod), 'pod.yaml')).toEqual(planText(requestJson(pod), 'request.json'));
      }),
      { numRuns: 150 },
    );
  });

  function toSpec(c: ModelContainer, name: string): ContainerSpec {
    return { name, type: c.kind, ...amounts(c, 0) };
  }

  function hugepagePages(p: SizingPlan): number {
    return p.vm.hugepages.reduce((n, h) => n + h.count * (h.pageSizeBytes / (2 * 1024 * 1024)), 0);
  }

  it('adding a container never shrinks the VM', () => {
    fc.assert(
      fc.property(
        fc.array(containerArb, { minLength: 1, maxLength: 5 }),
        containerArb,
        fc.nat(),
        fc.constantFrom('kata-ts', 'kata-ts-cvm'),
        (containers, added, position, handlerName) => {
          const specs = containers.map((c, i) => toSpec(c, `c${i}`));
          const before = planSizing({ config: podWith(specs), handler: handlerNamed(handlerName), host: BIG_HOST });
          const grown = [...specs];
          grown.splice(position % (specs.length + 1), 0, toSpec(added, 'added'));
          const after = planSizing({ config: podWith(grown), handler: handlerNamed(handlerName), host: BIG_HOST });
          expect(after.vm.vcpus).toBeGreaterThanOrEqual(before.vm.vcpus);
          expect(after.vm.maxVcpus).toBeGreaterThanOrEqual(before.vm.maxVcpus);
          expect(after.vm.memoryMiB).toBeGreaterThanOrEqual(before.vm.memoryMiB);
          expect(hugepagePages(after)).toBeGreaterThanOrEqual(hugepagePages(before));
          expect(after.host.memoryLimitBytes).toBeGreaterThanOrEqual(before.host.memoryLimitBytes);
          expect(after.host.cpuQuotaMillicores).toBeGreaterThanOrEqual(before.host.cpuQuotaMillicores);
          expect(after.workload.cpuRequestMillicores).toBeGreaterThanOrEqual(before.workload.cpuRequestMillicores);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('the VM always fits the workload plus the guest overhead, within the handler and the host', () => {
    fc.assert(
      fc.property(fc.array(containerArb, { minLength: 1, maxLength: 6 }), (containers) => {
        const handler = handlerNamed();
        const p = planSizing({ config: podWith(containers.map((c, i) => toSpec(c, `c${i}`))), handler, host: BIG_HOST });
        const { vm, guestOverhead } = handler.profile;
        expect(p.vm.vcpus * 1000).toBeGreaterThanOrEqual(p.workload.cpuLimitMillicores + guestOverhead.cpuMillicores);
        const hugepageBytes = Object.values(p.workload.hugepages).reduce((a, b) => a + b, 0);
        expect(p.vm.memoryMiB * 1024 * 1024).toBeGreaterThanOrEqual(
          p.workload.memoryLimitBytes + guestOverhead.memoryMiB * 1024 * 1024 + hugepageBytes,
        );
        expect(p.vm.memoryMiB % 2).toBe(0);
        expect((p.vm.maxMemoryMiB - p.vm.memoryMiB) % 128).toBe(0);
        expect(p.vm.memoryMiB).toBeGreaterThanOrEqual(vm.minMemoryMiB);
        expect(p.vm.maxVcpus).toBeLessThanOrEqual(Math.min(vm.maxVcpus, BIG_HOST.cpus));
        expect(p.vm.maxMemoryMiB).toBeLessThanOrEqual(vm.maxMemoryMiB);
        expect(p.workload.cpuLimitMillicores).toBeGreaterThanOrEqual(p.workload.cpuRequestMillicores);
      }),
      { numRuns: 200 },
    );
  });
});
