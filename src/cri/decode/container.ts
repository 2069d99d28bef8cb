/**
 * CRI container requests -> the core's typed values, each decoded once here: the container
 * config through the core's validator (decodeContainerSpec), filters into the core's neutral
 * ContainerFilter, resource updates into a ContainerResourceUpdate.
 */
import type { CreateContainerRequest__Output } from '../../generated/runtime/v1/CreateContainerRequest.js';
import type { ListContainerStatsRequest__Output } from '../../generated/runtime/v1/ListContainerStatsRequest.js';
import type { ListContainersRequest__Output } from '../../generated/runtime/v1/ListContainersRequest.js';
import type { UpdateContainerResourcesRequest__Output } from '../../generated/runtime/v1/UpdateContainerResourcesRequest.js';
import type { ContainerFilter, ContainerResourceUpdate } from '../../runtime/container/types.js';
import { type ContainerSpec, decodeContainerSpec } from '../../runtime/spec/container.js';

export interface CreateContainerInput {
  /** The sandbox's full id or unique prefix. */
  sandboxId: string;
  spec: ContainerSpec;
}

export function decodeCreateContainer(req: CreateContainerRequest__Output): CreateContainerInput {
  return { sandboxId: req.pod_sandbox_id, spec: decodeContainerSpec(req.config) };
}

/** ListContainers' filter: id (or prefix), state, sandbox id (or prefix), label selector. */
export function decodeContainerFilter(req: ListContainersRequest__Output): ContainerFilter | null {
  const f = req.filter;
  if (f === null) return null;
  return {
    idPrefix: f.id,
    sandboxIdPrefix: f.pod_sandbox_id,
    ...(f.state === null ? {} : { state: f.state.state }),
    labels: f.label_selector ?? {},
  };
}

/** ListContainerStats' filter: id (or prefix), sandbox id (or prefix), label selector. */
export function decodeContainerStatsFilter(req: ListContainerStatsRequest__Output): ContainerFilter | null {
  const f = req.filter;
  return f === null ? null : { idPrefix: f.id, sandboxIdPrefix: f.pod_sandbox_id, labels: f.label_selector ?? {} };
}

export function decodeContainerResourceUpdate(req: UpdateContainerResourcesRequest__Output): {
  containerId: string;
  update: ContainerResourceUpdate;
} {
  return {
    containerId: req.container_id,
    update: { linux: req.linux, kubernetes_resources: req.kubernetes_resources },
  };
}
