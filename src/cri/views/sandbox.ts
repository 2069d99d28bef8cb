import type { NamespaceOption } from '../../generated/runtime/v1/NamespaceOption.js';
import type { PodSandbox } from '../../generated/runtime/v1/PodSandbox.js';
import type { PodSandboxFilter__Output } from '../../generated/runtime/v1/PodSandboxFilter.js';
import type { PodSandboxStatus } from '../../generated/runtime/v1/PodSandboxStatus.js';
import { podNetworkStatus } from '../../runtime/sandbox/network.js';
import type { SandboxRecord } from '../../runtime/sandbox/record.js';

/** What ListPodSandbox returns for one sandbox. */
export function podSandboxView(r: SandboxRecord): PodSandbox {
  return {
    id: r.id,
    metadata: r.metadata,
    state: r.state,
    created_at: r.createdAtNs,
    labels: r.labels,
    annotations: r.annotations,
    runtime_handler: r.runtimeHandler,
  };
}

/** The namespace options the kubelet asked for, echoed back as CRI runtimes do. */
function namespaceOptions(r: SandboxRecord): NamespaceOption | null {
  return r.spec.linux?.security_context?.namespace_options ?? null;
}

/** PodSandboxStatus.status for one sandbox: the pod IPs are what CNI ADD gave it (none without networking). */
export function podSandboxStatusView(r: SandboxRecord): PodSandboxStatus {
  return {
    ...podSandboxView(r),
    network: podNetworkStatus(r.network),
    linux: { namespaces: { options: namespaceOptions(r) } },
  };
}

/** True when every label of the selector is present with the same value. */
export function matchesLabels(labels: Record<string, string>, selector: Record<string, string>): boolean {
  return Object.entries(selector).every(([k, v]) => labels[k] === v);
}

/**
 * ListPodSandbox filtering as the CRI describes it: id (a full id or the unique prefix crictl
 * prints), state, and a label selector; unset parts do not filter.
 */
export function sandboxMatches(r: SandboxRecord, filter: PodSandboxFilter__Output | null | undefined): boolean {
  if (filter === null || filter === undefined) return true;
  if (filter.id !== '' && !r.id.startsWith(filter.id)) return false;
  if (filter.state !== null && filter.state !== undefined && filter.state.state !== r.state) return false;
  return matchesLabels(r.labels, filter.label_selector ?? {});
}
