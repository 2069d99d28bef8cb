import { describe, expect, it } from 'vitest';
import { cgroupPlacementOf, decodePodSpec, parseResolvConf } from '../../../../src/shim/decode/index.js';
import { resolveDemand } from '../../../../src/sizing/sources.js';
import { thrown } from '../../../helpers/kata-error.js';
import { type EditableJson, edited, loadConfig } from './fixtures.js';

const SANDBOX = 'containerd/1.6.20/sandbox.config.synthetic.json';
const CRIO_SANDBOX = 'cri-o/1.28/sandbox.config.synthetic.json';

type Json = EditableJson;

describe('decodePodSpec: where each value comes from', () => {
  it('reads the resolv.conf text it is given into dns_config (else null: the image keeps its own)', () => {
    const text =
      '# written by containerd\nsearch default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n';
    const pod = decodePodSpec(loadConfig(SANDBOX), { resolvConf: text });
    expect(pod.spec.dns_config).toEqual({
      servers: ['10.96.0.10'],
      searches: ['default.svc.cluster.local', 'svc.cluster.local', 'cluster.local'],
      options: ['ndots:5'],
    });
    expect(decodePodSpec(loadConfig(SANDBOX)).spec.dns_config).toBeNull();
  });

  it('takes privileged from the caller for containerd, from PrivilegedRuntime for CRI-O', () => {
    expect(decodePodSpec(loadConfig(SANDBOX)).spec.linux?.security_context?.privileged).toBe(false);
    expect(decodePodSpec(loadConfig(SANDBOX), { privileged: true }).spec.linux?.security_context?.privileged).toBe(true);
    const crio = edited(CRIO_SANDBOX, (o) => {
      o.annotations['io.kubernetes.cri-o.PrivilegedRuntime'] = 'true';
    });
    expect(decodePodSpec(crio).spec.linux?.security_context?.privileged).toBe(true);
  });

  it("sizes the pod from containerd's annotations as linux.resources, and from CRI-O's own annotation", () => {
    const containerd = resolveDemand(decodePodSpec(loadConfig(SANDBOX)).spec);
    expect(containerd.source).toBe('linux_resources');
    // quota 150000 / period 100000 = 1500m; 768 shares = 750m; 805306368 bytes = 768 MiB.
    expect([containerd.cpuLimitMillis, containerd.cpuRequestMillis, containerd.memoryLimitBytes]).toEqual([1500n, 750n, 805306368n]);
    const crio = resolveDemand(decodePodSpec(loadConfig(CRIO_SANDBOX)).spec);
    expect(crio.source).toBe('crio_annotations');
    expect([crio.cpuLimitMillis, crio.memoryLimitBytes]).toEqual([1500n, 805306368n]);
  });

  it('has no linux.resources when containerd wrote no sizing annotations (the kubelet sent none)', () => {
    const oci = edited(SANDBOX, (o) => {
      for (const k of Object.keys(o.annotations)) if (/sandbox-(cpu|memory)/.test(k)) delete o.annotations[k];
    });
    expect(decodePodSpec(oci).spec.linux?.resources).toBeNull();
  });

  it('a network namespace without a path is a pod without network; no cgroupsPath is no placement', () => {
    const oci = edited(SANDBOX, (o) => {
      o.linux.namespaces = o.linux.namespaces.map((n: Json) => (n.type === 'network' ? { type: 'network' } : n));
      delete o.linux.cgroupsPath;
    });
    const pod = decodePodSpec(oci);
    expect(pod.netnsPath).toBeNull();
    expect(pod.cgroup).toBeNull();
    expect(pod.spec.linux?.cgroup_parent).toBe('');
  });

  it('reads CRI-O identity from the kubelet labels when the Metadata annotation is absent', () => {
    const oci = edited(CRIO_SANDBOX, (o) => {
      delete o.annotations['io.kubernetes.cri-o.Metadata'];
    });
    expect(decodePodSpec(oci).spec.metadata).toEqual({
      name: 'web-7d9f8c6b5-xk2lp',
      namespace: 'default',
      uid: '8d2b6a8e-5c0f-4b8e-9a3e-2f1c7d9e4b61',
      attempt: 0,
    });
  });
});

describe('cgroupPlacementOf', () => {
  it.each([
    ['kubepods-burstable-pod1.slice:cri-containerd:abc', { driver: 'systemd', parent: 'kubepods-burstable-pod1.slice' }],
    [':cri-containerd:abc', { driver: 'systemd', parent: '' }],
    ['/kubepods/burstable/pod1/abc', { driver: 'cgroupfs', parent: '/kubepods/burstable/pod1' }],
    ['/k8s.io/abc', { driver: 'cgroupfs', parent: '/k8s.io' }],
    ['/abc', { driver: 'cgroupfs', parent: '/' }],
    ['kubepods/abc', { driver: 'cgroupfs', parent: 'kubepods' }],
    ['abc', { driver: 'cgroupfs', parent: '' }],
  ])('%s', (cgroupsPath, expected) => {
    expect(cgroupPlacementOf(cgroupsPath)).toEqual({ ...expected, cgroupsPath });
  });

  it.each(['a:b', 'a.slice:b:c:d', '/', '/kubepods/a:b', 'x.slice:p:'])('refuses %j', (cgroupsPath) => {
    const err = thrown(() => cgroupPlacementOf(cgroupsPath));
    expect(err.reason).toBe('SHIM_CGROUPS_PATH_INVALID');
    expect(err.message).toMatch(/^linux\.cgroupsPath /);
  });
});

describe('parseResolvConf', () => {
  it('keeps every nameserver and option, the last search line, and skips comments and other lines', () => {
    expect(
      parseResolvConf(
        'nameserver 1.1.1.1\nsearch a b\n; old\nsearch c\nnameserver 8.8.8.8 # google\nsortlist 10.0.0.0\noptions a b\noptions c\n',
      ),
    ).toEqual({
      servers: ['1.1.1.1', '8.8.8.8'],
      searches: ['c'],
      options: ['a', 'b', 'c'],
    });
    expect(parseResolvConf('')).toEqual({ servers: [], searches: [], options: [] });
  });
});

/** [what, fixture, edit, reason, the start of the message]. */
const refusals: Array<[string, string, (o: Json) => void, string, string]> = [
  [
    'no sandbox name',
    SANDBOX,
    (o) => delete o.annotations['io.kubernetes.cri.sandbox-name'],
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri.sandbox-name"] is missing',
  ],
  [
    'no sandbox namespace',
    SANDBOX,
    (o) => delete o.annotations['io.kubernetes.cri.sandbox-namespace'],
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri.sandbox-namespace"]',
  ],
  [
    'an empty uid',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-uid'] = ''),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri.sandbox-uid"] must not be empty',
  ],
  [
    'a namespace that is no DNS label',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-namespace'] = 'Team_A'),
    'SANDBOX_METADATA_INVALID',
    'annotations["io.kubernetes.cri.sandbox-namespace"] "Team_A" is not a DNS-1123 label',
  ],
  [
    'a name with a control character',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-name'] = 'web\u0007'),
    'SANDBOX_METADATA_INVALID',
    'annotations["io.kubernetes.cri.sandbox-name"] holds a control character',
  ],
  [
    'no container type',
    SANDBOX,
    (o) => delete o.annotations['io.kubernetes.cri.container-type'],
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri.container-type"] is missing',
  ],
  [
    'an unknown container type',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.container-type'] = 'pause'),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri.container-type"] must be "sandbox" or "container"',
  ],
  [
    "an app container's config",
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.container-type'] = 'container'),
    'SHIM_CONTAINER_TYPE_MISMATCH',
    'annotations["io.kubernetes.cri.container-type"] is "container"',
  ],
  [
    'no sandbox id',
    SANDBOX,
    (o) => delete o.annotations['io.kubernetes.cri.sandbox-id'],
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri.sandbox-id"]',
  ],
  [
    'a memory quantity',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-memory'] = '1Gi'),
    'SIZING_INTEGER_INVALID',
    'annotations["io.kubernetes.cri.sandbox-memory"] must be an integer',
  ],
  [
    'a quota below -1',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-cpu-quota'] = '-5'),
    'SIZING_INTEGER_INVALID',
    'annotations["io.kubernetes.cri.sandbox-cpu-quota"] must be at least -1',
  ],
  [
    'an empty period',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-cpu-period'] = ''),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri.sandbox-cpu-period"] must be an integer',
  ],
  [
    'a relative log directory',
    SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-log-directory'] = 'var/log/pods/x'),
    'SANDBOX_LOG_DIRECTORY_INVALID',
    'annotations["io.kubernetes.cri.sandbox-log-directory"] must be an absolute, normalised path',
  ],
  [
    'a hostname that is no host name',
    SANDBOX,
    (o) => (o.hostname = 'web_1!'),
    'SANDBOX_HOSTNAME_INVALID',
    'hostname "web_1!" is not a host name',
  ],
  [
    'an annotation key that is no qualified name',
    SANDBOX,
    (o) => (o.annotations['bad key'] = 'x'),
    'ANNOTATION_KEY_INVALID',
    'annotations key "bad key"',
  ],
  [
    'the host network (no network namespace)',
    SANDBOX,
    (o) => (o.linux.namespaces = o.linux.namespaces.filter((n: Json) => n.type !== 'network')),
    'SANDBOX_HOST_NAMESPACE_UNSUPPORTED',
    'config.linux.security_context.namespace_options.network is NODE',
  ],
  [
    'the host IPC namespace',
    SANDBOX,
    (o) => (o.linux.namespaces = o.linux.namespaces.filter((n: Json) => n.type !== 'ipc')),
    'SANDBOX_HOST_NAMESPACE_UNSUPPORTED',
    'config.linux.security_context.namespace_options.ipc is NODE',
  ],
  [
    'a cgroupsPath of neither form',
    SANDBOX,
    (o) => (o.linux.cgroupsPath = 'kubepods.slice:abc'),
    'SHIM_CGROUPS_PATH_INVALID',
    'linux.cgroupsPath "kubepods.slice:abc"',
  ],
  ['no ociVersion', SANDBOX, (o) => delete o.ociVersion, 'SHIM_SPEC_INVALID', "config.json must have required property 'ociVersion'"],
  [
    'an annotation value that is not a string',
    SANDBOX,
    (o) => (o.annotations['example.com/team'] = 7),
    'SHIM_SPEC_INVALID',
    'annotations["example.com/team"] must be string',
  ],
  [
    'an unknown namespace type',
    SANDBOX,
    (o) => o.linux.namespaces.push({ type: 'time' }),
    'SHIM_SPEC_INVALID',
    'linux.namespaces[5].type must be one of',
  ],
  [
    'a namespace path that is not a string',
    SANDBOX,
    (o) => (o.linux.namespaces[4].path = 42),
    'SHIM_SPEC_INVALID',
    'linux.namespaces[4].path must be string',
  ],
  [
    'a sysctl value that is not a string',
    SANDBOX,
    (o) => (o.linux.sysctl['net.ipv4.ip_forward'] = 1),
    'SHIM_SPEC_INVALID',
    'linux.sysctl["net.ipv4.ip_forward"] must be string',
  ],
  ['a hostname that is not a string', SANDBOX, (o) => (o.hostname = ['web']), 'SHIM_SPEC_INVALID', 'hostname must be string'],
  [
    'a cgroupsPath that is not a string',
    SANDBOX,
    (o) => (o.linux.cgroupsPath = 1),
    'SHIM_SPEC_INVALID',
    'linux.cgroupsPath must be string',
  ],
  [
    'CRI-O metadata that is not JSON',
    CRIO_SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri-o.Metadata'] = '{name'),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri-o.Metadata"] is not JSON',
  ],
  [
    'CRI-O metadata with a numeric uid',
    CRIO_SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri-o.Metadata'] = '{"uid":5}'),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri-o.Metadata"] has a "uid" that is not a string',
  ],
  [
    'CRI-O with no name anywhere',
    CRIO_SANDBOX,
    (o) => {
      o.annotations['io.kubernetes.cri-o.Metadata'] = '{}';
      delete o.annotations['io.kubernetes.cri-o.KubeName'];
      delete o.annotations['io.kubernetes.pod.name'];
    },
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri-o.Metadata"] has no name, and neither has annotations["io.kubernetes.cri-o.KubeName"] nor annotations["io.kubernetes.pod.name"]',
  ],
  [
    'CRI-O labels that are not strings',
    CRIO_SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri-o.Labels'] = '{"app":1}'),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri-o.Labels"] must be a JSON object of strings',
  ],
  [
    'a CRI-O boolean that is not one',
    CRIO_SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri-o.PrivilegedRuntime'] = 'yes'),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri-o.PrivilegedRuntime"] must be "true" or "false"',
  ],
  [
    'a CRI-O label key that is no qualified name',
    CRIO_SANDBOX,
    (o) => (o.annotations['io.kubernetes.cri-o.Labels'] = '{"a b":"c"}'),
    'LABEL_KEY_INVALID',
    'annotations["io.kubernetes.cri-o.Labels"] key "a b"',
  ],
];

describe('decodePodSpec refusals: INVALID_ARGUMENT naming the annotation or field', () => {
  it.each(refusals)('%s', (_what, fixture, edit, reason, start) => {
    const err = thrown(() => decodePodSpec(edited(fixture, edit)));
    expect(err.kind).toBe('invalid');
    expect(err.reason).toBe(reason);
    expect(err.message.startsWith(start), err.message).toBe(true);
  });

  it.each([null, [], 'config', 42])('refuses a config.json that is not an object: %j', (value) => {
    const err = thrown(() => decodePodSpec(value));
    expect(err.reason).toBe('SHIM_SPEC_INVALID');
    expect(err.message).toMatch(/^config\.json must be object/);
  });

  it('refuses an integer JSON cannot carry exactly', () => {
    const err = thrown(() => decodePodSpec(edited(SANDBOX, (o) => (o.linux.resources.cpu.shares = 2 ** 63))));
    expect(err.reason).toBe('SHIM_SPEC_INVALID');
    expect(err.message).toMatch(/^linux\.resources\.cpu\.shares must be <= 9007199254740991/);
  });

  it('says how many more problems the schema found', () => {
    const err = thrown(() => decodePodSpec(edited(SANDBOX, (o) => Object.assign(o, { hostname: 1, ociVersion: 2 }))));
    expect(err.message).toMatch(/\(and 1 more problem with the config\.json\)$/);
  });
});
