/**
 * Reason codes (`KataError.reason`) raised while decoding or checking attestation messages and
 * evidence (src/attest): the KBS protocol's payloads, JWE, TPM/SNP/TDX evidence. A new code is
 * added to this union; declaration merging makes it known to src/common/errors.ts.
 */
export type AttestReason =
  | 'ATTEST_MESSAGE_INVALID'
  | 'ATTEST_EVIDENCE_INVALID'
  | 'ATTEST_EVIDENCE_REFUSED'
  | 'ATTEST_JWE_INVALID'
  | 'ATTEST_CREDENTIAL_INVALID'
  | 'ATTEST_EVENT_LOG_INVALID'
  | 'ATTEST_TRUST_INVALID'
  | 'ATTEST_RESOURCE_PATH_INVALID';

declare module '../common/errors.js' {
  interface KataReasons {
    attest: AttestReason;
  }
}
