/**
 * Pure: the argv of `openssl req -x509` for a self-signed certificate with a new EC P-256 key,
 * unencrypted (the callers keep the key file root's and 0600): the node's TPM EK CA
 * (src/tpm/ca.ts) and the attestation broker's HTTPS certificate (src/broker/state.ts) differ
 * only in their subject, lifetime and extensions.
 */
export function selfSignedEcCertArgv(o: {
  keyPath: string;
  certPath: string;
  days: number;
  subject: string;
  /** `-addext` values, in order. */
  extensions: readonly string[];
}): string[] {
  return [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    o.keyPath,
    '-out',
    o.certPath,
    '-days',
    String(o.days),
    '-subj',
    o.subject,
    ...o.extensions.flatMap((e) => ['-addext', e]),
  ];
}
