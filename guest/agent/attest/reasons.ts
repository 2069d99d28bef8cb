/**
 * Reason codes (`KataError.reason`) of the guest's attester (guest/agent/attest): its broker
 * configuration from initdata, the conversation with the broker and the resources it asks for.
 * They reach the host through the agent's calls (CreateContainer of a pod asking for a secret),
 * so a caller can branch on them with `isReason`.
 */
export type GuestAttestReason =
  /** The initdata names a broker in a way that cannot be used (the message names the key). */
  | 'ATTEST_CONFIG_INVALID'
  /** No initdata, or an initdata that names no broker: attestation is off in this pod. */
  | 'ATTEST_OFF'
  /** The broker could not be reached (connection, TLS, timeout) within the retry budget. */
  | 'ATTEST_BROKER_UNREACHABLE'
  /** The broker answered something the protocol does not allow (status, body, cookie). */
  | 'ATTEST_BROKER_PROTOCOL'
  /** The broker refused the evidence (its ErrorInformation detail is in the message). */
  | 'ATTEST_REFUSED'
  /** The broker refused one resource, or has none by that name (its detail is in the message). */
  | 'ATTEST_RESOURCE_REFUSED'
  /** The TPM could not produce the evidence (EK certificate, key, activation, quote, event log). */
  | 'ATTEST_EVIDENCE_FAILED';

declare module '../../../src/common/errors.js' {
  interface KataReasons {
    guestAttest: GuestAttestReason;
  }
}
