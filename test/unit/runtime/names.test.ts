/**
 * The names validator (src/runtime/spec/names.ts) and the decoders that call it: what the kubelet,
 * critest and the fixtures really send passes; hostile names (a NUL, 300 KB, control characters,
 * keys that are not qualified names, annotation floods) are refused with INVALID_ARGUMENT naming
 * the field, each at its bound and not one byte below.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { CreateContainerRequest__Output } from '../../../src/generated/runtime/v1/CreateContainerRequest.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { decodeContainerSpec } from '../../../src/runtime/spec/container.js';
import {
  type ContainerNames,
  containerNameProblems,
  MAX_CONTAINER_ANNOTATIONS_BYTES,
  MAX_POD_ANNOTATIONS_BYTES,
  qualifiedNameFault,
  refuseNames,
  type SandboxNames,
  sandboxNameProblems,
} from '../../../src/runtime/spec/names.js';
import { decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { thrown } from '../../helpers/kata-error.js';

const UUID = '7d5c2a0e-3b8f-4c1a-9e6d-2f4b8a1c0d11';

function pod(edit: Partial<SandboxNames> & { meta?: Partial<NonNullable<SandboxNames['metadata']>> } = {}): SandboxNames {
  const { meta, ...rest } = edit;
  return {
    metadata: { name: 'web', namespace: 'shop', uid: UUID, attempt: 0, ...meta },
    hostname: 'web',
    labels: { app: 'web' },
    annotations: {},
    ...rest,
  };
}

function container(edit: Partial<ContainerNames> & { name?: string } = {}): ContainerNames {
  const { name, ...rest } = edit;
  return { metadata: { name: name ?? 'app', attempt: 0 }, labels: {}, annotations: {}, ...rest };
}

const reasons = (problems: Array<{ reason: string }>) => problems.map((p) => p.reason);

describe('names the kubelet, critest and other clients really send pass', () => {
  it.each([
    'kube-proxy-abc12',
    'coredns-5d78c9869d-x7x2v',
    'etcd-control-plane.example.com',
    'kube-apiserver-node-1.internal',
    // critest: mixed case
    'PodSandbox-for-multi-container-test-5f0c1c5e-8a7d-4b0e-9a53-0d3c8b1f2e4a',
    'create-PodSandbox-for-container-5f0c1c5e-8a7d-4b0e-9a53-0d3c8b1f2e4a',
    'a'.repeat(253),
  ])('pod name %s', (name) => {
    expect(sandboxNameProblems(pod({ meta: { name } }))).toEqual([]);
  });

  it('namespaces, uids and hostnames as they come', () => {
    for (const namespace of ['default', 'kube-system', `cri-test-namespace${UUID}`, 'a'.repeat(63), '0-a'])
      expect(sandboxNameProblems(pod({ meta: { namespace } }))).toEqual([]);
    for (const uid of [UUID, 'e3b0c44298fc1c149afbf4c8996fb924', `cri-test-uid${UUID}`, 'u'.repeat(128), 'first-pod-0001', 'a_b.c'])
      expect(sandboxNameProblems(pod({ meta: { uid } }))).toEqual([]);
    // '' (none), a pod hostname, the 64-byte FQDN the kubelet sends with setHostnameAsFQDN, any case.
    for (const hostname of ['', 'web', 'test-hostname', `${'a'.repeat(31)}.${'b'.repeat(32)}`, 'Node-1.Example.COM'])
      expect(sandboxNameProblems(pod({ hostname }))).toEqual([]);
    expect(sandboxNameProblems(pod({ meta: { attempt: 4294967295 } }))).toEqual([]);
  });

  it('the kubelet, containerd, CRI-O, Kata and kata-ts label and annotation keys', () => {
    const labels = {
      'io.kubernetes.pod.name': 'p'.repeat(253), // the kubelet copies the pod name, up to 253 bytes
      'io.kubernetes.pod.namespace': 'shop',
      'io.kubernetes.pod.uid': UUID,
      'io.kubernetes.container.name': `container-with-RunAsGroup-without-RunAsUser-test-${UUID}`,
      'app.kubernetes.io/name': 'web',
      'kata-ts.dev/test': 'true',
      'sandbox-platform': 'linux/amd64',
      foo: '',
    };
    const annotations = {
      'kubernetes.io/config.seen': '2026-11-24T10:00:00.000000000Z',
      'kubernetes.io/config.source': 'api',
      'kubernetes.io/config.hash': 'e3b0c44298fc1c149afbf4c8996fb924',
      'kubectl.kubernetes.io/last-applied-configuration': '{\n  "apiVersion": "v1"\n}\n',
      'io.kubernetes.cri.sandbox-cpu-period': '100000',
      'io.kubernetes.cri.sandbox-memory': '671088640',
      'io.kubernetes.cri-o.PodLinuxResources': '{"cpu_period":100000}',
      'io.katacontainers.config.hypervisor.default_memory': '2048',
      'io.katacontainers.config.hypervisor.block_device_cache_noflush': 'true',
      'io.kata-ts.guest-devices': '[]',
      'kata-ts.io/handler': 'kata-ts',
      'cdi.k8s.io/gpu': 'nvidia.com/gpu=0',
      'Example.COM/MixedCase_key.1': 'x',
    };
    expect(sandboxNameProblems(pod({ labels, annotations }))).toEqual([]);
    const containerAnnotations = {
      'io.kubernetes.container.hash': 'deadbeef',
      'io.kubernetes.container.hashWithoutResources': 'cafe',
      'io.kubernetes.container.restartCount': '0',
      'io.kubernetes.container.terminationMessagePath': '/dev/termination-log',
      'io.kubernetes.container.terminationMessagePolicy': 'File',
      'io.kubernetes.pod.terminationGracePeriod': '30',
      // A preStop hook the API accepted can be far bigger than the pod's 256 KiB annotation budget.
      'io.kubernetes.container.preStopHandler': JSON.stringify({ exec: { command: ['sh', '-c', 'x'.repeat(400_000)] } }),
      'io.kubernetes.container.ports': '[{"containerPort":80,"protocol":"TCP"}]',
    };
    expect(containerNameProblems(container({ labels, annotations: containerAnnotations }))).toEqual([]);
    expect(containerNameProblems(container({ name: `container-with-SupplementalGroupsPolicyMerge-${UUID}` }))).toEqual([]);
  });

  it('every fixtures/pods request decodes', () => {
    const dir = path.join(packageRoot(), 'fixtures', 'pods');
    const files = readdirSync(dir).filter((f) => f.endsWith('.request.json'));
    expect(files.length).toBeGreaterThan(3);
    for (const f of files) {
      const request = decodeProtoJson<RunPodSandboxRequest__Output>(
        'runtime.v1.RunPodSandboxRequest',
        JSON.parse(readFileSync(path.join(dir, f), 'utf8')),
      );
      expect(sandboxNameProblems(request.config!), f).toEqual([]);
      expect(decodeSandboxSpec(request.config).metadata.name).not.toBe('');
    }
  });
});

describe('hostile names are refused, naming the field', () => {
  const ctl = (s: string) => `a${s}b`;
  it.each([
    [
      'a NUL in the pod name',
      pod({ meta: { name: ctl('\0') } }),
      'SANDBOX_METADATA_INVALID',
      'config.metadata.name holds a control character (U+0000)',
    ],
    [
      'a 300 KB pod name',
      pod({ meta: { name: 'n'.repeat(300 * 1024) } }),
      'SANDBOX_METADATA_INVALID',
      'config.metadata.name is 307200 bytes',
    ],
    ['254 bytes of pod name', pod({ meta: { name: 'a'.repeat(254) } }), 'SANDBOX_METADATA_INVALID', 'at most 253'],
    ['an escape in the pod name', pod({ meta: { name: ctl('\u001b[31m') } }), 'SANDBOX_METADATA_INVALID', 'U+001B'],
    ['a C1 control in the pod name', pod({ meta: { name: ctl('\u0085') } }), 'SANDBOX_METADATA_INVALID', 'U+0085'],
    ['a newline in the namespace', pod({ meta: { namespace: ctl('\n') } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.namespace'],
    ['an upper-case namespace', pod({ meta: { namespace: 'Shop' } }), 'SANDBOX_METADATA_INVALID', 'not a DNS-1123 label'],
    ['a dotted namespace', pod({ meta: { namespace: 'a.b' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.namespace'],
    ['64 bytes of namespace', pod({ meta: { namespace: 'a'.repeat(64) } }), 'SANDBOX_METADATA_INVALID', 'at most 63'],
    ['a NUL in the uid', pod({ meta: { uid: ctl('\0') } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.uid holds a control character'],
    ['129 bytes of uid', pod({ meta: { uid: 'u'.repeat(129) } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.uid is 129 bytes'],
    // CNI_ARGS is `K=V;K=V`: a ";" or "=" in a value adds or overrides a key (K8S_POD_NAMESPACE).
    [
      'a pod name that splits CNI_ARGS',
      pod({ meta: { name: 'x;K8S_POD_NAMESPACE=kube-system' } }),
      'SANDBOX_METADATA_INVALID',
      'config.metadata.name "x;K8S_POD_NAMESPACE=kube-system" is not a DNS-1123 subdomain',
    ],
    ['a uid that splits CNI_ARGS', pod({ meta: { uid: `${UUID};K8S_POD_NAME=other` } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.uid'],
    ['a uid with "="', pod({ meta: { uid: 'a=b' } }), 'SANDBOX_METADATA_INVALID', 'is not a uid'],
    ['a uid that is ".."', pod({ meta: { uid: '..' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.uid'],
    ['a uid with a slash', pod({ meta: { uid: 'a/../../b' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.uid'],
    ['a pod name with a slash', pod({ meta: { name: '../../etc' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.name'],
    ['a pod name with a space', pod({ meta: { name: 'a b' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.name'],
    ['a pod name with an underscore', pod({ meta: { name: 'a_b' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.name'],
    ['a pod name of non-ASCII letters', pod({ meta: { name: 'é-日本' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.name'],
    ['a pod name with an empty label', pod({ meta: { name: 'a..b' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.name'],
    ['a pod name ending in a hyphen', pod({ meta: { name: 'web-' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.name'],
    ['a namespace that splits CNI_ARGS', pod({ meta: { namespace: 'a;b=c' } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.namespace'],
    ['a negative attempt', pod({ meta: { attempt: -1 } }), 'SANDBOX_METADATA_INVALID', 'config.metadata.attempt'],
    ['a NUL in the hostname', pod({ hostname: ctl('\0') }), 'SANDBOX_HOSTNAME_INVALID', 'config.hostname "a\\u{0000}b" is not a host name'],
    ['a tab in the hostname', pod({ hostname: ctl('\t') }), 'SANDBOX_HOSTNAME_INVALID', 'config.hostname'],
    ['65 bytes of hostname', pod({ hostname: `${'a'.repeat(32)}.${'b'.repeat(32)}` }), 'SANDBOX_HOSTNAME_INVALID', 'at most 64'],
    ['a hostname with a slash', pod({ hostname: '../etc' }), 'SANDBOX_HOSTNAME_INVALID', 'config.hostname'],
    ['a hostname ending in a hyphen', pod({ hostname: 'web-' }), 'SANDBOX_HOSTNAME_INVALID', 'config.hostname'],
    ['a 64-byte hostname of one label (a label holds 63)', pod({ hostname: 'a'.repeat(64) }), 'SANDBOX_HOSTNAME_INVALID', 'at most 63'],
    ['a label key with a NUL', pod({ labels: { [ctl('\0')]: 'v' } }), 'LABEL_KEY_INVALID', 'config.labels key "a\\u{0000}b"'],
    ['a label key with two slashes', pod({ labels: { 'a/b/c': 'v' } }), 'LABEL_KEY_INVALID', 'more than one "/"'],
    ['a label key with a space', pod({ labels: { 'a b': 'v' } }), 'LABEL_KEY_INVALID', 'config.labels key "a b"'],
    ['an empty label key', pod({ labels: { '': 'v' } }), 'LABEL_KEY_INVALID', 'empty name'],
    ['a label key ending in a dot', pod({ labels: { 'app.': 'v' } }), 'LABEL_KEY_INVALID', 'config.labels key "app."'],
    ['a label key with an empty prefix', pod({ labels: { '/app': 'v' } }), 'LABEL_KEY_INVALID', 'empty prefix'],
    ['a label key whose prefix is a path', pod({ labels: { '..%2f/app': 'v' } }), 'LABEL_KEY_INVALID', 'not a DNS subdomain'],
    ['a 64-byte key name', pod({ labels: { ['k'.repeat(64)]: 'v' } }), 'LABEL_KEY_INVALID', 'name of 64 bytes'],
    ['a 254-byte key prefix', pod({ labels: { [`${'p'.repeat(254)}/k`]: 'v' } }), 'LABEL_KEY_INVALID', 'prefix of 254 bytes'],
    [
      'a label value with a NUL',
      pod({ labels: { app: ctl('\0') } }),
      'LABEL_VALUE_INVALID',
      'config.labels value of "app" holds a control character',
    ],
    [
      'a 254-byte label value',
      pod({ labels: { app: 'v'.repeat(254) } }),
      'LABEL_VALUE_INVALID',
      'config.labels value of "app" is 254 bytes',
    ],
    [
      'an annotation key with a newline',
      pod({ annotations: { [ctl('\n')]: 'v' } }),
      'ANNOTATION_KEY_INVALID',
      'config.annotations key "a\\u{000a}b"',
    ],
    [
      'an annotation value with a NUL',
      pod({ annotations: { note: ctl('\0') } }),
      'ANNOTATION_VALUE_INVALID',
      'config.annotations value of "note" holds a NUL',
    ],
    [
      'pod annotations past the budget',
      pod({ annotations: { big: 'x'.repeat(MAX_POD_ANNOTATIONS_BYTES - 2) } }),
      'ANNOTATIONS_TOO_LARGE',
      `config.annotations take ${MAX_POD_ANNOTATIONS_BYTES + 1} bytes`,
    ],
  ])('%s', (_what, config, reason, words) => {
    const problems = sandboxNameProblems(config);
    expect(reasons(problems)).toEqual([reason]);
    expect(problems[0]?.message).toContain(words);
    // Each sentence is short whatever the value's size, and quotes no raw control character.
    expect(problems[0]!.message.length).toBeLessThan(400);
    expect(problems[0]!.message).not.toMatch(/\p{Cc}/u);
  });

  it('pod annotations exactly at the budget pass', () => {
    expect(sandboxNameProblems(pod({ annotations: { big: 'x'.repeat(MAX_POD_ANNOTATIONS_BYTES - 3) } }))).toEqual([]);
  });

  it.each([
    [
      'a NUL in the container name',
      container({ name: ctl('\0') }),
      'CONTAINER_METADATA_INVALID',
      'config.metadata.name holds a control character',
    ],
    [
      'a 300 KB container name',
      container({ name: 'c'.repeat(300 * 1024) }),
      'CONTAINER_METADATA_INVALID',
      'config.metadata.name is 307200 bytes',
    ],
    [
      'a container name with ";" and "="',
      container({ name: 'app;K8S_POD_NAME=x' }),
      'CONTAINER_METADATA_INVALID',
      'config.metadata.name "app;K8S_POD_NAME=x" is not a DNS-1123 subdomain',
    ],
    ['a container name with a slash', container({ name: '../x' }), 'CONTAINER_METADATA_INVALID', 'config.metadata.name'],
    ['no container metadata', { ...container(), metadata: null }, 'CONTAINER_METADATA_INVALID', 'config.metadata is required'],
    ['a container label key with a NUL', container({ labels: { [ctl('\0')]: 'v' } }), 'LABEL_KEY_INVALID', 'config.labels key'],
    [
      'a container annotation key that is a path',
      container({ annotations: { '../../x': 'v' } }),
      'ANNOTATION_KEY_INVALID',
      'config.annotations key',
    ],
    [
      'container annotations past their budget',
      container({ annotations: { a: 'x'.repeat(MAX_CONTAINER_ANNOTATIONS_BYTES) } }),
      'ANNOTATIONS_TOO_LARGE',
      'config.annotations take',
    ],
  ])('%s', (_what, config, reason, words) => {
    const problems = containerNameProblems(config);
    expect(reasons(problems)).toEqual([reason]);
    expect(problems[0]?.message).toContain(words);
  });

  it('returns every problem, in field order', () => {
    const problems = sandboxNameProblems(
      pod({ meta: { name: 'a\0', namespace: 'A', uid: '' }, hostname: '-', labels: { 'a b': 'v' }, annotations: { 'c d': '\0' } }),
    );
    expect(problems.map((p) => p.field)).toEqual([
      'config.metadata.name',
      'config.metadata.namespace',
      'config.metadata.uid',
      'config.hostname',
      'config.labels',
      'config.annotations',
    ]);
    expect(sandboxNameProblems({ ...pod(), metadata: null }, 'sandbox')).toEqual([
      { reason: 'SANDBOX_METADATA_MISSING', field: 'sandbox.metadata', message: 'sandbox.metadata is required' },
    ]);
  });

  it('quotes an offending key short, with bidi overrides and separators escaped', () => {
    const [p] = sandboxNameProblems(pod({ labels: { [`\u202e${'k'.repeat(500)} `]: 'v' } }));
    expect(p?.message).toContain('key "\\u{202e}kkk');
    expect(p?.message).toContain('..."');
    expect(p?.message).not.toContain('\u202e');
  });

  it('qualifiedNameFault: the Kubernetes rule, any case in the prefix', () => {
    for (const ok of ['a', 'a.b_c-d', 'example.com/a', 'A/B', `${'p'.repeat(253)}/${'n'.repeat(63)}`])
      expect(qualifiedNameFault(ok), ok).toBeUndefined();
    for (const bad of ['-a', 'a_', '_', 'a/', 'a..b/c', 'a/-b', 'é', 'a/b/c'])
      expect(qualifiedNameFault(bad), JSON.stringify(bad)).toBeDefined();
  });
});

describe('refuseNames and the decoders', () => {
  it('throws INVALID_ARGUMENT with the first problem and how many more; nothing for none', () => {
    expect(() => refuseNames([])).not.toThrow();
    const err = thrown(() => refuseNames(sandboxNameProblems(pod({ meta: { name: '\0' }, hostname: '\0' }))));
    expect([err.kind, err.reason]).toEqual(['invalid', 'SANDBOX_METADATA_INVALID']);
    expect(err.message).toBe("config.metadata.name holds a control character (U+0000) (and 1 more problem with this request's names)");
  });

  const runRequest = (config: Record<string, unknown>) =>
    decodeProtoJson<RunPodSandboxRequest__Output>('runtime.v1.RunPodSandboxRequest', {
      config: { metadata: { name: 'web', uid: UUID, namespace: 'shop' }, ...config },
    }).config;

  it('decodeSandboxSpec refuses hostile names in a request, not in a record it migrates', () => {
    const hostile = runRequest({ metadata: { name: 'web\0', uid: UUID, namespace: 'shop' } });
    const err = thrown(() => decodeSandboxSpec(hostile));
    expect([err.kind, err.reason]).toEqual(['invalid', 'SANDBOX_METADATA_INVALID']);
    expect(err.message).toContain('config.metadata.name');
    expect(thrown(() => decodeSandboxSpec(runRequest({ hostname: 'a\tb' }))).reason).toBe('SANDBOX_HOSTNAME_INVALID');
    expect(thrown(() => decodeSandboxSpec(runRequest({ labels: { 'a/b/c': '' } }))).reason).toBe('LABEL_KEY_INVALID');
    // A record written before these rules is not judged again.
    expect(decodeSandboxSpec(hostile, { recorded: true }).metadata.name).toBe('web\0');
  });

  it('decodeContainerSpec refuses hostile names', () => {
    const config = (json: Record<string, unknown>) =>
      decodeProtoJson<CreateContainerRequest__Output>('runtime.v1.CreateContainerRequest', {
        podSandboxId: 'x',
        config: { metadata: { name: 'app' }, image: { image: 'busybox' }, ...json },
      }).config;
    expect(decodeContainerSpec(config({})).metadata.name).toBe('app');
    const err = thrown(() => decodeContainerSpec(config({ metadata: { name: 'x'.repeat(300 * 1024) } })));
    expect([err.kind, err.reason]).toEqual(['invalid', 'CONTAINER_METADATA_INVALID']);
    expect(thrown(() => decodeContainerSpec(config({ annotations: { 'a\0': '' } }))).reason).toBe('ANNOTATION_KEY_INVALID');
  });
});
