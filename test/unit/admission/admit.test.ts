import { describe, expect, it } from 'vitest';
import {
  type AnnouncedContainer,
  type AnnouncedPodResources,
  admitAnnounced,
  type ContainerConfigInput,
  type Difference,
  KATA_CONTAINER_TYPE_ANNOTATION,
  KUBELET_CONTAINER_TYPE_ANNOTATION,
} from '../../../src/runtime/admission/index.js';

/** The container the tests announce, and a request that matches it exactly. */
function announcedApp(): AnnouncedContainer {
  return {
    name: 'app',
    type: 'REGULAR_CONTAINER',
    kubernetes_resources: {
      requests: { cpu: { string: '500m' }, memory: { string: '1Gi' } },
      limits: { cpu: { string: '1' }, memory: { string: '1Gi' }, 'hugepages-2Mi': { string: '4Mi' } },
    },
    mounts: [
      { container_path: '/data', host_path: '/var/lib/pods/p/volumes/data', readonly: false },
      { container_path: '/config', host_path: '/var/lib/pods/p/volumes/config', readonly: true },
      { container_path: '/models', image: { image: 'registry.local/models:v1' }, readonly: true },
    ],
    devices: [{ container_path: '/dev/vfio/12', host_path: '/dev/vfio/12', permissions: 'rw' }],
    CDI_devices: [{ name: 'nvidia.com/gpu=0' }],
  };
}

function pod(...containers: AnnouncedContainer[]): AnnouncedPodResources {
  return {
    containers: [
      { name: 'init-db', type: 'INIT_CONTAINER', kubernetes_resources: { requests: { cpu: { string: '100m' } }, limits: {} } },
      { name: 'proxy', type: 'SIDECAR_CONTAINER' },
      ...containers,
    ],
  };
}

function requestApp(): ContainerConfigInput {
  // Written independently of announcedApp (same values, some spelled differently) so that a
  // shared object cannot make the comparison pass by identity.
  return {
    metadata: { name: 'app', attempt: 0 },
    annotations: {},
    kubernetes_resources: {
      requests: { memory: { string: '1073741824' }, cpu: { string: '0.5' } },
      limits: { 'hugepages-2Mi': { string: '4194304' }, cpu: { string: '1000m' }, memory: { string: '1024Mi' } },
    },
    mounts: [
      { container_path: '/models', image: { image: 'registry.local/models:v1' }, readonly: true, propagation: 'PROPAGATION_PRIVATE' },
      { container_path: '/data', host_path: '/var/lib/pods/p/volumes/data', readonly: false, propagation: 0 },
      { container_path: '/config', host_path: '/var/lib/pods/p/volumes/config', readonly: true },
    ],
    devices: [{ container_path: '/dev/vfio/12', host_path: '/dev/vfio/12', permissions: 'wr' }],
    CDI_devices: [{ name: 'nvidia.com/gpu=0' }],
  };
}

function differences(announced: AnnouncedContainer, received: ContainerConfigInput): Difference[] {
  const result = admitAnnounced(pod(announced), received);
  return result.ok ? [] : result.differences;
}

describe('admitAnnounced: a matching request', () => {
  it('admits the announced container and returns its announced entry', () => {
    const result = admitAnnounced(pod(announcedApp()), requestApp());
    expect(result.ok).toBe(true);
    if (result.ok) {
      expect(result.announced.name).toBe('app');
      expect(result.announced.type).toBe('REGULAR_CONTAINER');
    }
  });

  it('admits an announced container with nothing at all (empty lists, null resources)', () => {
    const result = admitAnnounced(pod({ name: 'bare', type: 'REGULAR_CONTAINER' }), {
      metadata: { name: 'bare' },
      kubernetes_resources: null,
    });
    expect(result.ok).toBe(true);
  });
});

type Row = [string, (a: AnnouncedContainer, r: ContainerConfigInput) => void, Difference[]];

const FIELD_ROWS: Row[] = [
  [
    'requests.cpu value',
    (_a, r) => (r.kubernetes_resources!.requests!.cpu = { string: '750m' }),
    [{ field: 'kubernetes_resources.requests.cpu', announced: '500m', received: '750m' }],
  ],
  [
    'requests.memory value',
    (_a, r) => (r.kubernetes_resources!.requests!.memory = { string: '1G' }),
    [{ field: 'kubernetes_resources.requests.memory', announced: '1Gi', received: '1G' }],
  ],
  [
    'limits.cpu value',
    (_a, r) => (r.kubernetes_resources!.limits!.cpu = { string: '2' }),
    [{ field: 'kubernetes_resources.limits.cpu', announced: '1', received: '2' }],
  ],
  [
    'limits.memory value',
    (_a, r) => (r.kubernetes_resources!.limits!.memory = { string: '2Gi' }),
    [{ field: 'kubernetes_resources.limits.memory', announced: '1Gi', received: '2Gi' }],
  ],
  [
    'limits hugepages value',
    (_a, r) => (r.kubernetes_resources!.limits!['hugepages-2Mi'] = { string: '8Mi' }),
    [{ field: 'kubernetes_resources.limits["hugepages-2Mi"]', announced: '4Mi', received: '8Mi' }],
  ],
  [
    'a limit received only',
    (_a, r) => (r.kubernetes_resources!.limits!['nvidia.com/gpu'] = { string: '1' }),
    [{ field: 'kubernetes_resources.limits["nvidia.com/gpu"]', announced: 'absent', received: '1' }],
  ],
  [
    'a request announced only',
    (_a, r) => delete r.kubernetes_resources!.requests!.cpu,
    [{ field: 'kubernetes_resources.requests.cpu', announced: '500m', received: 'absent' }],
  ],
  [
    'an unparsable received quantity',
    (_a, r) => (r.kubernetes_resources!.limits!.cpu = { string: '1.2.3' }),
    [{ field: 'kubernetes_resources.limits.cpu', announced: '1', received: '"1.2.3" (invalid quantity: QUANTITY_MALFORMED)' }],
  ],
  [
    'an unknown suffix',
    (_a, r) => (r.kubernetes_resources!.limits!.memory = { string: '1mi' }),
    [{ field: 'kubernetes_resources.limits.memory', announced: '1Gi', received: '"1mi" (invalid quantity: QUANTITY_SUFFIX_UNKNOWN)' }],
  ],
  [
    'a negative received quantity',
    (_a, r) => (r.kubernetes_resources!.requests!.cpu = { string: '-500m' }),
    [{ field: 'kubernetes_resources.requests.cpu', announced: '500m', received: '"-500m" (invalid quantity: QUANTITY_NEGATIVE)' }],
  ],
  [
    'a quantity without its string',
    (_a, r) => (r.kubernetes_resources!.requests!.cpu = {}),
    [{ field: 'kubernetes_resources.requests.cpu', announced: '500m', received: 'no value (invalid quantity: QUANTITY_MISSING)' }],
  ],
  [
    'kubernetes_resources null while announced',
    (_a, r) => (r.kubernetes_resources = null),
    [
      { field: 'kubernetes_resources.requests.cpu', announced: '500m', received: 'absent' },
      { field: 'kubernetes_resources.requests.memory', announced: '1Gi', received: 'absent' },
      { field: 'kubernetes_resources.limits.cpu', announced: '1', received: 'absent' },
      { field: 'kubernetes_resources.limits["hugepages-2Mi"]', announced: '4Mi', received: 'absent' },
      { field: 'kubernetes_resources.limits.memory', announced: '1Gi', received: 'absent' },
    ],
  ],
  [
    'mount host_path',
    (_a, r) => (r.mounts![1]!.host_path = '/etc'),
    [{ field: 'mounts["/data"].host_path', announced: '"/var/lib/pods/p/volumes/data"', received: '"/etc"' }],
  ],
  [
    'mount image',
    (_a, r) => (r.mounts![0]!.image = { image: 'registry.local/models:v2' }),
    [{ field: 'mounts["/models"].image', announced: '"registry.local/models:v1"', received: '"registry.local/models:v2"' }],
  ],
  [
    'mount image_sub_path',
    (_a, r) => (r.mounts![0]!.image_sub_path = 'weights'),
    [{ field: 'mounts["/models"].image_sub_path', announced: '""', received: '"weights"' }],
  ],
  [
    'mount readonly',
    (_a, r) => (r.mounts![2]!.readonly = false),
    [{ field: 'mounts["/config"].readonly', announced: 'true', received: 'false' }],
  ],
  [
    'mount recursive_read_only',
    (_a, r) => (r.mounts![2]!.recursive_read_only = true),
    [{ field: 'mounts["/config"].recursive_read_only', announced: 'false', received: 'true' }],
  ],
  [
    'mount propagation',
    (_a, r) => (r.mounts![1]!.propagation = 'PROPAGATION_BIDIRECTIONAL'),
    [{ field: 'mounts["/data"].propagation', announced: 'PROPAGATION_PRIVATE', received: 'PROPAGATION_BIDIRECTIONAL' }],
  ],
  [
    'mount propagation given as its enum number',
    (_a, r) => (r.mounts![1]!.propagation = 1),
    [{ field: 'mounts["/data"].propagation', announced: 'PROPAGATION_PRIVATE', received: 'PROPAGATION_HOST_TO_CONTAINER' }],
  ],
  [
    'a mount received only',
    (_a, r) => r.mounts!.push({ container_path: '/host', host_path: '/', readonly: true, propagation: 'PROPAGATION_HOST_TO_CONTAINER' }),
    [{ field: 'mounts["/host"]', announced: 'absent', received: 'host_path "/", readonly, PROPAGATION_HOST_TO_CONTAINER' }],
  ],
  [
    'a mount announced only',
    (_a, r) => r.mounts!.splice(2, 1),
    [{ field: 'mounts["/config"]', announced: 'host_path "/var/lib/pods/p/volumes/config", readonly', received: 'absent' }],
  ],
  [
    'a container path repeated in the request',
    (_a, r) => r.mounts!.push({ container_path: '/data', host_path: '/tmp' }),
    [{ field: 'mounts["/data"]', announced: 'host_path "/var/lib/pods/p/volumes/data"', received: '2 mounts at this path' }],
  ],
  [
    'device host_path',
    (_a, r) => (r.devices![0]!.host_path = '/dev/vfio/13'),
    [{ field: 'devices["/dev/vfio/12"].host_path', announced: '"/dev/vfio/12"', received: '"/dev/vfio/13"' }],
  ],
  [
    'device permissions',
    (_a, r) => (r.devices![0]!.permissions = 'rwm'),
    [{ field: 'devices["/dev/vfio/12"].permissions', announced: 'rw', received: 'rwm' }],
  ],
  [
    'a device received only',
    (_a, r) => r.devices!.push({ container_path: '/dev/fuse', host_path: '/dev/fuse', permissions: 'mrw' }),
    [{ field: 'devices["/dev/fuse"]', announced: 'absent', received: 'host_path "/dev/fuse", permissions rwm' }],
  ],
  [
    'a device announced only',
    (_a, r) => (r.devices = []),
    [{ field: 'devices["/dev/vfio/12"]', announced: 'host_path "/dev/vfio/12", permissions rw', received: 'absent' }],
  ],
  [
    'a CDI device received only',
    (_a, r) => r.CDI_devices!.push({ name: 'nvidia.com/gpu=1' }),
    [{ field: 'CDI_devices["nvidia.com/gpu=1"]', announced: 'absent', received: 'present' }],
  ],
  [
    'a CDI device announced only',
    (_a, r) => (r.CDI_devices = []),
    [{ field: 'CDI_devices["nvidia.com/gpu=0"]', announced: 'present', received: 'absent' }],
  ],
  [
    'type stated by the kata-ts annotation',
    (_a, r) => (r.annotations![KATA_CONTAINER_TYPE_ANNOTATION] = 'sidecar'),
    [{ field: 'type', announced: 'REGULAR_CONTAINER', received: '"sidecar" (annotation kata-ts.dev/container-type)' }],
  ],
  [
    'type stated by the kubelet annotation',
    (_a, r) => (r.annotations![KUBELET_CONTAINER_TYPE_ANNOTATION] = 'init'),
    [{ field: 'type', announced: 'REGULAR_CONTAINER', received: '"init" (annotation io.kubernetes.container.type)' }],
  ],
  ['type announced differently', (a) => (a.type = 'SIDECAR_CONTAINER'), []],
];

describe('admitAnnounced: one row per field', () => {
  it.each(FIELD_ROWS)('%s', (_name, change, expected) => {
    const announced = announcedApp();
    const received = requestApp();
    change(announced, received);
    expect(differences(announced, received)).toEqual(expected);
  });

  it('lists every difference, not just the first, in a stable order', () => {
    const announced = announcedApp();
    const received = requestApp();
    for (const [, change] of FIELD_ROWS.filter(([name]) =>
      [
        'limits.memory value',
        'mount readonly',
        'device permissions',
        'a CDI device received only',
        'type stated by the kata-ts annotation',
      ].includes(name),
    )) {
      change(announced, received);
    }
    expect(differences(announced, received).map((d) => d.field)).toEqual([
      'type',
      'kubernetes_resources.limits.memory',
      'mounts["/config"].readonly',
      'devices["/dev/vfio/12"].permissions',
      'CDI_devices["nvidia.com/gpu=1"]',
    ]);
  });

  it('names a container that was not announced, listing the announced names, and compares nothing else', () => {
    const received = requestApp();
    received.metadata = { name: 'debugger' };
    received.kubernetes_resources = null;
    expect(differences(announcedApp(), received)).toEqual([
      { field: 'container', announced: '"init-db", "proxy", "app"', received: '"debugger"' },
    ]);
  });

  it('names a request without a name against a pod_resources without containers', () => {
    expect(admitAnnounced({ containers: [] }, {})).toEqual({
      ok: false,
      differences: [{ field: 'container', announced: 'no containers', received: '""' }],
    });
  });
});
