/**
 * The attester's TPM operations (tpm-source.ts TpmAttestationOps) over guest/agent/tpm.ts's
 * TpmClient on one transport: the EK certificate from NV (DER, handed on as PEM), the attestation
 * key's public area, credential activation and the quote.
 */
import { TpmClient, type TpmTransport } from '../tpm.js';
import type { TpmAttestationOps } from './tpm-source.js';

/** DER as a PEM certificate (base64 in 64-character lines). */
export function derToPem(der: Buffer): string {
  const lines = der.toString('base64').match(/.{1,64}/g) ?? [];
  return `-----BEGIN CERTIFICATE-----\n${lines.join('\n')}\n-----END CERTIFICATE-----\n`;
}

/** The operations of one attestation on a TPM reached through `transport` (closed by `close`). */
export function tpmOpsOverTransport(transport: TpmTransport): TpmAttestationOps {
  const tpm = new TpmClient(transport);
  return {
    ekCertificatePem: async () => derToPem(await tpm.ekCertificate()),
    akPublic: async () => (await tpm.akPublic()).public,
    activateCredential: (credentialBlob, encryptedSecret) => tpm.activateCredential(credentialBlob, encryptedSecret),
    quote: (nonce, pcrs) => tpm.quote(nonce, pcrs),
    close: () => tpm.close(),
  };
}
