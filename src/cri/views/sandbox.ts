import type { NamespaceOption } from '../../generated/runtime/v1/NamespaceOption.js';
import type { PodSandbox } from '../../generated/runtime/v1/PodSandbox.js';
import type { PodSandboxStatus } from '../../generated/runtime/v1/PodSandboxStatus.js';
import { sandboxIps } from '../../runtime/sandbox/network.js';
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

/** PodSandboxStatus.network: the primary IP and the others (IPv4 first). */
function podNetworkStatus(r: SandboxRecord): { ip: string; additional_ips: Array<{ ip: string }> } {
  const ips = sandboxIps(r.network);
  return { ip: ips[0] ?? '', additional_ips: ips.slice(1).map((ip) => ({ ip })) };
}

/** PodSandboxStatus.status for one sandbox: the pod IPs are what CNI ADD gave it (none without networking). */
export function podSandboxStatusView(r: SandboxRecord): PodSandboxStatus {
  return {
    ...podSandboxView(r),
    network: podNetworkStatus(r),
    linux: { namespaces: { options: namespaceOptions(r) } },
  };
}
