/**
 * What a sandbox record keeps of its pod network (sandbox record format 5): every step is
 * recorded before or as it is taken, so that undoing it, also at the next start after a crash,
 * knows what there is to undo, and what is not ours to undo.
 */
import { callerPath } from '../common/caller-root.js';
import type { CniNetworkList } from './cni-config.js';
import type { CniAttachment } from './cni-exec.js';
import type { PodNetworkResult } from './result.js';
import type { NetnsRef } from './wiring.js';

/** What both kinds hold: where the VM's NIC is joined, what the guest is told, how far the wiring got. */
interface PodNetworkCommon {
  /** The namespace QEMU runs in (`nsenter --net=`). */
  netnsPath: string;
  /** The interface the VM is joined to (`eth0`). */
  ifName: string;
  tapName: string;
  /** What the guest is told: CNI ADD's result, or what the joined namespace's interface holds. */
  result: PodNetworkResult | null;
  /** The interface's MAC and MTU, which the VM's NIC takes. */
  mac: string | null;
  mtu: number | null;
  /** True from just before the TAP wiring until it was undone. */
  tapWired: boolean;
}

/** A pod network kata-ts made (network.mode "cni"): its own namespace, CNI ADD in it, the TAP. */
export interface CniPodNetworkRecord extends PodNetworkCommon {
  kind: 'cni';
  /** `kata-ts-<16 hex>` in NETNS_DIR; removed at RemovePodSandbox. */
  netnsName: string;
  /** The network list ADD ran with: DEL must run the same one, whatever the node's config says later. */
  cniNetwork: CniNetworkList;
  attachment: CniAttachment;
  /** True from just before CNI ADD until a DEL succeeded: DEL is due (also after a crash). */
  cniAttached: boolean;
  /** ADD's raw result (DEL's prevResult). */
  cniResult: unknown;
}

/**
 * A namespace the caller made and attached (the shim: containerd ran CNI in it): only the TAP
 * wiring is ours, and only it is ever undone; never CNI DEL, never the namespace itself.
 */
export interface JoinedPodNetworkRecord extends PodNetworkCommon {
  kind: 'joined';
  /** Its name for iproute2's `-n` (it is in NETNS_DIR), or null: commands run under `nsenter --net=netnsPath`. */
  netnsName: string | null;
}

export type PodNetworkRecord = CniPodNetworkRecord | JoinedPodNetworkRecord;

/** Where the record's iproute2 commands run (a caller's namespace by a path this process can open: callerPath). */
export function netnsRefOf(net: PodNetworkRecord): NetnsRef {
  return net.netnsName ?? { path: netnsPathOf(net) };
}

/**
 * The path this process enters the record's namespace by: the record's own, or for a namespace
 * the caller made (`joined`), that path as the caller's mount namespace resolves it when ours does
 * not see the same file (src/common/caller-root.ts).
 */
export function netnsPathOf(net: PodNetworkRecord): string {
  return net.kind === 'joined' ? callerPath(net.netnsPath) : net.netnsPath;
}
