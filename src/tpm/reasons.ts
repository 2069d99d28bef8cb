/**
 * Reason codes (`KataError.reason`) of a pod's swtpm and the node's EK certificate authority
 * (src/tpm). A new code is added to this union; declaration merging below makes it known to the
 * factories and to `isReason` in src/common/errors.ts.
 */
export type TpmReason =
  | 'TPM_CA_DIR_INVALID'
  | 'TPM_CA_MISSING'
  | 'TPM_CA_CORRUPT'
  | 'TPM_CA_CREATE_FAILED'
  | 'TPM_CA_BUSY'
  | 'SWTPM_OPTION_INVALID'
  | 'SWTPM_IDENTITY_SHARED'
  | 'SWTPM_JAIL_REQUIRED'
  | 'SWTPM_SETUP_FAILED'
  | 'SWTPM_EK_CERT_INVALID'
  | 'SWTPM_STATE_DIR_UNSAFE'
  | 'SWTPM_LOG_UNWRITABLE'
  | 'SWTPM_SPAWN_FAILED'
  | 'SWTPM_EXITED'
  | 'SWTPM_START_TIMEOUT'
  | 'SWTPM_PLACE_FAILED';

declare module '../common/errors.js' {
  interface KataReasons {
    tpm: TpmReason;
  }
}
