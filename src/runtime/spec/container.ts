import { invalid } from '../../common/errors.js';
import type { CDIDevice__Output } from '../../generated/runtime/v1/CDIDevice.js';
import type { ContainerConfig__Output } from '../../generated/runtime/v1/ContainerConfig.js';
import type { ContainerMetadata__Output } from '../../generated/runtime/v1/ContainerMetadata.js';
import type { Device__Output } from '../../generated/runtime/v1/Device.js';
import type { ImageSpec__Output } from '../../generated/runtime/v1/ImageSpec.js';
import type { KeyValue__Output } from '../../generated/runtime/v1/KeyValue.js';
import type { KubernetesResources__Output } from '../../generated/runtime/v1/KubernetesResources.js';
import type { LinuxContainerResources__Output } from '../../generated/runtime/v1/LinuxContainerResources.js';
import type { LinuxContainerSecurityContext__Output } from '../../generated/runtime/v1/LinuxContainerSecurityContext.js';
import type { Mount__Output } from '../../generated/runtime/v1/Mount.js';
import type { Signal__Output } from '../../generated/runtime/v1/Signal.js';
import { checkLogPath } from './log-path.js';
import { containerNameProblems, refuseNames } from './names.js';
import { containerMetadata, nullable, protoMessage, stringList, stringMap } from './schema.js';

/** The Linux part of a container: its cgroup resources and its security context. */
export interface ContainerLinuxSpec {
  resources: LinuxContainerResources__Output | null;
  security_context: LinuxContainerSecurityContext__Output | null;
}

/**
 * A container's configuration after CreateContainer validation: what admission, hot-plug, the
 * container record, resize and (later) the OCI spec generator carry. Names and value spellings
 * are the CRI proto's as grpc-js decodes them, so admission reads it structurally; unlike the
 * raw ContainerConfig, metadata and image are always present and Windows-only fields are gone.
 * UpdateContainerResources replaces `linux.resources` and `kubernetes_resources`.
 */
export interface ContainerSpec {
  metadata: ContainerMetadata__Output;
  image: ImageSpec__Output;
  command: string[];
  args: string[];
  working_dir: string;
  envs: KeyValue__Output[];
  mounts: Mount__Output[];
  devices: Device__Output[];
  CDI_devices: CDIDevice__Output[];
  labels: Record<string, string>;
  annotations: Record<string, string>;
  /** Relative to the sandbox's log_directory ('' = no log). */
  log_path: string;
  stdin: boolean;
  stdin_once: boolean;
  tty: boolean;
  linux: ContainerLinuxSpec | null;
  stop_signal: Signal__Output;
  /** KEP-4112 field 1001: the container's requests and limits as Kubernetes quantities. */
  kubernetes_resources: KubernetesResources__Output | null;
}

/** The CRI's MountPropagation as grpc-js decodes it (by name); a number is a value it did not know. */
const MOUNT_PROPAGATIONS: readonly unknown[] = ['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER', 'PROPAGATION_BIDIRECTIONAL'];

/**
 * Each mount's propagation is one the CRI names (it picks the host's `mount --make-*` flag) and
 * its paths carry no NUL (which would cut the path short in the C library); host_path's own rules
 * (absolute, no "..", usable on the host) are checked with the host at hand (mount-sources.ts).
 */
function checkMountFields(mounts: readonly Mount__Output[]): void {
  for (const [i, m] of mounts.entries()) {
    const field = `config.mounts[${i}]`;
    if (!MOUNT_PROPAGATIONS.includes(m.propagation as unknown))
      throw invalid(
        'CONTAINER_MOUNT_SOURCE_INVALID',
        `${field}.propagation is ${JSON.stringify(m.propagation)}; it must be one of ${MOUNT_PROPAGATIONS.join(', ')}`,
      );
    if (m.container_path.includes('\0') || m.host_path.includes('\0'))
      throw invalid('CONTAINER_MOUNT_SOURCE_INVALID', `${field} has a NUL byte in a path`);
  }
}

/**
 * validate CreateContainerRequest.config into a ContainerSpec (pure): config, metadata.name and
 * image.image must be present, and a security context that names a group must name a user
 * (the CRI says run_as_group is only valid with run_as_user or run_as_username).
 */
export function decodeContainerSpec(config: ContainerConfig__Output | null): ContainerSpec {
  if (config === null) throw invalid('CONTAINER_CONFIG_MISSING', 'config is required in CreateContainerRequest');
  if (config.metadata === null || config.metadata.name === '')
    throw invalid('CONTAINER_METADATA_INVALID', 'config.metadata.name must not be empty');
  if (config.image === null || config.image.image === '') throw invalid('CONTAINER_IMAGE_MISSING', 'config.image.image must not be empty');
  refuseNames(containerNameProblems(config));
  checkLogPath(config.log_path, 'config.log_path');
  checkMountFields(config.mounts);
  const security = config.linux?.security_context ?? null;
  if (security !== null && security.run_as_group !== null && security.run_as_user === null && security.run_as_username === '') {
    throw invalid(
      'CONTAINER_RUN_AS_GROUP_WITHOUT_USER',
      'config.linux.security_context.run_as_group is set without run_as_user or run_as_username',
    );
  }
  return containerSpecOf({ ...config, metadata: config.metadata, image: config.image });
}

/**
 * The spec of a config whose metadata and image are present, without the request checks (a
 * stored config was checked when it was received; rules added since must not drop it).
 */
export function containerSpecOf(
  config: ContainerConfig__Output & { metadata: ContainerMetadata__Output; image: ImageSpec__Output },
): ContainerSpec {
  const security = config.linux?.security_context ?? null;
  return {
    metadata: { name: config.metadata.name, attempt: config.metadata.attempt },
    image: config.image,
    command: config.command,
    args: config.args,
    working_dir: config.working_dir,
    envs: config.envs,
    mounts: config.mounts,
    devices: config.devices,
    CDI_devices: config.CDI_devices,
    labels: config.labels,
    annotations: config.annotations,
    log_path: config.log_path,
    stdin: config.stdin,
    stdin_once: config.stdin_once,
    tty: config.tty,
    linux: config.linux === null ? null : { resources: config.linux.resources, security_context: security },
    stop_signal: config.stop_signal,
    kubernetes_resources: config.kubernetes_resources,
  };
}

/** JSON Schema of a ContainerSpec inside a record: every top-level field typed, nested proto messages as objects. */
export const CONTAINER_SPEC_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: [
    'metadata',
    'image',
    'command',
    'args',
    'working_dir',
    'envs',
    'mounts',
    'devices',
    'CDI_devices',
    'labels',
    'annotations',
    'log_path',
    'stdin',
    'stdin_once',
    'tty',
    'linux',
    'stop_signal',
    'kubernetes_resources',
  ],
  properties: {
    metadata: containerMetadata,
    image: {
      type: 'object',
      required: ['image', 'annotations'],
      properties: { image: { type: 'string', minLength: 1 }, annotations: stringMap },
    },
    command: stringList,
    args: stringList,
    working_dir: { type: 'string' },
    envs: {
      type: 'array',
      items: { type: 'object', required: ['key', 'value'], properties: { key: { type: 'string' }, value: { type: 'string' } } },
    },
    mounts: { type: 'array', items: protoMessage },
    devices: { type: 'array', items: protoMessage },
    CDI_devices: { type: 'array', items: protoMessage },
    labels: stringMap,
    annotations: stringMap,
    log_path: { type: 'string' },
    stdin: { type: 'boolean' },
    stdin_once: { type: 'boolean' },
    tty: { type: 'boolean' },
    linux: nullable({
      type: 'object',
      additionalProperties: false,
      required: ['resources', 'security_context'],
      properties: { resources: nullable(protoMessage), security_context: nullable(protoMessage) },
    }),
    stop_signal: { type: 'string' },
    kubernetes_resources: nullable(protoMessage),
  },
} as const;
