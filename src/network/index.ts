export { type CniNetworkList, loadCniNetwork, type NetworkReadiness, networkReadiness, parseCniConfig } from './cni-config.js';
export { type CniPortMapping, cniAdd, cniDel } from './cni-exec.js';
export { parseIpAddr, parseIpRoutes } from './ip-json.js';
export { joinedNetnsName, readJoinedNetwork } from './joined.js';
export { type PodNetworkRequest, PodNetworks } from './pod-network.js';
export { type CniPodNetworkRecord, type JoinedPodNetworkRecord, netnsPathOf, netnsRefOf, type PodNetworkRecord } from './record.js';
export { type PodNetworkResult, parseCniResult, podIps } from './result.js';
export {
  createNetns,
  deleteNetns,
  inNetns,
  NETNS_DIR,
  type NetnsRef,
  netnsNameFor,
  POD_IF_NAME,
  POD_NETNS_NAME,
  POD_TAP_NAME,
  planTapUnwiring,
  planTapWiring,
  type TapOptions,
  type TapOwner,
} from './wiring.js';
