export { type CniNetworkList, loadCniNetwork, type NetworkReadiness, networkReadiness, parseCniConfig } from './cni-config.js';
export { type CniPortMapping, cniAdd, cniDel } from './cni-exec.js';
export { type PodNetworkRecord, type PodNetworkRequest, PodNetworks } from './pod-network.js';
export { type PodNetworkResult, parseCniResult, podIps } from './result.js';
export { NETNS_DIR, netnsNameFor, POD_IF_NAME, POD_NETNS_NAME, POD_TAP_NAME, planTapUnwiring, planTapWiring } from './wiring.js';
