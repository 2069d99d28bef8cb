/**
 * Evidence for tee "tpm" (src/attest/tpm-evidence.ts) from the guest's own TPM: the EK
 * certificate from NV and the attestation key's public area go into the Request; for the
 * Challenge the TPM activates the broker's credential (which only the TPM holding that EK, with
 * that AK beside it, can do), quotes PCRs 0-9 with sha256 of the runtime data bytes as qualifying
 * data, and the firmware's event log and the agent's own PCR 8 extend explain the PCR values.
 *
 * The agent's extends are derived from the published initdata document: it is exactly the buffer
 * tpm-initdata.ts hashed into PCR 8, once per boot. An agent that died between its extend and the
 * publication extends twice; the quoted PCR 8 then does not replay from one extend and the
 * verifier refuses, which is the safe way round.
 */
import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';
import {
  credentialProof,
  encodeTpmEvidence,
  encodeTpmRequestParams,
  parseTpmChallengeParams,
  TPM_EVIDENCE_LIMITS,
  TPM_EVIDENCE_PCRS,
  tpmQuoteNonce,
} from '../../../src/attest/tpm-evidence.js';
import { errnoCode, unavailable } from '../../../src/common/errors.js';
import type { Logger } from '../../../src/common/logger.js';
import type { TpmQuote } from '../tpm.js';
import { INITDATA_PCR } from '../tpm-initdata.js';
import type { EvidenceRound, EvidenceSource } from './evidence.js';
import './reasons.js';

/** Where the kernel shows the firmware's TCG2 event log (securityfs, mounted by guest/init). */
export const GUEST_EVENT_LOG_PATH = '/sys/kernel/security/tpm0/binary_bios_measurements';

/** The TPM operations one attestation needs (guest/agent/tpm.ts TpmClient provides them). */
export interface TpmAttestationOps {
  /** The EK certificate (PEM) the TPM's manufacturer (swtpm_setup, the node's CA) stored in NV. */
  ekCertificatePem(): Promise<string>;
  /** TPMT_PUBLIC of the attestation key (the same key every time for the same TPM). */
  akPublic(): Promise<Buffer>;
  /** TPM2_ActivateCredential with the AK and the EK: the secret the broker sealed to them. */
  activateCredential(credentialBlob: Buffer, encryptedSecret: Buffer): Promise<Buffer>;
  /** TPM2_Quote of sha256 `pcrs` with the AK and `nonce` as qualifying data. */
  quote(nonce: Buffer, pcrs: readonly number[]): Promise<TpmQuote>;
  close(): Promise<void>;
}

export interface TpmSourceOptions {
  openTpm: () => Promise<TpmAttestationOps>;
  /** The initdata document the agent extended PCR 8 with, or null (no initdata). */
  initdataDocument: Buffer | null;
  eventLogPath?: string;
  log: Logger;
}

/**
 * Reads at most `maxBytes` of a file whose size the kernel does not tell (securityfs files
 * stat as 0 bytes). A missing file is an empty log; a longer one is refused rather than cut.
 */
export async function readEventLog(path: string, maxBytes: number = TPM_EVIDENCE_LIMITS.eventLogBytes): Promise<Buffer | null> {
  let fh: Awaited<ReturnType<typeof open>>;
  try {
    fh = await open(path, 'r');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return null;
    throw unavailable('ATTEST_EVIDENCE_FAILED', `cannot open the event log ${path}: ${(err as Error).message}`, { cause: err });
  }
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const buf = Buffer.alloc(64 * 1024);
      const { bytesRead } = await fh.read(buf, 0, buf.length, null);
      if (bytesRead === 0) break;
      total += bytesRead;
      if (total > maxBytes) throw unavailable('ATTEST_EVIDENCE_FAILED', `the event log ${path} is over ${maxBytes} bytes`);
      chunks.push(buf.subarray(0, bytesRead));
    }
    return Buffer.concat(chunks);
  } finally {
    await fh.close();
  }
}

/** The evidence source of a vtpm guest. */
export function tpmEvidenceSource(o: TpmSourceOptions): EvidenceSource {
  const eventLogPath = o.eventLogPath ?? GUEST_EVENT_LOG_PATH;
  return {
    tee: 'tpm',
    async begin(): Promise<EvidenceRound> {
      const tpm = await o.openTpm();
      let ekCertPem: string;
      let akPublic: Buffer;
      try {
        ekCertPem = await tpm.ekCertificatePem();
        akPublic = await tpm.akPublic();
      } catch (err) {
        await tpm.close().catch(() => undefined);
        throw err;
      }
      return {
        requestExtraParams: encodeTpmRequestParams({ ekCertPem, akPublic }),
        async evidence(challengeExtraParams, runtimeDataBytes) {
          const { credentialBlob, encryptedSecret } = parseTpmChallengeParams(challengeExtraParams);
          const secret = await tpm.activateCredential(credentialBlob, encryptedSecret);
          const quote = await tpm.quote(tpmQuoteNonce(runtimeDataBytes), TPM_EVIDENCE_PCRS);
          if (!quote.akPublic.equals(akPublic))
            throw unavailable(
              'ATTEST_EVIDENCE_FAILED',
              'the TPM quoted with another attestation key than the one it activated the credential for',
            );
          const pcrs = TPM_EVIDENCE_PCRS.map((p) => {
            const v = quote.pcrValues[p];
            if (v === undefined) throw unavailable('ATTEST_EVIDENCE_FAILED', `the TPM did not return PCR ${p} with its quote`);
            return v;
          });
          const eventLog = await readEventLog(eventLogPath);
          if (eventLog === null) o.log.warn({ path: eventLogPath }, 'no firmware event log: PCRs 0-7 will not be explained to the broker');
          const agentExtends =
            o.initdataDocument === null
              ? []
              : [{ pcr: INITDATA_PCR, digestSha256: createHash('sha256').update(o.initdataDocument).digest(), what: 'initdata' as const }];
          o.log.info(
            { pcrs: TPM_EVIDENCE_PCRS.length, eventLogBytes: eventLog?.length ?? 0, agentExtends: agentExtends.length },
            'tpm evidence made',
          );
          return encodeTpmEvidence({
            akPublic,
            quote: { message: quote.attest, signature: quote.signature, pcrs },
            eventLog: eventLog ?? Buffer.alloc(0),
            agentExtends,
            ekCertPem,
            credentialProof: credentialProof(secret, runtimeDataBytes),
          });
        },
        end: () => tpm.close(),
      };
    },
  };
}
