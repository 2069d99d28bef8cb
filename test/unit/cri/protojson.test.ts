import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { loadCriPackage } from '../../../src/cri/proto.js';
import { decodeProtoJson, jsonNameOf, parseProtoJson } from '../../../src/cri/protojson.js';
import type { ExecSyncResponse__Output } from '../../../src/generated/runtime/v1/ExecSyncResponse.js';
import type { LinuxContainerResources__Output } from '../../../src/generated/runtime/v1/LinuxContainerResources.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';

const RUN = 'runtime.v1.RunPodSandboxRequest';

/** What grpc-js hands a RunPodSandbox handler for `request` (snake_case object) sent by a client. */
function viaGrpc(request: object): unknown {
  const method = (
    loadCriPackage().packageDefinition['runtime.v1.RuntimeService'] as Record<
      string,
      {
        requestSerialize(v: object): Buffer;
        requestDeserialize(b: Buffer): unknown;
      }
    >
  ).RunPodSandbox!;
  return method.requestDeserialize(method.requestSerialize(request));
}

const snake = {
  config: {
    metadata: { name: 'web', uid: 'u-1', namespace: 'default', attempt: 1 },
    log_directory: '/var/log/pods/default_web_u-1',
    port_mappings: [{ protocol: 'UDP', container_port: 53, host_port: 0 }],
    labels: { app: 'web' },
    annotations: { 'io.kubernetes.cri.sandbox-cpu-quota': '200000' },
    linux: {
      cgroup_parent: '/kubepods/burstable/podu-1',
      security_context: { namespace_options: { pid: 'CONTAINER' }, run_as_user: { value: '1000' } },
      resources: {
        cpu_period: '100000',
        cpu_quota: '200000',
        memory_limit_in_bytes: '9223372036854775807',
        hugepage_limits: [{ page_size: '2MB', limit: '4194304' }],
      },
    },
    pod_resources: {
      containers: [
        {
          name: 'app',
          type: 'SIDECAR_CONTAINER',
          kubernetes_resources: { requests: { cpu: { string: '500m' } }, limits: { memory: { string: '1Gi' } } },
          mounts: [
            {
              container_path: '/img',
              image: { image: 'sha256:00', user_specified_image: 'reg/x:1' },
              image_sub_path: 'a/b',
              uidMappings: [{ host_id: 1000, container_id: 0, length: 1 }],
            },
          ],
          devices: [{ container_path: '/dev/x', host_path: '/dev/x', permissions: 'rw' }],
          CDI_devices: [{ name: 'example.com/gpu=0' }],
        },
      ],
      kubernetes_resources: { limits: { cpu: { string: '2' } } },
    },
  },
  runtime_handler: 'kata-ts-cvm',
};

const camel = {
  config: {
    metadata: { name: 'web', uid: 'u-1', namespace: 'default', attempt: '1' },
    logDirectory: '/var/log/pods/default_web_u-1',
    portMappings: [{ protocol: 1, containerPort: 53, hostPort: 0 }],
    labels: { app: 'web' },
    annotations: { 'io.kubernetes.cri.sandbox-cpu-quota': '200000' },
    linux: {
      cgroupParent: '/kubepods/burstable/podu-1',
      securityContext: { namespaceOptions: { pid: 1 }, runAsUser: { value: 1000 } },
      resources: {
        cpuPeriod: 100000,
        cpuQuota: '200000',
        memoryLimitInBytes: '9223372036854775807',
        hugepageLimits: [{ pageSize: '2MB', limit: 4194304 }],
      },
    },
    podResources: {
      containers: [
        {
          name: 'app',
          type: 1,
          kubernetesResources: { requests: { cpu: { string: '500m' } }, limits: { memory: { string: '1Gi' } } },
          mounts: [
            {
              containerPath: '/img',
              image: { image: 'sha256:00', userSpecifiedImage: 'reg/x:1' },
              imageSubPath: 'a/b',
              uidMappings: [{ hostId: 1000, containerId: 0, length: 1 }],
            },
          ],
          devices: [{ containerPath: '/dev/x', hostPath: '/dev/x', permissions: 'rw' }],
          CDIDevices: [{ name: 'example.com/gpu=0' }],
        },
      ],
      kubernetesResources: { limits: { cpu: { string: '2' } } },
    },
  },
  runtimeHandler: 'kata-ts-cvm',
};

/** Run `fn`, expecting a KataError invalid/`reason`; return it for further checks. */
function rejection(fn: () => unknown, reason = 'PROTOJSON_INVALID'): KataError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KataError);
    const e = err as KataError;
    expect([e.kind, e.reason]).toEqual(['invalid', reason]);
    return e;
  }
  throw new Error('expected a rejection');
}

describe('decodeProtoJson', () => {
  it('maps field names to proto3 JSON names', () => {
    expect(['pod_sandbox_id', 'CDI_devices', 'uidMappings', 'Avg10', 'string'].map(jsonNameOf)).toEqual([
      'podSandboxId',
      'CDIDevices',
      'uidMappings',
      'Avg10',
      'string',
    ]);
  });

  it('decodes camelCase and snake_case spellings to the same object, the one grpc-js delivers', () => {
    const fromSnake = decodeProtoJson<RunPodSandboxRequest__Output>(RUN, snake);
    const fromCamel = decodeProtoJson<RunPodSandboxRequest__Output>(RUN, camel);
    expect(fromCamel).toEqual(fromSnake);
    expect(fromSnake).toEqual(viaGrpc(snake));
    const c = fromSnake.config!;
    expect(c.port_mappings[0]!.protocol).toBe('UDP');
    expect(c.linux!.security_context!.namespace_options!.pid).toBe('CONTAINER');
    expect(c.linux!.resources!.memory_limit_in_bytes).toBe('9223372036854775807');
    expect(c.linux!.resources!.hugepage_limits[0]!.limit).toBe('4194304');
    expect(c.pod_resources!.containers[0]!.type).toBe('SIDECAR_CONTAINER');
    expect(c.pod_resources!.containers[0]!.kubernetes_resources!.requests.cpu!.string).toBe('500m');
    expect(c.pod_resources!.containers[0]!.CDI_devices[0]!.name).toBe('example.com/gpu=0');
    expect(c.pod_resources!.containers[0]!.mounts[0]!.uidMappings[0]!.host_id).toBe(1000);
  });

  it('fills defaults and treats null as unset', () => {
    const empty = decodeProtoJson<RunPodSandboxRequest__Output>(RUN, {});
    expect(empty).toEqual({ config: null, runtime_handler: '' });
    const nulls = decodeProtoJson<RunPodSandboxRequest__Output>(RUN, { config: { linux: null, labels: null }, runtime_handler: null });
    expect(nulls.config!.linux).toBeNull();
    expect(nulls.config!.labels).toEqual({});
    expect(nulls.config!.pod_resources).toBeNull();
    expect(nulls.runtime_handler).toBe('');
  });

  it('decodes bytes from base64 (standard and URL-safe)', () => {
    const out = decodeProtoJson<ExecSyncResponse__Output>('runtime.v1.ExecSyncResponse', {
      stdout: 'aGVsbG8=',
      stderr: '_-8',
      exitCode: 3,
    });
    expect(Buffer.from(out.stdout).toString()).toBe('hello');
    expect([...out.stderr]).toEqual([0xff, 0xef]);
    expect(out.exit_code).toBe(3);
  });

  it('agrees with grpc-js for any LinuxContainerResources, in either spelling', () => {
    const int64 = fc.bigInt(-(2n ** 63n), 2n ** 63n - 1n).map(String);
    fc.assert(
      fc.property(int64, int64, fc.string(), fc.dictionary(fc.string({ minLength: 1 }), fc.string()), (period, mem, cpus, unified) => {
        const s = { cpu_period: period, memory_limit_in_bytes: mem, cpuset_cpus: cpus, unified };
        const c = { cpuPeriod: period, memoryLimitInBytes: mem, cpusetCpus: cpus, unified };
        const type = 'runtime.v1.LinuxContainerResources';
        const a = decodeProtoJson<LinuxContainerResources__Output>(type, s);
        expect(decodeProtoJson(type, c)).toEqual(a);
        expect(viaGrpc({ config: { linux: { resources: s } } })).toMatchObject({ config: { linux: { resources: a } } });
      }),
      { numRuns: 100 },
    );
  });

  it.each([
    [
      'unknown field',
      { config: { podResources: { containers: [{ name: 'a' }, { nmae: 'b' }] } } },
      'config.podResources.containers[1].nmae',
      'is not a field of runtime.v1.ContainerResourceConfig',
    ],
    ['string for int64', { config: { linux: { resources: { cpu_quota: 'lots' } } } }, 'config.linux.resources.cpu_quota', 'int64'],
    ['fraction for int32', { config: { port_mappings: [{ container_port: 1.5 }] } }, 'config.port_mappings[0].container_port', 'int32'],
    ['negative uint32', { config: { metadata: { attempt: -1 } } }, 'config.metadata.attempt', 'uint32'],
    [
      'int64 overflow',
      { config: { linux: { resources: { cpu_shares: '9223372036854775808' } } } },
      'config.linux.resources.cpu_shares',
      'int64',
    ],
    [
      'unknown enum name',
      { config: { pod_resources: { containers: [{ type: 'CONTAINER' }] } } },
      'config.pod_resources.containers[0].type',
      'runtime.v1.ContainerType',
    ],
    ['unknown enum number', { config: { port_mappings: [{ protocol: 7 }] } }, 'config.port_mappings[0].protocol', 'runtime.v1.Protocol'],
    ['map value not a string', { config: { labels: { tier: 3 } } }, 'config.labels["tier"]', 'a string'],
    [
      'Quantity given as plain string',
      { config: { podResources: { kubernetesResources: { limits: { cpu: '2' } } } } },
      'config.podResources.kubernetesResources.limits["cpu"]',
      'runtime.v1.Quantity',
    ],
    ['object where repeated expected', { config: { dnsConfig: { servers: '8.8.8.8' } } }, 'config.dnsConfig.servers', 'array'],
    ['array where message expected', { config: [] }, 'config', 'runtime.v1.PodSandboxConfig'],
    [
      'bool as string',
      { config: { linux: { securityContext: { privileged: 'true' } } } },
      'config.linux.securityContext.privileged',
      'bool',
    ],
    ['null inside an array', { config: { portMappings: [null] } }, 'config.portMappings[0]', 'an element'],
    ['same field twice', { runtime_handler: 'a', runtimeHandler: 'b' }, 'runtimeHandler', 'already set as runtime_handler'],
  ])('rejects %s naming the path', (_label, json, path, hint) => {
    const e = rejection(() => decodeProtoJson(RUN, json));
    expect(e.message.startsWith(`${path} `)).toBe(true);
    expect(e.message).toContain(hint);
    expect(e.details).toEqual({ path });
  });

  it('rejects a document that is not an object, bad base64 and unknown type names', () => {
    expect(rejection(() => decodeProtoJson(RUN, 'x')).message).toContain('runtime.v1.RunPodSandboxRequest');
    expect(rejection(() => decodeProtoJson('runtime.v1.ExecSyncResponse', { stdout: 'not base64!' })).message).toMatch(
      /^stdout must be base64/,
    );
    rejection(() => decodeProtoJson('runtime.v1.NoSuchMessage', {}), 'PROTOJSON_UNKNOWN_TYPE');
    rejection(() => decodeProtoJson('runtime.v1.CgroupDriver', {}), 'PROTOJSON_UNKNOWN_TYPE');
  });

  it('parses JSON text and reports syntax errors with the source name', () => {
    const req = parseProtoJson<RunPodSandboxRequest__Output>(RUN, JSON.stringify(camel), 'pod.json');
    expect(req.runtime_handler).toBe('kata-ts-cvm');
    const e = rejection(() => parseProtoJson(RUN, '{"config": ', 'pod.json'), 'PROTOJSON_SYNTAX');
    expect(e.message).toBe('pod.json is not valid JSON.');
    expect(e.cause).toBeInstanceOf(SyntaxError);
  });
});
