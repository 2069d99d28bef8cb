import { describe, expect, it } from 'vitest';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { ContainerConfig__Output } from '../../../src/generated/runtime/v1/ContainerConfig.js';
import type { PodSandboxConfig__Output } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import {
  admitAnnounced,
  type ContainerConfigInput,
  compareCdiDevices,
  compareContainerType,
  compareDevices,
  compareKubernetesResources,
  compareMounts,
  KATA_CONTAINER_TYPE_ANNOTATION,
  KUBELET_CONTAINER_TYPE_ANNOTATION,
} from '../../../src/runtime/admission/index.js';
import type { MountInput } from '../../../src/sizing/input.js';

describe('quantities are compared by value', () => {
  const EQUAL: [string, string][] = [
    ['1000m', '1'],
    ['1Gi', '1073741824'],
    ['0.5', '500m'],
    ['1e3', '1k'],
    ['1k', '1000'],
    ['2048Ki', '2Mi'],
    ['128974848', '123Mi'],
    ['0.1', '100m'],
    ['1.5Gi', '1536Mi'],
    ['+1', '1'],
    ['0', '0m'],
    ['1E', '1e18'],
  ];
  it.each(EQUAL)('%s equals %s', (a, b) => {
    const diffs = compareKubernetesResources({ limits: { memory: { string: a } } }, { limits: { memory: { string: b } } });
    expect(diffs).toEqual([]);
  });

  const DIFFERENT: [string, string][] = [
    ['1Gi', '1G'],
    ['1Mi', '1M'],
    ['1', '1001m'],
    ['500m', '0.4'],
    ['1Ki', '1k'],
  ];
  it.each(DIFFERENT)('%s differs from %s', (a, b) => {
    expect(compareKubernetesResources({ limits: { cpu: { string: a } } }, { limits: { cpu: { string: b } } })).toEqual([
      { field: 'kubernetes_resources.limits.cpu', announced: a, received: b },
    ]);
  });

  it('treats absent and empty kubernetes_resources as equal', () => {
    expect(compareKubernetesResources(null, { requests: {}, limits: {} })).toEqual([]);
    expect(compareKubernetesResources({ requests: {}, limits: {} }, null)).toEqual([]);
    expect(compareKubernetesResources(undefined, null)).toEqual([]);
  });

  it('reports announced values missing from a null request, one per resource', () => {
    expect(
      compareKubernetesResources({ requests: { cpu: { string: '1' } }, limits: { 'example.com/foo': { string: '2' } } }, null),
    ).toEqual([
      { field: 'kubernetes_resources.requests.cpu', announced: '1', received: 'absent' },
      { field: 'kubernetes_resources.limits["example.com/foo"]', announced: '2', received: 'absent' },
    ]);
  });

  it('does not default a missing request to its limit (compared as sent)', () => {
    expect(
      compareKubernetesResources(
        { limits: { cpu: { string: '1' } } },
        { requests: { cpu: { string: '1' } }, limits: { cpu: { string: '1' } } },
      ),
    ).toEqual([{ field: 'kubernetes_resources.requests.cpu', announced: 'absent', received: '1' }]);
  });
});

const m = (container_path: string, extra: Partial<MountInput> = {}): MountInput => ({
  container_path,
  host_path: `/src${container_path}`,
  ...extra,
});

describe('mount order matters only between nested mounts', () => {
  const ROWS: [string, string[], string[], { announced: string; received: string } | null][] = [
    ['unrelated mounts reordered', ['/a', '/b', '/c'], ['/c', '/a', '/b'], null],
    ['a sibling sharing a prefix is not nested', ['/data', '/database'], ['/database', '/data'], null],
    ['nested mounts in the same order among others', ['/x', '/data', '/y', '/data/cache'], ['/data', '/y', '/data/cache', '/x'], null],
    [
      'nested mounts swapped',
      ['/data', '/data/cache'],
      ['/data/cache', '/data'],
      { announced: '"/data", "/data/cache"', received: '"/data/cache", "/data"' },
    ],
    [
      'a grandchild before its grandparent',
      ['/a', '/a/b', '/a/b/c'],
      ['/a/b/c', '/a', '/a/b'],
      { announced: '"/a", "/a/b", "/a/b/c"', received: '"/a/b/c", "/a", "/a/b"' },
    ],
    ['everything is under /', ['/', '/etc/hosts'], ['/etc/hosts', '/'], { announced: '"/", "/etc/hosts"', received: '"/etc/hosts", "/"' }],
    [
      'trailing slashes still nest',
      ['/data/', '/data/cache'],
      ['/data/cache', '/data/'],
      { announced: '"/data/", "/data/cache"', received: '"/data/cache", "/data/"' },
    ],
    [
      'two separate nests, one swapped',
      ['/a', '/a/1', '/b', '/b/1'],
      ['/a', '/a/1', '/b/1', '/b'],
      { announced: '"/b", "/b/1"', received: '"/b/1", "/b"' },
    ],
  ];
  it.each(ROWS)('%s', (_name, announced, received, expected) => {
    const diffs = compareMounts(
      announced.map((p) => m(p)),
      received.map((p) => m(p)),
    );
    expect(diffs).toEqual(expected === null ? [] : [{ field: 'mounts order', ...expected }]);
  });

  it('ignores the order against a mount present on one side only (that is its own difference)', () => {
    const diffs = compareMounts([m('/data'), m('/data/cache')], [m('/data/cache'), m('/data/cache/x')]);
    expect(diffs.map((d) => d.field)).toEqual(['mounts["/data"]', 'mounts["/data/cache/x"]']);
  });

  it('treats unset, 0 and PROPAGATION_PRIVATE propagation alike', () => {
    expect(compareMounts([m('/a'), m('/b', { propagation: 0 })], [m('/a', { propagation: 'PROPAGATION_PRIVATE' }), m('/b')])).toEqual([]);
    expect(compareMounts([m('/a', { propagation: 2 })], [m('/a', { propagation: 'PROPAGATION_BIDIRECTIONAL' })])).toEqual([]);
  });

  it('does not compare selinux_relabel or ID mappings', () => {
    expect(compareMounts([m('/a', { selinux_relabel: true })], [m('/a', { selinux_relabel: false })])).toEqual([]);
  });

  it('accepts the same repeated path repeated alike on both sides', () => {
    expect(compareMounts([m('/a'), m('/a', { readonly: true })], [m('/a'), m('/a', { readonly: true })])).toEqual([]);
    expect(compareMounts([m('/a'), m('/a', { readonly: true })], [m('/a', { readonly: true }), m('/a')])).toEqual([
      { field: 'mounts["/a"]', announced: '2 mounts at this path', received: '2 mounts at this path' },
    ]);
  });
});

describe('device permissions are compared as sets of letters', () => {
  const dev = (permissions: string): { container_path: string; host_path: string; permissions: string } => ({
    container_path: '/dev/x',
    host_path: '/dev/x',
    permissions,
  });
  const SAME: [string, string][] = [
    ['rw', 'wr'],
    ['rwm', 'mrw'],
    ['rrw', 'rw'],
    ['m', 'mm'],
    ['', ''],
  ];
  it.each(SAME)('%j equals %j', (a, b) => expect(compareDevices([dev(a)], [dev(b)])).toEqual([]));

  const DIFFERENT: [string, string, string, string][] = [
    ['r', 'rw', 'r', 'rw'],
    ['rwm', 'rw', 'rwm', 'rw'],
    ['', 'rwm', '""', 'rwm'],
    ['rw', 'rwx', 'rw', 'rwx'],
  ];
  it.each(DIFFERENT)('%j differs from %j', (a, b, shownA, shownB) =>
    expect(compareDevices([dev(a)], [dev(b)])).toEqual([{ field: 'devices["/dev/x"].permissions', announced: shownA, received: shownB }]),
  );

  it('does not compare the order of devices', () => {
    const a = { container_path: '/dev/a', host_path: '/dev/a', permissions: 'rw' };
    const b = { container_path: '/dev/b', host_path: '/dev/b', permissions: 'r' };
    expect(compareDevices([a, b], [b, a])).toEqual([]);
  });
});

describe('CDI devices are compared as a set of names', () => {
  const cdi = (...names: string[]): { name: string }[] => names.map((name) => ({ name }));
  it('ignores order and repetition', () => {
    expect(
      compareCdiDevices(cdi('vendor.com/gpu=0', 'vendor.com/gpu=1'), cdi('vendor.com/gpu=1', 'vendor.com/gpu=0', 'vendor.com/gpu=1')),
    ).toEqual([]);
  });
  it('names each name on one side only', () => {
    expect(compareCdiDevices(cdi('v.com/a=0', 'v.com/a=1'), cdi('v.com/a=1', 'v.com/a=2'))).toEqual([
      { field: 'CDI_devices["v.com/a=0"]', announced: 'present', received: 'absent' },
      { field: 'CDI_devices["v.com/a=2"]', announced: 'absent', received: 'present' },
    ]);
  });
});

describe('container type from the request annotations', () => {
  const K = KUBELET_CONTAINER_TYPE_ANNOTATION;
  const T = KATA_CONTAINER_TYPE_ANNOTATION;
  const ROWS: [string, Record<string, string>, number][] = [
    ['REGULAR_CONTAINER', {}, 0],
    ['INIT_CONTAINER', {}, 0],
    ['REGULAR_CONTAINER', { [K]: 'container' }, 0],
    ['INIT_CONTAINER', { [K]: 'init' }, 0],
    ['SIDECAR_CONTAINER', { [K]: 'init' }, 0],
    ['REGULAR_CONTAINER', { [K]: 'init' }, 1],
    ['SIDECAR_CONTAINER', { [K]: 'container' }, 1],
    ['REGULAR_CONTAINER', { [K]: 'ephemeral' }, 1],
    ['REGULAR_CONTAINER', { [K]: 'weird' }, 1],
    ['INIT_CONTAINER', { [T]: 'init' }, 0],
    ['SIDECAR_CONTAINER', { [T]: 'sidecar' }, 0],
    ['REGULAR_CONTAINER', { [T]: 'regular' }, 0],
    ['INIT_CONTAINER', { [T]: 'sidecar' }, 1],
    ['SIDECAR_CONTAINER', { [T]: 'init' }, 1],
    ['REGULAR_CONTAINER', { [T]: 'REGULAR_CONTAINER' }, 1],
    ['REGULAR_CONTAINER', { [T]: 'toString' }, 1],
    ['SIDECAR_CONTAINER', { [K]: 'init', [T]: 'sidecar' }, 0],
    ['INIT_CONTAINER', { [K]: 'init', [T]: 'sidecar' }, 1],
    ['INIT_CONTAINER', { [K]: 'container', [T]: 'sidecar' }, 2],
  ];
  it.each(ROWS)('announced %s with %j: %i difference(s)', (announced, annotations, count) => {
    const diffs = compareContainerType(announced, annotations);
    expect(diffs).toHaveLength(count);
    for (const d of diffs) {
      expect(d.field).toBe('type');
      expect(d.announced).toBe(announced);
    }
  });

  it('reads an announced type given as its enum number', () => {
    expect(compareContainerType(1, { [T]: 'sidecar' })).toEqual([]);
    expect(compareContainerType(2, { [T]: 'sidecar' })).toEqual([
      { field: 'type', announced: 'REGULAR_CONTAINER', received: '"sidecar" (annotation kata-ts.dev/container-type)' },
    ]);
  });
});

describe('decoded CRI messages (as grpc-js hands them to a handler)', () => {
  const sandbox = decodeProtoJson<PodSandboxConfig__Output>('runtime.v1.PodSandboxConfig', {
    metadata: { name: 'p', namespace: 'default', uid: 'u1' },
    podResources: {
      containers: [
        {
          name: 'app',
          type: 'REGULAR_CONTAINER',
          kubernetesResources: { requests: { cpu: { string: '250m' } }, limits: { memory: { string: '512Mi' } } },
          mounts: [
            { containerPath: '/data', hostPath: '/srv/data' },
            { containerPath: '/data/ro', hostPath: '/srv/ro', readonly: true },
          ],
          devices: [{ containerPath: '/dev/fuse', hostPath: '/dev/fuse', permissions: 'rwm' }],
          CDIDevices: [{ name: 'example.com/dev=a' }],
        },
      ],
    },
  });
  const request = (overrides: Record<string, unknown> = {}): ContainerConfig__Output =>
    decodeProtoJson<ContainerConfig__Output>('runtime.v1.ContainerConfig', {
      metadata: { name: 'app' },
      image: { image: 'busybox' },
      annotations: { [KUBELET_CONTAINER_TYPE_ANNOTATION]: 'container' },
      kubernetesResources: { requests: { cpu: { string: '0.25' } }, limits: { memory: { string: '536870912' } } },
      mounts: [
        { containerPath: '/data', hostPath: '/srv/data', propagation: 'PROPAGATION_PRIVATE' },
        { containerPath: '/data/ro', hostPath: '/srv/ro', readonly: true },
      ],
      devices: [{ containerPath: '/dev/fuse', hostPath: '/dev/fuse', permissions: 'mwr' }],
      CDIDevices: [{ name: 'example.com/dev=a' }],
      linux: { resources: { cpuShares: '256', memoryLimitInBytes: '536870912' } },
      ...overrides,
    });

  it('fit the input types without a cast and admit a matching request', () => {
    const received: ContainerConfigInput = request();
    const result = admitAnnounced(sandbox.pod_resources!, received);
    expect(result).toMatchObject({ ok: true, announced: { name: 'app' } });
  });

  it('refuse a changed request with every difference', () => {
    const result = admitAnnounced(
      sandbox.pod_resources!,
      request({
        kubernetesResources: { requests: { cpu: { string: '300m' } } },
        mounts: [
          { containerPath: '/data/ro', hostPath: '/srv/ro', readonly: false },
          { containerPath: '/data', hostPath: '/srv/data' },
        ],
      }),
    );
    expect(result.ok).toBe(false);
    if (!result.ok) {
      expect(result.differences).toEqual([
        { field: 'kubernetes_resources.requests.cpu', announced: '250m', received: '300m' },
        { field: 'kubernetes_resources.limits.memory', announced: '512Mi', received: 'absent' },
        { field: 'mounts["/data/ro"].readonly', announced: 'true', received: 'false' },
        { field: 'mounts order', announced: '"/data", "/data/ro"', received: '"/data/ro", "/data"' },
      ]);
    }
  });
});
