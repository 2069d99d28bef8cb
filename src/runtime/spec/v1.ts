import { invalid } from '../../common/errors.js';
import type { ContainerConfig__Output } from '../../generated/runtime/v1/ContainerConfig.js';
import type { PodSandboxConfig__Output } from '../../generated/runtime/v1/PodSandboxConfig.js';
import { type ContainerSpec, containerSpecOf } from './container.js';
import { decodeSandboxSpec, emptyLinuxSandboxConfig, type SandboxSpec } from './sandbox.js';

/**
 * Record format 1 stored the decoded request as received (`podConfig`, the container's `config`):
 * grpc-js objects written as JSON, so every field is there, except where a format-1 resize merged
 * a partial object in (`linux: { resources }` for a pod or container that had no linux part).
 * These turn such a blob into today's spec through the same decoder a request goes through,
 * filling what a format-1 resize left out with the proto3 defaults.
 */
type Blob = Record<string, unknown>;

function objectOrNull(value: unknown): Blob | null {
  return typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Blob) : null;
}

/** A format-1 `podConfig` as today's SandboxSpec; throws KataError invalid when it cannot be one. */
export function sandboxSpecFromV1(podConfig: Blob): SandboxSpec {
  const linux = objectOrNull(podConfig.linux);
  const config = {
    hostname: '',
    log_directory: '',
    dns_config: null,
    port_mappings: [],
    labels: {},
    annotations: {},
    pod_resources: null,
    windows: null,
    ...podConfig,
    metadata: objectOrNull(podConfig.metadata),
    linux: linux === null ? null : { ...emptyLinuxSandboxConfig(), ...linux },
  } as unknown as PodSandboxConfig__Output;
  return decodeSandboxSpec(config, { recorded: true });
}

/** A format-1 container `config` as today's ContainerSpec; throws KataError invalid when it cannot be one. */
export function containerSpecFromV1(config: Blob): ContainerSpec {
  const linux = objectOrNull(config.linux);
  const full = {
    command: [],
    args: [],
    working_dir: '',
    envs: [],
    mounts: [],
    devices: [],
    CDI_devices: [],
    labels: {},
    annotations: {},
    log_path: '',
    stdin: false,
    stdin_once: false,
    tty: false,
    windows: null,
    stop_signal: 'RUNTIME_DEFAULT',
    kubernetes_resources: null,
    ...config,
    metadata: objectOrNull(config.metadata),
    image: objectOrNull(config.image),
    linux: linux === null ? null : { resources: null, security_context: null, ...linux },
  } as unknown as ContainerConfig__Output;
  const { metadata, image } = full;
  // Format 1 wrote only configs that passed CreateContainer's checks; newer checks are not applied.
  if (metadata === null || image === null)
    throw invalid('RECORD_CONTAINER_CONFIG_INVALID', 'config.metadata and config.image are required');
  return containerSpecOf({ ...full, metadata, image });
}
