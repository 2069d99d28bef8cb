/**
 * The CRI namespace modes a config.json's `linux.namespaces` stands for (pure). containerd and
 * CRI-O leave a namespace out for the host's (NODE), list it with a path to join the pod's, and
 * list it without one for a new namespace of the container's own.
 */
import type { NamespaceOption__Output } from '../../generated/runtime/v1/NamespaceOption.js';
import type { OciNamespace, OciNamespaceType } from '../../oci/spec-types.js';
import type { OciRuntimeSpec } from './spec.js';

type Mode = NamespaceOption__Output['pid'];

export function namespaceOf(spec: OciRuntimeSpec, type: OciNamespaceType): OciNamespace | undefined {
  return spec.linux?.namespaces?.find((n) => n.type === type);
}

export function hasNamespace(spec: OciRuntimeSpec, type: OciNamespaceType): boolean {
  return namespaceOf(spec, type) !== undefined;
}

/** Absent: the host's; with a path: joined (the pod's); without: the container's own. */
export function joinMode(spec: OciRuntimeSpec, type: OciNamespaceType): Mode {
  const ns = namespaceOf(spec, type);
  if (ns === undefined) return 'NODE';
  return ns.path === undefined || ns.path === '' ? 'CONTAINER' : 'POD';
}

/** A NamespaceOption with every field present, as grpc-js would decode it. */
export function namespaceOptions(modes: { network: Mode; pid: Mode; ipc: Mode }): NamespaceOption__Output {
  return { network: modes.network, pid: modes.pid, ipc: modes.ipc, target_id: '', userns_options: null };
}
