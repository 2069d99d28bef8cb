import { invalid } from '../../common/errors.js';
import type { DNSConfig__Output } from '../../generated/runtime/v1/DNSConfig.js';
import type { KubernetesResources__Output } from '../../generated/runtime/v1/KubernetesResources.js';
import type { LinuxPodSandboxConfig__Output } from '../../generated/runtime/v1/LinuxPodSandboxConfig.js';
import type { PodResourceConfig__Output } from '../../generated/runtime/v1/PodResourceConfig.js';
import type { PodSandboxConfig__Output } from '../../generated/runtime/v1/PodSandboxConfig.js';
import type { PodSandboxMetadata__Output } from '../../generated/runtime/v1/PodSandboxMetadata.js';
import type { PortMapping__Output } from '../../generated/runtime/v1/PortMapping.js';
import { checkLogDirectory } from './log-path.js';
import { refuseNames, sandboxNameProblems } from './names.js';
import { dnsConfigProblems, portMappingProblems, refuseFields, sysctlProblems } from './sandbox-fields.js';
import { nullable, protoMessage, stringList, stringMap } from './schema.js';

/**
 * A pod's configuration after RunPodSandbox validation: what planning, the sandbox record,
 * admission and resize carry. Field names and value spellings are the CRI proto's as grpc-js
 * decodes them (snake_case, int64 as decimal strings, enums by name), so the sizing planner and
 * admission read it structurally; unlike the raw request, the pod's identity is always present
 * and Windows-only fields are gone. A resize replaces `linux.resources`/`overhead` and
 * `pod_resources`: the spec is the configuration in force, not only the one first received.
 */
export interface SandboxSpec {
  metadata: PodSandboxMetadata__Output;
  hostname: string;
  log_directory: string;
  dns_config: DNSConfig__Output | null;
  port_mappings: PortMapping__Output[];
  labels: Record<string, string>;
  annotations: Record<string, string>;
  linux: LinuxPodSandboxConfig__Output | null;
  /** KEP-4112: every container of the pod, announced before the VM is shaped. */
  pod_resources: PodResourceConfig__Output | null;
}

/** The pod identity part of the spec, also the record's key for ALREADY_EXISTS. */
export type SandboxMetadata = PodSandboxMetadata__Output;

/**
 * Host namespaces a pod VM cannot join: the host's network and IPC namespaces are outside the VM.
 * Refused before a VM boots, so the kubelet hears INVALID_ARGUMENT at once (the OCI builder
 * refuses the same for containers). Host PID is honoured as the guest's root PID namespace.
 */
function refuseHostNamespaces(linux: LinuxPodSandboxConfig__Output | null): void {
  const opts = linux?.security_context?.namespace_options;
  const field = 'config.linux.security_context.namespace_options';
  if (opts?.network === 'NODE') {
    throw invalid('SANDBOX_HOST_NAMESPACE_UNSUPPORTED', `${field}.network is NODE, but the host's network namespace is outside the pod VM`);
  }
  if (opts?.ipc === 'NODE') {
    throw invalid('SANDBOX_HOST_NAMESPACE_UNSUPPORTED', `${field}.ipc is NODE, but the host's IPC namespace is outside the pod VM`);
  }
}

/**
 * validate RunPodSandboxRequest.config into a SandboxSpec (pure). Only the parts that must be
 * present before anything is planned are checked here: the config and the pod's identity, that
 * the pod asks for no host namespace a VM cannot give, and every field that reaches a host path,
 * CNI or a file the runtime writes (names, log_directory, port mappings, dns_config, sysctls);
 * sizes and devices are the planners' to judge, cgroup_parent the cgroup driver's (prepare). `recorded`: the config of a sandbox that already runs (a record being migrated),
 * which is not judged again.
 */
export function decodeSandboxSpec(config: PodSandboxConfig__Output | null, options: { recorded?: boolean } = {}): SandboxSpec {
  if (config === null) throw invalid('SANDBOX_CONFIG_MISSING', 'config is required in RunPodSandboxRequest');
  const m = config.metadata;
  if (m === null) throw invalid('SANDBOX_METADATA_MISSING', 'config.metadata is required');
  for (const field of ['name', 'namespace', 'uid'] as const) {
    if (m[field] === '') throw invalid('SANDBOX_METADATA_INVALID', `config.metadata.${field} must not be empty`);
  }
  if (options.recorded !== true) {
    refuseHostNamespaces(config.linux);
    checkLogDirectory(config.log_directory, 'config.log_directory');
    refuseNames(sandboxNameProblems(config));
    refuseFields([
      ...portMappingProblems(config.port_mappings, 'config.port_mappings'),
      ...dnsConfigProblems(config.dns_config, 'config.dns_config'),
      ...sysctlProblems(config.linux?.sysctls ?? {}, 'config.linux.sysctls'),
    ]);
  }
  return {
    metadata: { name: m.name, uid: m.uid, namespace: m.namespace, attempt: m.attempt },
    hostname: config.hostname,
    log_directory: config.log_directory,
    dns_config: config.dns_config,
    port_mappings: config.port_mappings,
    labels: config.labels,
    annotations: config.annotations,
    linux: config.linux,
    pod_resources: config.pod_resources,
  };
}

/** The linux part of a spec that had none (UpdatePodSandboxResources may add resources to it). */
export function emptyLinuxSandboxConfig(): LinuxPodSandboxConfig__Output {
  return { cgroup_parent: '', security_context: null, sysctls: {}, overhead: null, resources: null };
}

/** The cgroup parent the kubelet asked for ('' when none). */
export function cgroupParentOf(spec: SandboxSpec): string {
  return spec.linux?.cgroup_parent ?? '';
}

/** The pod_resources RunPodSandbox (or a later resize) announced, when it named any container. */
export function announcedPodResources(spec: SandboxSpec): PodResourceConfig__Output | undefined {
  const podResources = spec.pod_resources;
  if (podResources === null) return undefined;
  return podResources.containers.length > 0 ? podResources : undefined;
}

/** The announced pod resources with one container's Kubernetes resources replaced. */
export function withContainerResources(
  announced: PodResourceConfig__Output,
  name: string,
  resources: KubernetesResources__Output,
): PodResourceConfig__Output {
  return {
    ...announced,
    containers: announced.containers.map((c) => (c.name === name ? { ...c, kubernetes_resources: resources } : c)),
  };
}

/** JSON Schema of a SandboxSpec inside a record: every top-level field typed, nested proto messages as objects. */
export const SANDBOX_SPEC_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: ['metadata', 'hostname', 'log_directory', 'dns_config', 'port_mappings', 'labels', 'annotations', 'linux', 'pod_resources'],
  properties: {
    metadata: {
      type: 'object',
      additionalProperties: false,
      required: ['name', 'uid', 'namespace', 'attempt'],
      properties: {
        name: { type: 'string', minLength: 1 },
        uid: { type: 'string', minLength: 1 },
        namespace: { type: 'string', minLength: 1 },
        attempt: { type: 'integer', minimum: 0 },
      },
    },
    hostname: { type: 'string' },
    log_directory: { type: 'string' },
    dns_config: nullable({
      type: 'object',
      required: ['servers', 'searches', 'options'],
      properties: { servers: stringList, searches: stringList, options: stringList },
    }),
    port_mappings: { type: 'array', items: protoMessage },
    labels: stringMap,
    annotations: stringMap,
    linux: nullable({
      type: 'object',
      required: ['cgroup_parent', 'security_context', 'sysctls', 'overhead', 'resources'],
      properties: {
        cgroup_parent: { type: 'string' },
        security_context: nullable(protoMessage),
        sysctls: stringMap,
        overhead: nullable(protoMessage),
        resources: nullable(protoMessage),
      },
    }),
    pod_resources: nullable({
      type: 'object',
      required: ['containers', 'kubernetes_resources'],
      properties: { containers: { type: 'array', items: protoMessage }, kubernetes_resources: nullable(protoMessage) },
    }),
  },
} as const;
