/**
 * Reason codes (`KataError.reason`) of the attestation broker (src/broker, `kata-ts broker`):
 * its state directory, configuration, policy and resources. Protocol-level refusals to a guest
 * are HTTP answers with an ErrorInformation body, not these.
 */
export type BrokerReason =
  | 'BROKER_CONFIG_INVALID'
  | 'BROKER_STATE_INVALID'
  | 'BROKER_POLICY_INVALID'
  | 'BROKER_RESOURCE_INVALID'
  | 'BROKER_RESOURCE_NOT_FOUND'
  | 'BROKER_REFERENCE_INVALID'
  | 'BROKER_REFERENCE_NOT_FOUND'
  | 'BROKER_SAN_INVALID'
  | 'BROKER_LISTEN_INVALID'
  | 'BROKER_TLS_CREATE_FAILED'
  | 'BROKER_LISTEN_FAILED';

declare module '../common/errors.js' {
  interface KataReasons {
    broker: BrokerReason;
  }
}
