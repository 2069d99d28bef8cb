/**
 * The sandbox layer's side of pod networking: what the guest agent is told (ConfigureNetwork)
 * from the CNI result and the pod's DNS config, and the pod's IPs for the faces to report.
 */
import type { AgentClient } from '../../agent-client/index.js';
import type { CallOptions } from '../../channel/index.js';
import type { KataConfig } from '../../config/types.js';
import { type CniPortMapping, type PodNetworkRecord, type PodNetworkRequest, PodNetworks, podIps } from '../../network/index.js';
import type { SandboxSpec } from '../spec/sandbox.js';

/**
 * The NIC's MAC in a plan made before CNI ADD (`kata-ts plan`, RunPodSandbox's first plan): a
 * locally administered address that no CNI interface gets. RunPodSandbox plans again with the real one.
 */
export const PLANNED_MAC = '02:00:00:00:00:00';

/** Tell the guest its network: the CNI interface's MAC, MTU and addresses, the routes, DNS (the CRI's DNSConfig first). */
export async function configureGuestNetwork(
  agent: AgentClient,
  net: PodNetworkRecord,
  spec: SandboxSpec,
  options: CallOptions,
): Promise<void> {
  const result = net.result;
  if (result === null || net.mac === null) throw new Error('the pod network has no CNI result to configure the guest with');
  const dns = spec.dns_config ?? { servers: result.dns.servers, searches: result.dns.searches, options: result.dns.options };
  await agent.configureNetwork(
    {
      interfaces: [
        { mac: net.mac.toLowerCase(), mtu: net.mtu ?? 0, addresses: result.ips.map((ip) => `${ip.address}/${ip.prefixLength}`) },
      ],
      // A route without a gateway uses the gateway of the pod's address of its family (CNI's meaning).
      routes: result.routes.map((r) => {
        const v6 = r.destination.includes(':');
        const gateway = r.gateway ?? result.ips.find((ip) => (ip.family === 6) === v6 && ip.gateway !== undefined)?.gateway ?? '';
        return { destination: r.destination, gateway };
      }),
      dnsServers: dns.servers,
      dnsSearches: dns.searches,
      dnsOptions: dns.options,
    },
    options,
  );
}

/** The pod's IPs as CNI ADD gave them, the primary first (IPv4 first); none without networking. */
export function sandboxIps(net: PodNetworkRecord | null): string[] {
  return net?.result === null || net?.result === undefined ? [] : podIps(net.result);
}

/**
 * Who tears a recorded pod network down: the configured one, or (networking since switched off)
 * one made from the config's CNI paths; the record carries the network list that ADD ran.
 */
export function networksFor(deps: { network?: PodNetworks | undefined; config: KataConfig }): PodNetworks {
  return deps.network ?? new PodNetworks(deps.config.network);
}

/** What the network layer needs of a pod's CRI config. */
export function podNetworkRequest(sandboxId: string, spec: SandboxSpec): PodNetworkRequest {
  return {
    hostNetwork: spec.linux?.security_context?.namespace_options?.network === 'NODE',
    portMappings: cniPortMappings(spec),
    cniArgs: cniArgs(sandboxId, spec),
  };
}

/** The CRI port mappings with a host port, as portmap's `portMappings`. */
export function cniPortMappings(spec: SandboxSpec): CniPortMapping[] {
  return spec.port_mappings
    .filter((p) => p.host_port > 0)
    .map((p) => ({
      hostPort: p.host_port,
      containerPort: p.container_port,
      protocol: String(p.protocol || 'TCP').toLowerCase() as CniPortMapping['protocol'],
      ...(p.host_ip === '' ? {} : { hostIP: p.host_ip }),
    }));
}

/** CNI_ARGS as the kubelet's runtimes pass it (plugins ignore the keys they do not know). */
export function cniArgs(sandboxId: string, spec: SandboxSpec): string {
  const m = spec.metadata;
  return `IgnoreUnknown=1;K8S_POD_NAMESPACE=${m.namespace};K8S_POD_NAME=${m.name};K8S_POD_INFRA_CONTAINER_ID=${sandboxId};K8S_POD_UID=${m.uid}`;
}
