/**
 * Reason codes (`KataError.reason`) raised by pod networking (CNI, the pod's network namespace,
 * the TAP wiring). Declaration merging makes them known to src/common/errors.ts.
 */
export type NetworkReason =
  | 'CNI_CONFIG_INVALID'
  | 'CNI_CONFIG_MISSING'
  | 'CNI_PLUGIN_FAILED'
  | 'CNI_PLUGIN_MISSING'
  | 'CNI_RESULT_INVALID'
  | 'JOIN_NETNS_INVALID'
  | 'JOIN_NETNS_MISSING'
  | 'JOIN_NETNS_NO_ADDRESS'
  | 'JOIN_NETNS_NO_INTERFACE'
  | 'JOIN_NETNS_NOT_NETNS'
  | 'JOIN_NETNS_UNREADABLE'
  | 'NETNS_FAILED'
  | 'POD_HOST_NETWORK_UNSUPPORTED'
  | 'TAP_WIRING_FAILED';

declare module '../common/errors.js' {
  interface KataReasons {
    network: NetworkReason;
  }
}
