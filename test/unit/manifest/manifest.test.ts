import { describe, expect, it } from 'vitest';
import { manifestToRunPodSandboxRequest, synthesizedUid } from '../../../src/manifest/convert.js';
import { milliCpuToQuota, milliCpuToShares } from '../../../src/manifest/kubelet.js';
import { parseYamlDocument } from '../../../src/manifest/parse.js';
import { failureOf } from '../../helpers/sizing-pods.js';

function convert(yaml: string, options: Parameters<typeof manifestToRunPodSandboxRequest>[1] = {}) {
  return manifestToRunPodSandboxRequest(parseYamlDocument(yaml, 'pod.yaml'), options);
}

function pod(spec: string, metadata = 'metadata: {name: p, namespace: ns, uid: 11111111-2222-3333-4444-555555555555}'): string {
  return `apiVersion: v1\nkind: Pod\n${metadata}\nspec:\n${spec}`;
}

const UID = '11111111-2222-3333-4444-555555555555';

describe('manifest -> RunPodSandboxRequest', () => {
  it('lists init containers in order, restartPolicy Always as sidecars, then regular containers', () => {
    const r = convert(
      pod(`  initContainers:
  - {name: a}
  - {name: b, restartPolicy: Always}
  - {name: c}
  containers:
  - {name: d}
  - {name: e}
`),
    );
    expect(r.config.pod_resources.containers.map((c) => `${c.name}:${c.type}`)).toEqual([
      'a:INIT_CONTAINER',
      'b:SIDECAR_CONTAINER',
      'c:INIT_CONTAINER',
      'd:REGULAR_CONTAINER',
      'e:REGULAR_CONTAINER',
    ]);
  });

  it('applies the API server defaulting: requests from limits', () => {
    const r = convert(pod(`  containers:\n  - name: a\n    resources: {limits: {cpu: 500m, memory: 1Gi}, requests: {cpu: 100m}}\n`));
    expect(r.config.pod_resources.containers[0]!.kubernetes_resources).toEqual({
      requests: { cpu: { string: '100m' }, memory: { string: '1Gi' } },
      limits: { cpu: { string: '500m' }, memory: { string: '1Gi' } },
    });
  });

  it('defaults pod-level requests as KEP-2837 says (from containers for cpu/memory, else from the pod limit)', () => {
    const r = convert(
      pod(`  resources:
    limits: {cpu: "4", memory: 4Gi}
  containers:
  - name: a
    resources: {requests: {cpu: 1500m}}
`),
    );
    expect(r.config.pod_resources.kubernetes_resources).toEqual({
      requests: { cpu: { string: '1500m' }, memory: { string: '4Gi' } },
      limits: { cpu: { string: '4' }, memory: { string: '4Gi' } },
    });
  });

  it('defaults pod-level limits from containers that all have one', () => {
    const r = convert(
      pod(`  resources:
    requests: {cpu: "1"}
  containers:
  - {name: a, resources: {limits: {cpu: 700m}}}
  - {name: b, resources: {limits: {cpu: 300m, memory: 1Gi}}}
`),
    );
    // cpu: both have a limit -> 1; memory: only b has one -> no pod-level default.
    expect(r.config.pod_resources.kubernetes_resources!.limits).toEqual({ cpu: { string: '1' } });
  });

  it.each([
    // [resources, shares, quota, memory] as kubelet >= 1.23 computes them for linux.resources
    ['{requests: {cpu: 250m, memory: 64Mi}, limits: {cpu: 500m, memory: 128Mi}}', '256', '50000', String(128 * 1024 * 1024)],
    ['{limits: {cpu: "2"}}', '2048', '200000', '0'],
    ['{requests: {cpu: 100m}}', '102', '0', '0'],
    ['{}', '2', '0', '0'],
    ['{limits: {cpu: 1m}}', '2', '1000', '0'], // MinShares and the 1 ms minimum quota
  ])('computes linux.resources like the kubelet for %s', (resources, shares, quota, memory) => {
    const r = convert(pod(`  containers:\n  - name: a\n    resources: ${resources}\n`));
    expect(r.config.linux.resources).toMatchObject({
      cpu_period: '100000',
      cpu_shares: shares,
      cpu_quota: quota,
      memory_limit_in_bytes: memory,
    });
  });

  it('matches the kubelet conversion helpers at their edges', () => {
    expect(milliCpuToShares(0n)).toBe(2n);
    expect(milliCpuToShares(1n)).toBe(2n);
    expect(milliCpuToShares(1000n)).toBe(1024n);
    expect(milliCpuToShares(300_000n)).toBe(262_144n);
    expect(milliCpuToQuota(0n, 100_000n)).toBe(0n);
    expect(milliCpuToQuota(5n, 100_000n)).toBe(1000n);
    expect(milliCpuToQuota(1500n, 100_000n)).toBe(150_000n);
  });

  it('sends spec.overhead as guaranteed linux.overhead, and an empty message without it', () => {
    const withOverhead = convert(pod(`  overhead: {cpu: 250m, memory: 160Mi}\n  containers: [{name: a}]\n`));
    expect(withOverhead.config.linux.overhead).toMatchObject({
      cpu_shares: '256',
      cpu_quota: '25000',
      memory_limit_in_bytes: String(160 * 1024 * 1024),
    });
    const without = convert(pod(`  containers: [{name: a}]\n`));
    expect(without.config.linux.overhead).toMatchObject({ cpu_period: '0', cpu_shares: '0', cpu_quota: '0', memory_limit_in_bytes: '0' });
  });

  it.each([
    ['Guaranteed', '{limits: {cpu: "1", memory: 1Gi}}', `/kubepods/pod${UID}`, `kubepods-pod${UID.replace(/-/g, '_')}.slice`],
    ['Burstable', '{requests: {cpu: "1"}}', `/kubepods/burstable/pod${UID}`, `kubepods-burstable-pod${UID.replace(/-/g, '_')}.slice`],
    ['BestEffort', '{}', `/kubepods/besteffort/pod${UID}`, `kubepods-besteffort-pod${UID.replace(/-/g, '_')}.slice`],
  ])('puts a %s pod under its QoS cgroup', (_qos, resources, cgroupfs, systemd) => {
    const yaml = pod(`  containers:\n  - name: a\n    resources: ${resources}\n`);
    expect(convert(yaml).config.linux.cgroup_parent).toBe(cgroupfs);
    expect(convert(yaml, { cgroupDriver: 'systemd' }).config.linux.cgroup_parent).toBe(systemd);
  });

  it('maps volumeMounts to CRI mounts with the kubelet host paths', () => {
    const r = convert(
      pod(`  containers:
  - name: app
    volumeMounts:
    - {name: cache, mountPath: /cache}
    - {name: cfg, mountPath: /etc/app, readOnly: true, recursiveReadOnly: Enabled}
    - {name: host, mountPath: /host, mountPropagation: HostToContainer}
    - {name: cache, mountPath: /sub, subPath: app}
    - {name: model, mountPath: /model, subPath: weights}
    - {name: claim, mountPath: /data, mountPropagation: Bidirectional}
  volumes:
  - {name: cache, emptyDir: {}}
  - {name: cfg, secret: {secretName: s}}
  - {name: host, hostPath: {path: /var/run/thing}}
  - {name: model, image: {reference: "registry.example.com/m:1"}}
  - {name: claim, persistentVolumeClaim: {claimName: pvc-1}}
`),
      { kubeletRoot: '/k' },
    );
    const pods = `/k/pods/${UID}`;
    expect(
      r.config.pod_resources.containers[0]!.mounts.map((m) => [
        m.container_path,
        m.host_path,
        m.readonly,
        m.propagation,
        m.recursive_read_only,
        m.image?.image ?? null,
      ]),
    ).toEqual([
      ['/cache', `${pods}/volumes/kubernetes.io~empty-dir/cache`, false, 'PROPAGATION_PRIVATE', false, null],
      ['/etc/app', `${pods}/volumes/kubernetes.io~secret/cfg`, true, 'PROPAGATION_PRIVATE', true, null],
      ['/host', '/var/run/thing', false, 'PROPAGATION_HOST_TO_CONTAINER', false, null],
      ['/sub', `${pods}/volume-subpaths/cache/app/3`, false, 'PROPAGATION_PRIVATE', false, null],
      ['/model', '', true, 'PROPAGATION_PRIVATE', false, 'registry.example.com/m:1'],
      ['/data', `${pods}/volumes/kubernetes.io~csi/pvc-1/mount`, false, 'PROPAGATION_BIDIRECTIONAL', false, null],
    ]);
  });

  it('fills the sandbox metadata like the kubelet, with a stable uid when the manifest has none', () => {
    const r = convert(
      pod(
        `  runtimeClassName: kata-ts-cvm\n  hostname: h1\n  containers: [{name: a, ports: [{containerPort: 53, protocol: UDP, hostPort: 5353}]}]\n`,
        'metadata: {name: p, labels: {app: x}, annotations: {note: y}}',
      ),
    );
    const uid = synthesizedUid('default', 'p');
    expect(uid).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(r.runtime_handler).toBe('kata-ts-cvm');
    expect(r.config.metadata).toEqual({ name: 'p', namespace: 'default', uid, attempt: 0 });
    expect(r.config.hostname).toBe('h1');
    expect(r.config.log_directory).toBe(`/var/log/pods/default_p_${uid}`);
    expect(r.config.labels).toEqual({
      app: 'x',
      'io.kubernetes.pod.name': 'p',
      'io.kubernetes.pod.namespace': 'default',
      'io.kubernetes.pod.uid': uid,
    });
    expect(r.config.annotations).toEqual({ note: 'y' });
    expect(r.config.port_mappings).toEqual([{ protocol: 'UDP', container_port: 53, host_port: 5353, host_ip: '' }]);
    expect(synthesizedUid('default', 'p')).toBe(uid);
  });

  it('keeps big integer quantities exact (YAML integers beyond 2^53)', () => {
    const r = convert(pod(`  containers:\n  - name: a\n    resources: {limits: {memory: 9007199254740993}}\n`));
    expect(r.config.pod_resources.containers[0]!.kubernetes_resources?.limits).toEqual({ memory: { string: '9007199254740993' } });
  });

  it.each([
    ['no containers', pod('  containers: []\n'), 'spec.containers must list at least one container'],
    ['a nameless container', pod('  containers: [{image: x}]\n'), 'spec.containers[0].name must be a string'],
    [
      'duplicate names across init and regular',
      pod('  initContainers: [{name: a}]\n  containers: [{name: a}]\n'),
      'spec.containers[0].name "a" repeats spec.initContainers[0].name',
    ],
    [
      'an init container restartPolicy other than Always',
      pod('  initContainers: [{name: a, restartPolicy: OnFailure}]\n  containers: [{name: b}]\n'),
      'spec.initContainers[0].restartPolicy is "OnFailure"',
    ],
    [
      'a volume with two sources',
      pod('  containers: [{name: a}]\n  volumes: [{name: v, emptyDir: {}, secret: {}}]\n'),
      'spec.volumes[0] must have exactly one volume source',
    ],
    [
      'a bad mountPropagation',
      pod(
        '  containers: [{name: a, volumeMounts: [{name: v, mountPath: /v, mountPropagation: Sideways}]}]\n  volumes: [{name: v, emptyDir: {}}]\n',
      ),
      'mountPropagation must be one of None, HostToContainer, Bidirectional',
    ],
    [
      'a relative hostPath',
      pod('  containers: [{name: a, volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, hostPath: {path: data}}]\n'),
      'spec.volumes[0].hostPath.path must be an absolute path',
    ],
    [
      'a quantity that is a list',
      pod('  containers: [{name: a, resources: {limits: {cpu: [1]}}}]\n'),
      'spec.containers[0].resources.limits.cpu must be a quantity',
    ],
    ['a negative pod overhead', pod('  overhead: {memory: -1Mi}\n  containers: [{name: a}]\n'), 'spec.overhead.memory "-1Mi" is negative'],
  ])('refuses %s, naming the path', (_name, yaml, message) => {
    expect(() => convert(yaml)).toThrow(message);
    expect(failureOf(() => convert(yaml))).toMatch(/^invalid\//);
  });
});
