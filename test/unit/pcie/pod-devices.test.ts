import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { defaultHandlerProfile } from '../../../src/config/defaults.js';
import {
  type CdiRegistry,
  discoverPodVfioDevices,
  getKubeletPodResources,
  type KubeletPodResources,
  loadCdiSpecs,
  loadPodResourcesApi,
  planPcieTopology,
  podVfioDevices,
} from '../../../src/pcie/index.js';
import { fixtureInventory } from '../../helpers/pcie-golden.js';
import { FIXTURES_DIR } from '../../helpers/pcie-sysfs.js';

let cdi: CdiRegistry;
beforeAll(async () => {
  cdi = await loadCdiSpecs([path.join(FIXTURES_DIR, 'cdi/etc'), path.join(FIXTURES_DIR, 'cdi/run')]);
});

describe('podVfioDevices (pure)', () => {
  it('pod_resources: VFIO host paths and CDI devices of every container; non-VFIO paths ignored; annotations then unused', () => {
    const r = podVfioDevices({
      cdi,
      annotations: { 'cdi.k8s.io/x': 'mellanox.com/vf=vf9' },
      podResources: {
        containers: [
          {
            name: 'train',
            type: 'REGULAR_CONTAINER',
            devices: [
              { container_path: '/dev/vfio/12', host_path: '/dev/vfio/12', permissions: 'rw' },
              { container_path: '/dev/fuse', host_path: '/dev/fuse', permissions: 'rw' },
            ],
            CDI_devices: [{ name: 'mellanox.com/vf=vf1' }],
          },
          {
            name: 'init',
            type: 'INIT_CONTAINER',
            devices: null,
            CDI_devices: [{ name: 'mellanox.com/vf=vf1' }, { name: 'example.com/net=fuse' }],
          },
        ],
      },
    });
    expect(r.sources).toEqual(['pod_resources']);
    expect(r.requests).toEqual([
      { hostPath: '/dev/vfio/12', origin: 'pod_resources container "train" device /dev/vfio/12' },
      { hostPath: '/dev/vfio/devices/vfio1', origin: 'CDI mellanox.com/vf=vf1 (pod_resources container "train")' },
    ]);
    expect(r.cdiNames.map((n) => n.name)).toEqual(['mellanox.com/vf=vf1', 'example.com/net=fuse']);
    expect(r.nonVfio.map((n) => n.name)).toEqual(['example.com/net=fuse']);
  });

  it('without pod_resources: cdi.k8s.io annotations, plus the kubelet answer (DRA names and known device-plugin names)', () => {
    const kubelet: KubeletPodResources = {
      name: 'p',
      namespace: 'ns',
      containers: [
        {
          name: 'c',
          devices: [
            { resource_name: 'nvidia.com/hgx', device_ids: ['gpu2', 'gpu3'] },
            { resource_name: 'intel.com/sriov_netdevice', device_ids: ['0000:3b:02.1'] },
          ],
          dynamic_resources: [
            {
              claim_name: 'nic',
              claim_namespace: 'ns',
              claim_resources: [{ cdi_devices: [{ name: 'mellanox.com/vf=vf4' }], driver_name: 'd', pool_name: 'p', device_name: 'x' }],
            },
          ],
        },
      ],
    };
    const r = podVfioDevices({ cdi, annotations: { 'cdi.k8s.io/gpu': 'nvidia.com/hgx=gpu2' }, podResources: null, kubelet });
    expect(r.sources).toEqual(['cdi_annotations', 'kubelet_podresources']);
    expect(r.cdiNames.map((n) => n.name)).toEqual(['nvidia.com/hgx=gpu2', 'mellanox.com/vf=vf4', 'nvidia.com/hgx=gpu3']);
    expect(r.warnings).toEqual([
      'kubelet container "c" resource intel.com/sriov_netdevice: no CDI device "intel.com/sriov_netdevice=0000:3b:02.1", not a VFIO device kata-ts can place',
    ]);
  });

  it('an annotation naming an unknown CDI device is refused (NOT_FOUND), not silently dropped', () => {
    const err = (() => {
      try {
        podVfioDevices({ cdi, annotations: { 'cdi.k8s.io/gpu': 'nvidia.com/hgx=gpu9' } });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(KataError);
    expect(err).toMatchObject({ reason: 'CDI_DEVICE_UNKNOWN' });
  });

  it('a pod bringing nothing yields no requests and no sources', () => {
    expect(podVfioDevices({ cdi, podResources: { containers: [{ name: 'a', devices: [], CDI_devices: [] }] } })).toMatchObject({
      sources: [],
      requests: [],
    });
  });
});

describe('kubelet PodResources API client (against a real grpc-js server on a unix socket)', () => {
  let dir: string;
  let socket: string;
  let server: grpc.Server | undefined;
  const calls: string[] = [];
  const pod: KubeletPodResources = {
    name: 'trainer',
    namespace: 'ml',
    containers: [{ name: 'main', devices: [{ resource_name: 'nvidia.com/hgx', device_ids: ['gpu0', 'gpu1'] }], dynamic_resources: [] }],
  };

  async function serve(withGet: boolean): Promise<void> {
    const { definition } = loadPodResourcesApi();
    const service = (
      grpc.loadPackageDefinition(definition) as unknown as { v1: { PodResourcesLister: { service: grpc.ServiceDefinition } } }
    ).v1.PodResourcesLister.service;
    server = new grpc.Server();
    const impl: grpc.UntypedServiceImplementation = {
      List: (_call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        calls.push('List');
        cb(null, { pod_resources: [{ name: 'other', namespace: 'ml', containers: [] }, pod] });
      },
      Get: (call: grpc.ServerUnaryCall<{ pod_name: string; pod_namespace: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        calls.push(`Get ${call.request.pod_namespace}/${call.request.pod_name}`);
        if (!withGet) return cb({ code: grpc.status.UNIMPLEMENTED, details: 'KubeletPodResourcesGet disabled' });
        if (call.request.pod_name !== pod.name) return cb({ code: grpc.status.NOT_FOUND, details: 'pod not found' });
        cb(null, { pod_resources: pod });
      },
    };
    server.addService(service, impl);
    await new Promise<void>((resolve, reject) =>
      server!.bindAsync(`unix:${socket}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())),
    );
  }

  beforeAll(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-podres-'));
    socket = path.join(dir, 'kubelet.sock');
  });
  afterEach(async () => {
    calls.length = 0;
    if (server) await new Promise<void>((resolve) => server!.tryShutdown(() => resolve()));
    server = undefined;
    await fsp.rm(socket, { force: true });
  });
  afterAll(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('Get returns the pod, decoded field for field', async () => {
    await serve(true);
    const got = await getKubeletPodResources(socket, 'ml', 'trainer', { timeoutMs: 5000 });
    expect(got).toMatchObject({
      name: 'trainer',
      namespace: 'ml',
      containers: [{ name: 'main', devices: [{ resource_name: 'nvidia.com/hgx', device_ids: ['gpu0', 'gpu1'] }] }],
    });
    expect(calls).toEqual(['Get ml/trainer']);
    expect(await getKubeletPodResources(socket, 'ml', 'nobody', { timeoutMs: 5000 })).toBeNull();
  });

  it('falls back to List when Get is UNIMPLEMENTED (feature gate off)', async () => {
    await serve(false);
    const got = await getKubeletPodResources(socket, 'ml', 'trainer', { timeoutMs: 5000 });
    expect(got?.name).toBe('trainer');
    expect(calls).toEqual(['Get ml/trainer', 'List']);
  });

  it('no kubelet listening: UNAVAILABLE naming the socket', async () => {
    const err = await getKubeletPodResources(path.join(dir, 'absent.sock'), 'ml', 'trainer', { timeoutMs: 2000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KataError);
    expect((err as KataError).kind).toMatch(/unavailable|timeout/);
    expect((err as KataError).message).toContain('absent.sock');
  });

  it('discoverPodVfioDevices asks the kubelet only without pod_resources, then plans the GPUs it names', async () => {
    await serve(true);
    const found = await discoverPodVfioDevices({
      cdi,
      podName: 'trainer',
      podNamespace: 'ml',
      podResourcesSocket: socket,
      timeoutMs: 5000,
      annotations: {},
    });
    expect(found.sources).toEqual(['kubelet_podresources']);
    expect(found.requests.map((r) => r.hostPath)).toEqual(['/dev/vfio/20', '/dev/vfio/vfio', '/dev/vfio/21', '/dev/vfio/vfio']);
    const t = planPcieTopology({
      inventory: await fixtureInventory('hgx-8gpu'),
      devices: found.requests,
      profile: { ...defaultHandlerProfile().pcie, confidential: false },
    });
    expect(t.functions.map((f) => f.bdf)).toEqual(['0000:18:00.0', '0000:2a:00.0']);
    calls.length = 0;
    const withPr = await discoverPodVfioDevices({
      cdi,
      podName: 'trainer',
      podNamespace: 'ml',
      podResourcesSocket: socket,
      timeoutMs: 5000,
      podResources: { containers: [] },
    });
    expect(withPr.requests).toEqual([]);
    expect(calls).toEqual([]);
    const off = await discoverPodVfioDevices({ cdi, podName: 'trainer', podNamespace: 'ml', podResourcesSocket: null, timeoutMs: 5000 });
    expect(off.sources).toEqual([]);
    expect(calls).toEqual([]);
  });
});
