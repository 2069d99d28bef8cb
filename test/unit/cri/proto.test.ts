import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import protobuf from 'protobufjs';
import * as descriptor from 'protobufjs/ext/descriptor/index.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { criReflectionRoot, loadCriPackage, PROTO_LOADER_OPTIONS, protoFilePath } from '../../../src/cri/proto.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';

// Facts of upstream k8s.io/cri-api runtime/v1 (revision in proto/README.md), written as
// "Message: [repeated|optional] type name = number". Types are short names within runtime.v1.
const UPSTREAM_FIELDS = `
PodSandboxConfig: PodSandboxMetadata metadata = 1
PodSandboxConfig: string hostname = 2
PodSandboxConfig: string log_directory = 3
PodSandboxConfig: DNSConfig dns_config = 4
PodSandboxConfig: repeated PortMapping port_mappings = 5
PodSandboxConfig: map<string,string> labels = 6
PodSandboxConfig: map<string,string> annotations = 7
PodSandboxConfig: LinuxPodSandboxConfig linux = 8
PodSandboxConfig: WindowsPodSandboxConfig windows = 9
LinuxPodSandboxConfig: string cgroup_parent = 1
LinuxPodSandboxConfig: LinuxSandboxSecurityContext security_context = 2
LinuxPodSandboxConfig: map<string,string> sysctls = 3
LinuxPodSandboxConfig: LinuxContainerResources overhead = 4
LinuxPodSandboxConfig: LinuxContainerResources resources = 5
LinuxContainerResources: int64 cpu_period = 1
LinuxContainerResources: int64 cpu_quota = 2
LinuxContainerResources: int64 cpu_shares = 3
LinuxContainerResources: int64 memory_limit_in_bytes = 4
LinuxContainerResources: int64 oom_score_adj = 5
LinuxContainerResources: string cpuset_cpus = 6
LinuxContainerResources: string cpuset_mems = 7
LinuxContainerResources: repeated HugepageLimit hugepage_limits = 8
LinuxContainerResources: map<string,string> unified = 9
LinuxContainerResources: int64 memory_swap_limit_in_bytes = 10
HugepageLimit: string page_size = 1
HugepageLimit: uint64 limit = 2
ContainerConfig: ContainerMetadata metadata = 1
ContainerConfig: ImageSpec image = 2
ContainerConfig: repeated string command = 3
ContainerConfig: repeated string args = 4
ContainerConfig: string working_dir = 5
ContainerConfig: repeated KeyValue envs = 6
ContainerConfig: repeated Mount mounts = 7
ContainerConfig: repeated Device devices = 8
ContainerConfig: map<string,string> labels = 9
ContainerConfig: map<string,string> annotations = 10
ContainerConfig: string log_path = 11
ContainerConfig: bool stdin = 12
ContainerConfig: bool stdin_once = 13
ContainerConfig: bool tty = 14
ContainerConfig: LinuxContainerConfig linux = 15
ContainerConfig: WindowsContainerConfig windows = 16
ContainerConfig: repeated CDIDevice CDI_devices = 17
ContainerConfig: Signal stop_signal = 18
Mount: string container_path = 1
Mount: string host_path = 2
Mount: bool readonly = 3
Mount: bool selinux_relabel = 4
Mount: MountPropagation propagation = 5
Mount: repeated IDMapping uidMappings = 6
Mount: repeated IDMapping gidMappings = 7
Mount: bool recursive_read_only = 8
Mount: ImageSpec image = 9
Mount: string image_sub_path = 10
ImageSpec: string image = 1
ImageSpec: map<string,string> annotations = 2
ImageSpec: string user_specified_image = 18
ImageSpec: string runtime_handler = 19
ImageSpec: string image_ref = 20
RunPodSandboxRequest: PodSandboxConfig config = 1
RunPodSandboxRequest: string runtime_handler = 2
VersionResponse: string version = 1
VersionResponse: string runtime_name = 2
VersionResponse: string runtime_version = 3
VersionResponse: string runtime_api_version = 4
StatusResponse: RuntimeStatus status = 1
StatusResponse: map<string,string> info = 2
StatusResponse: repeated RuntimeHandler runtime_handlers = 3
StatusResponse: RuntimeFeatures features = 4
RuntimeHandler: string name = 1
RuntimeHandler: RuntimeHandlerFeatures features = 2
RuntimeHandlerFeatures: bool recursive_read_only_mounts = 1
RuntimeHandlerFeatures: bool user_namespaces = 2
RuntimeFeatures: bool supplemental_groups_policy = 1
RuntimeFeatures: bool user_namespaces_host_network = 2
RuntimeCondition: string type = 1
RuntimeCondition: bool status = 2
RuntimeCondition: string reason = 3
RuntimeCondition: string message = 4
RuntimeConfigResponse: LinuxRuntimeConfiguration linux = 1
LinuxRuntimeConfiguration: CgroupDriver cgroup_driver = 1
UpdatePodSandboxResourcesRequest: string pod_sandbox_id = 1
UpdatePodSandboxResourcesRequest: LinuxContainerResources overhead = 2
UpdatePodSandboxResourcesRequest: LinuxContainerResources resources = 3
UpdateContainerResourcesRequest: string container_id = 1
UpdateContainerResourcesRequest: LinuxContainerResources linux = 2
UpdateContainerResourcesRequest: WindowsContainerResources windows = 3
UpdateContainerResourcesRequest: map<string,string> annotations = 4
ContainerStatus: ContainerUser user = 18
ContainerStatus: Signal stop_signal = 19
LinuxSandboxSecurityContext: Int64Value run_as_group = 8
LinuxSandboxSecurityContext: SupplementalGroupsPolicy supplemental_groups_policy = 11
LinuxContainerSecurityContext: SupplementalGroupsPolicy supplemental_groups_policy = 17
ExecRequest: string audit_request_id = 7
PsiData: uint64 Total = 1
PsiData: double Avg300 = 4
ExecSyncResponse: bytes stdout = 1
WindowsContainerResources: repeated WindowsCpuGroupAffinity affinity_cpus = 6
`;

// The KEP-4112 additions, with the numbers proto/README.md justifies.
const ADDED_FIELDS = `
PodSandboxConfig: PodResourceConfig pod_resources = 10
ContainerConfig: KubernetesResources kubernetes_resources = 1001
UpdateContainerResourcesRequest: KubernetesResources kubernetes_resources = 5
UpdatePodSandboxResourcesRequest: PodResourceConfig pod_resources = 5
Quantity: optional string string = 1
KubernetesResources: map<string,Quantity> requests = 1
KubernetesResources: map<string,Quantity> limits = 2
ContainerResourceConfig: string name = 1
ContainerResourceConfig: ContainerType type = 2
ContainerResourceConfig: KubernetesResources kubernetes_resources = 3
ContainerResourceConfig: repeated Mount mounts = 4
ContainerResourceConfig: repeated Device devices = 5
ContainerResourceConfig: repeated CDIDevice CDI_devices = 6
PodResourceConfig: repeated ContainerResourceConfig containers = 1
PodResourceConfig: KubernetesResources kubernetes_resources = 2
`;

const ENUM_VALUES: Record<string, Record<string, number>> = {
  CgroupDriver: { SYSTEMD: 0, CGROUPFS: 1 },
  Signal: {
    RUNTIME_DEFAULT: 0,
    SIGABRT: 1,
    SIGHUP: 8,
    SIGKILL: 13,
    SIGQUIT: 18,
    SIGTERM: 23,
    SIGUSR1: 29,
    SIGRTMIN: 35,
    SIGRTMAXMINUS1: 64,
    SIGRTMAX: 65,
  },
  MountPropagation: { PROPAGATION_PRIVATE: 0, PROPAGATION_HOST_TO_CONTAINER: 1, PROPAGATION_BIDIRECTIONAL: 2 },
  NamespaceMode: { POD: 0, CONTAINER: 1, NODE: 2, TARGET: 3 },
  ContainerState: { CONTAINER_CREATED: 0, CONTAINER_RUNNING: 1, CONTAINER_EXITED: 2, CONTAINER_UNKNOWN: 3 },
  PodSandboxState: { SANDBOX_READY: 0, SANDBOX_NOTREADY: 1 },
  SupplementalGroupsPolicy: { Merge: 0, Strict: 1 },
  'SecurityProfile.ProfileType': { RuntimeDefault: 0, Unconfined: 1, Localhost: 2 },
  ContainerEventType: { CONTAINER_CREATED_EVENT: 0, CONTAINER_STARTED_EVENT: 1, CONTAINER_STOPPED_EVENT: 2, CONTAINER_DELETED_EVENT: 3 },
  MetricType: { COUNTER: 0, GAUGE: 1 },
  Protocol: { TCP: 0, UDP: 1, SCTP: 2 },
  ContainerType: { INIT_CONTAINER: 0, SIDECAR_CONTAINER: 1, REGULAR_CONTAINER: 2 },
};

// name -> [request, response, server-streaming]
const RUNTIME_RPCS: Record<string, [string, string, boolean]> = {
  Version: ['VersionRequest', 'VersionResponse', false],
  RunPodSandbox: ['RunPodSandboxRequest', 'RunPodSandboxResponse', false],
  StopPodSandbox: ['StopPodSandboxRequest', 'StopPodSandboxResponse', false],
  RemovePodSandbox: ['RemovePodSandboxRequest', 'RemovePodSandboxResponse', false],
  PodSandboxStatus: ['PodSandboxStatusRequest', 'PodSandboxStatusResponse', false],
  ListPodSandbox: ['ListPodSandboxRequest', 'ListPodSandboxResponse', false],
  StreamPodSandboxes: ['StreamPodSandboxesRequest', 'StreamPodSandboxesResponse', true],
  CreateContainer: ['CreateContainerRequest', 'CreateContainerResponse', false],
  StartContainer: ['StartContainerRequest', 'StartContainerResponse', false],
  StopContainer: ['StopContainerRequest', 'StopContainerResponse', false],
  RemoveContainer: ['RemoveContainerRequest', 'RemoveContainerResponse', false],
  ListContainers: ['ListContainersRequest', 'ListContainersResponse', false],
  StreamContainers: ['StreamContainersRequest', 'StreamContainersResponse', true],
  ContainerStatus: ['ContainerStatusRequest', 'ContainerStatusResponse', false],
  UpdateContainerResources: ['UpdateContainerResourcesRequest', 'UpdateContainerResourcesResponse', false],
  ReopenContainerLog: ['ReopenContainerLogRequest', 'ReopenContainerLogResponse', false],
  ExecSync: ['ExecSyncRequest', 'ExecSyncResponse', false],
  Exec: ['ExecRequest', 'ExecResponse', false],
  Attach: ['AttachRequest', 'AttachResponse', false],
  PortForward: ['PortForwardRequest', 'PortForwardResponse', false],
  ContainerStats: ['ContainerStatsRequest', 'ContainerStatsResponse', false],
  ListContainerStats: ['ListContainerStatsRequest', 'ListContainerStatsResponse', false],
  StreamContainerStats: ['StreamContainerStatsRequest', 'StreamContainerStatsResponse', true],
  PodSandboxStats: ['PodSandboxStatsRequest', 'PodSandboxStatsResponse', false],
  ListPodSandboxStats: ['ListPodSandboxStatsRequest', 'ListPodSandboxStatsResponse', false],
  StreamPodSandboxStats: ['StreamPodSandboxStatsRequest', 'StreamPodSandboxStatsResponse', true],
  UpdateRuntimeConfig: ['UpdateRuntimeConfigRequest', 'UpdateRuntimeConfigResponse', false],
  Status: ['StatusRequest', 'StatusResponse', false],
  CheckpointContainer: ['CheckpointContainerRequest', 'CheckpointContainerResponse', false],
  GetContainerEvents: ['GetEventsRequest', 'ContainerEventResponse', true],
  ListMetricDescriptors: ['ListMetricDescriptorsRequest', 'ListMetricDescriptorsResponse', false],
  ListPodSandboxMetrics: ['ListPodSandboxMetricsRequest', 'ListPodSandboxMetricsResponse', false],
  StreamPodSandboxMetrics: ['StreamPodSandboxMetricsRequest', 'StreamPodSandboxMetricsResponse', true],
  RuntimeConfig: ['RuntimeConfigRequest', 'RuntimeConfigResponse', false],
  UpdatePodSandboxResources: ['UpdatePodSandboxResourcesRequest', 'UpdatePodSandboxResourcesResponse', false],
};

const IMAGE_RPCS: Record<string, [string, string, boolean]> = {
  ListImages: ['ListImagesRequest', 'ListImagesResponse', false],
  StreamImages: ['StreamImagesRequest', 'StreamImagesResponse', true],
  ImageStatus: ['ImageStatusRequest', 'ImageStatusResponse', false],
  PullImage: ['PullImageRequest', 'PullImageResponse', false],
  RemoveImage: ['RemoveImageRequest', 'RemoveImageResponse', false],
  ImageFsInfo: ['ImageFsInfoRequest', 'ImageFsInfoResponse', false],
};

interface FieldFact {
  message: string;
  rule: 'single' | 'repeated' | 'optional' | 'map';
  type: string;
  keyType?: string;
  name: string;
  number: number;
}

function parseFacts(text: string): FieldFact[] {
  return text
    .trim()
    .split('\n')
    .map((line) => {
      const m = /^(\w+): (?:(repeated|optional) )?(?:map<(\w+),(\w+)>|([\w.]+)) (\w+) = (\d+)$/.exec(line);
      if (m === null) throw new Error(`bad fact line: ${line}`);
      const [, message, rule, keyType, mapValue, type, name, number] = m;
      return {
        message: message!,
        rule: keyType !== undefined ? 'map' : ((rule ?? 'single') as FieldFact['rule']),
        type: (mapValue ?? type)!,
        ...(keyType !== undefined ? { keyType } : {}),
        name: name!,
        number: Number(number),
      };
    });
}

const upstream = parseFacts(UPSTREAM_FIELDS);
const added = parseFacts(ADDED_FIELDS);

/** What one field looks like in a protobufjs Root, in the vocabulary of the fact lines. */
function describeField(root: protobuf.Root, message: string, name: string): FieldFact | undefined {
  const type = root.lookupType(`runtime.v1.${message}`);
  const field = type.fields[name];
  if (field === undefined) return undefined;
  const typeName = field.resolvedType === null ? field.type : field.resolvedType.fullName.replace(/^\.runtime\.v1\./, '');
  const synthetic = field.partOf !== null && field.partOf.name === `_${name}` && field.partOf.fieldsArray.length === 1;
  if (field instanceof protobuf.MapField) {
    return { message, rule: 'map', type: typeName, keyType: field.keyType, name, number: field.id };
  }
  // From a descriptor set, protobufjs keeps a map as the repeated *Entry message protoc made of it.
  const entry = field.resolvedType;
  if (field.repeated && entry instanceof protobuf.Type && entry.getOption('map_entry') === true) {
    const [key, value] = [entry.fields.key!, entry.fields.value!];
    const valueType = value.resolvedType === null ? value.type : value.resolvedType.fullName.replace(/^\.runtime\.v1\./, '');
    return { message, rule: 'map', type: valueType, keyType: key.type, name, number: field.id };
  }
  const rule = field.repeated ? 'repeated' : synthetic ? 'optional' : 'single';
  return { message, rule, type: typeName, name, number: field.id };
}

let protocDir: string | undefined;
let protocRoot: protobuf.Root | undefined;

beforeAll(() => {
  protocDir = mkdtempSync(path.join(tmpdir(), 'kata-ts-proto-'));
  const out = path.join(protocDir, 'api.pb');
  const res = spawnSync('protoc', [`--descriptor_set_out=${out}`, `-I${path.dirname(protoFilePath())}`, 'api.proto'], {
    encoding: 'utf8',
  });
  if (res.error !== undefined || res.status !== 0) {
    throw new Error(`protoc failed on proto/api.proto (status ${res.status}): ${res.error?.message ?? res.stderr}`);
  }
  const set = descriptor.FileDescriptorSet.decode(readFileSync(out));
  protocRoot = (protobuf.Root as unknown as { fromDescriptor(s: unknown): protobuf.Root }).fromDescriptor(set);
  protocRoot.resolveAll();
});

afterAll(() => {
  if (protocDir !== undefined) rmSync(protocDir, { recursive: true, force: true });
});

describe('proto/api.proto', () => {
  it('loads once from a path under the package root', () => {
    expect(existsSync(protoFilePath())).toBe(true);
    expect(loadCriPackage()).toBe(loadCriPackage());
    expect(PROTO_LOADER_OPTIONS).toEqual({ keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
  });

  it('has at least 40 upstream facts and every one holds in proto-loader/protobufjs and in protoc', () => {
    expect(upstream.length).toBeGreaterThanOrEqual(40);
    for (const fact of [...upstream, ...added]) {
      expect(describeField(criReflectionRoot(), fact.message, fact.name), `${fact.message}.${fact.name}`).toEqual(fact);
      expect(describeField(protocRoot!, fact.message, fact.name), `protoc ${fact.message}.${fact.name}`).toEqual(fact);
    }
  });

  it('has the upstream enum values', () => {
    for (const [name, values] of Object.entries(ENUM_VALUES)) {
      const e = criReflectionRoot().lookupEnum(`runtime.v1.${name}`);
      for (const [value, number] of Object.entries(values)) expect(e.values[value], `${name}.${value}`).toBe(number);
    }
    expect(Object.keys(criReflectionRoot().lookupEnum('runtime.v1.Signal').values)).toHaveLength(66);
  });

  it('offers every upstream rpc of both services, with their types and streaming, and nothing else', () => {
    const { packageDefinition } = loadCriPackage();
    for (const [service, rpcs] of [
      ['RuntimeService', RUNTIME_RPCS],
      ['ImageService', IMAGE_RPCS],
    ] as const) {
      const reflected = criReflectionRoot().lookupService(`runtime.v1.${service}`);
      expect(Object.keys(reflected.methods).sort()).toEqual(Object.keys(rpcs).sort());
      const definition = packageDefinition[`runtime.v1.${service}`] as Record<string, { path: string; responseStream: boolean }>;
      for (const [rpc, [request, response, streaming]] of Object.entries(rpcs)) {
        const method = reflected.methods[rpc]!;
        expect([method.requestType, method.responseType, method.responseStream === true, method.requestStream === true]).toEqual([
          request,
          response,
          streaming,
          false,
        ]);
        expect(definition[rpc]?.path).toBe(`/runtime.v1.${service}/${rpc}`);
        expect(definition[rpc]?.responseStream).toBe(streaming);
      }
    }
    expect(Object.keys(loadCriPackage().runtimeService)).toHaveLength(35);
    expect(Object.keys(loadCriPackage().imageService)).toHaveLength(6);
  });

  it('adds KEP-4112 fields at numbers no upstream field of the same message uses', () => {
    for (const fact of added) {
      const taken = upstream.filter((u) => u.message === fact.message).map((u) => u.number);
      expect(taken, `${fact.message}.${fact.name}`).not.toContain(fact.number);
    }
    expect(added.find((f) => f.message === 'ContainerConfig')?.number).not.toBe(18);
    // The four extended upstream messages hold exactly the upstream facts plus the additions.
    for (const message of ['PodSandboxConfig', 'ContainerConfig', 'UpdateContainerResourcesRequest', 'UpdatePodSandboxResourcesRequest']) {
      const expected = [...upstream, ...added]
        .filter((f) => f.message === message)
        .map((f) => f.name)
        .sort();
      expect(Object.keys(criReflectionRoot().lookupType(`runtime.v1.${message}`).fields).sort(), message).toEqual(expected);
    }
  });

  it('has no two fields sharing a number in any message', () => {
    const walk = (ns: protobuf.NamespaceBase): void => {
      for (const nested of ns.nestedArray) {
        if (nested instanceof protobuf.Type) {
          const numbers = nested.fieldsArray.map((f) => f.id);
          expect(new Set(numbers).size, nested.fullName).toBe(numbers.length);
        }
        if (nested instanceof protobuf.Namespace) walk(nested);
      }
    };
    walk(criReflectionRoot());
  });

  it('encodes Quantity exactly as apimachinery does and the 1001 field with its own tag', () => {
    const root = criReflectionRoot();
    const quantity = root.lookupType('runtime.v1.Quantity');
    // Field 1, wire type 2 (0x0a), length 4, "500m": the bytes apimachinery's Quantity produces.
    expect(Buffer.from(quantity.encode(quantity.fromObject({ string: '500m' })).finish())).toEqual(
      Buffer.from([0x0a, 0x04, ...Buffer.from('500m')]),
    );
    const config = root.lookupType('runtime.v1.ContainerConfig');
    const bytes = Buffer.from(config.encode(config.fromObject({ stop_signal: 'SIGTERM', kubernetes_resources: {} })).finish());
    // stop_signal: tag (18<<3|0) = 0x90 0x01, value 23; kubernetes_resources: tag (1001<<3|2) = 0xca 0x3e, length 0.
    expect(bytes).toEqual(Buffer.from([0x90, 0x01, 23, 0xca, 0x3e, 0x00]));
  });

  it('round-trips a RunPodSandboxRequest with pod_resources through the grpc-js (de)serializers', () => {
    const method = (
      loadCriPackage().packageDefinition['runtime.v1.RuntimeService'] as Record<
        string,
        {
          requestSerialize(v: object): Buffer;
          requestDeserialize(b: Buffer): object;
        }
      >
    ).RunPodSandbox!;
    const request = {
      config: {
        metadata: { name: 'web', uid: 'u-1', namespace: 'default', attempt: 2 },
        linux: {
          cgroup_parent: '/kubepods/pod-u-1',
          resources: { cpu_quota: '200000', cpu_period: '100000', memory_limit_in_bytes: '2147483648' },
        },
        pod_resources: {
          containers: [
            {
              name: 'app',
              type: 'REGULAR_CONTAINER',
              kubernetes_resources: { requests: { cpu: { string: '1' }, memory: { string: '1Gi' } }, limits: { cpu: { string: '2' } } },
              mounts: [{ container_path: '/data', image: { image: 'sha256:abc' }, image_sub_path: 'sub' }],
              CDI_devices: [{ name: 'example.com/gpu=0' }],
            },
            { name: 'init', type: 'INIT_CONTAINER' },
          ],
          kubernetes_resources: { limits: { memory: { string: '3Gi' } } },
        },
      },
      runtime_handler: 'kata-ts',
    };
    const decoded = method.requestDeserialize(method.requestSerialize(request)) as RunPodSandboxRequest__Output;
    const pod = decoded.config!.pod_resources!;
    expect(decoded.runtime_handler).toBe('kata-ts');
    expect(decoded.config!.linux!.resources!.memory_limit_in_bytes).toBe('2147483648');
    expect(pod.containers.map((c) => [c.name, c.type])).toEqual([
      ['app', 'REGULAR_CONTAINER'],
      ['init', 'INIT_CONTAINER'],
    ]);
    expect(pod.containers[0]!.kubernetes_resources!.requests.memory!.string).toBe('1Gi');
    expect(pod.containers[0]!.kubernetes_resources!.limits.cpu!.string).toBe('2');
    expect(pod.containers[0]!.mounts[0]!.image!.image).toBe('sha256:abc');
    expect(pod.containers[0]!.mounts[0]!.image_sub_path).toBe('sub');
    expect(pod.containers[0]!.CDI_devices[0]!.name).toBe('example.com/gpu=0');
    expect(pod.containers[1]!.kubernetes_resources).toBeNull();
    expect(pod.kubernetes_resources!.limits.memory!.string).toBe('3Gi');
  });
});
