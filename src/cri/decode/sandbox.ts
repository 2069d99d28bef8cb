/**
 * CRI sandbox requests -> the core's typed values, each decoded once here: the pod config through
 * the core's validator (decodeSandboxSpec, whose refusals any face shares), filters into the
 * core's neutral SandboxFilter, resource updates into a SandboxResourceUpdate.
 */
import type { ListPodSandboxRequest__Output } from '../../generated/runtime/v1/ListPodSandboxRequest.js';
import type { ListPodSandboxStatsRequest__Output } from '../../generated/runtime/v1/ListPodSandboxStatsRequest.js';
import type { RunPodSandboxRequest__Output } from '../../generated/runtime/v1/RunPodSandboxRequest.js';
import type { UpdatePodSandboxResourcesRequest__Output } from '../../generated/runtime/v1/UpdatePodSandboxResourcesRequest.js';
import type { SandboxResourceUpdate } from '../../runtime/container/types.js';
import type { SandboxFilter } from '../../runtime/sandbox/types.js';
import { decodeSandboxSpec, type SandboxSpec } from '../../runtime/spec/sandbox.js';

export interface RunPodSandboxInput {
  spec: SandboxSpec;
  /** The runtime handler's name as the kubelet gave it ('' for the default); the core resolves it. */
  runtimeHandler: string;
}

export function decodeRunPodSandbox(req: RunPodSandboxRequest__Output): RunPodSandboxInput {
  return { spec: decodeSandboxSpec(req.config), runtimeHandler: req.runtime_handler };
}

/** ListPodSandbox's filter: id (or the unique prefix crictl prints), state, label selector. */
export function decodeSandboxFilter(req: ListPodSandboxRequest__Output): SandboxFilter | null {
  const f = req.filter;
  if (f === null) return null;
  return {
    idPrefix: f.id,
    ...(f.state === null ? {} : { state: f.state.state }),
    labels: f.label_selector ?? {},
  };
}

/** ListPodSandboxStats' filter: id (or prefix) and label selector. */
export function decodeSandboxStatsFilter(req: ListPodSandboxStatsRequest__Output): SandboxFilter | null {
  const f = req.filter;
  return f === null ? null : { idPrefix: f.id, labels: f.label_selector ?? {} };
}

export function decodeSandboxResourceUpdate(req: UpdatePodSandboxResourcesRequest__Output): {
  sandboxId: string;
  update: SandboxResourceUpdate;
} {
  return {
    sandboxId: req.pod_sandbox_id,
    update: { resources: req.resources, overhead: req.overhead, pod_resources: req.pod_resources },
  };
}
