/**
 * The `tpm` evidence of kata-ts's KBS protocol (pure): what a vtpm guest sends as
 * `tee-evidence.primary_evidence` for tee "tpm", and the tpm `extra-params` of the Request and
 * the Challenge that run credential activation before it.
 *
 * The quote part keeps the shape of trustee's TPM verifier (`ak_public`, `tpm_quote {message,
 * signature, pcrs}`), so the same quote reads the same way there; kata-ts's `ak_public` is the
 * TPM's own TPMT_PUBLIC (base64), not a DER key, because the verifier needs the key's TPM name
 * (credential activation and the quote's signer are both bound to that name). What trustee's
 * format lacks and kata-ts adds: the firmware's event log, the agent's own PCR extends, the EK
 * certificate and the proof that the attestation key's TPM activated the broker's credential.
 *
 * Request extra-params  {"ek_cert": PEM, "ak_public": base64 TPMT_PUBLIC}
 * Challenge extra-params {"credential_blob": base64 TPM2B_ID_OBJECT,
 *                         "encrypted_secret": base64 TPM2B_ENCRYPTED_SECRET}
 * Evidence {
 *   "ak_public": base64 TPMT_PUBLIC (the one of the Request),
 *   "tpm_quote": { "message": base64 TPMS_ATTEST, "signature": base64 TPMT_SIGNATURE,
 *                  "pcrs": [hex sha256 value of each quoted PCR, in the quote's selection order] },
 *   "event_log": base64 of the firmware's TCG2 log (/sys/kernel/security/tpm0/binary_bios_measurements),
 *   "agent_extends": [ { "pcr": 8, "digest": hex sha256, "what": "initdata" } ]  (in extend order),
 *   "ek_cert": PEM (the one of the Request),
 *   "credential_proof": base64 HMAC-SHA256(key = the activated secret, data = runtimeDataBytes)
 * }
 * The quote's qualifying data is sha256(runtimeDataBytes) (kbs-protocol.ts): the nonce and the
 * tee-pubkey the resources will be encrypted to are both inside those bytes.
 *
 * Every field is untrusted: each has a size cap checked by the schema before anything decodes it,
 * and a decoding failure names the field (`details.field`).
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import type { ValidateFunction } from 'ajv';
import { invalid } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import './reasons.js';

/** The PCRs a guest quotes and the verifier requires: the firmware's (0-7), the initdata (8), the kernel's (9). */
export const TPM_EVIDENCE_PCRS: readonly number[] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
/** What the agent's own extends may say they were. */
export const AGENT_EXTEND_KINDS = ['initdata'] as const;
export type AgentExtendKind = (typeof AGENT_EXTEND_KINDS)[number];

/** Caps, in decoded bytes (the schema checks the base64 length that decodes to at most this). */
export const TPM_EVIDENCE_LIMITS = {
  /** A TPMT_PUBLIC: an ECC P-256 key is ~90 bytes, an RSA 4096 one ~550. */
  akPublicBytes: 1024,
  /** TPMS_ATTEST of a quote: ~150 bytes with one bank; room for a few banks. */
  quoteMessageBytes: 1024,
  /** TPMT_SIGNATURE: RSA 4096 is 518 bytes. */
  quoteSignatureBytes: 1024,
  /** A PC client TPM has 24 PCRs per bank. */
  quotedPcrs: 24,
  /** Firmware event logs are tens of KiB; a server with many option ROMs and certificates, a few hundred. */
  eventLogBytes: 1024 * 1024,
  agentExtends: 16,
  /** One EK certificate with its TPM extensions: 1-2 KiB; a chain is not sent. */
  ekCertChars: 16 * 1024,
  credentialProofBytes: 32,
  /** TPM2B_ID_OBJECT: 2 + 34 (HMAC) + 2 + a sealed name of ≤ 66 bytes. */
  credentialBlobBytes: 512,
  /** TPM2B_ENCRYPTED_SECRET: 2 + an RSA 4096 ciphertext or an ECC point. */
  encryptedSecretBytes: 1024,
} as const;

/** The Request's tpm extra-params, as sent. */
export interface TpmRequestParamsJson {
  ek_cert: string;
  ak_public: string;
}

/** The Challenge's tpm extra-params, as sent. */
export interface TpmChallengeParamsJson {
  credential_blob: string;
  encrypted_secret: string;
}

/** One PCR extend the guest agent made itself (not in the firmware's log). */
export interface AgentExtendJson {
  pcr: number;
  digest: string;
  what: AgentExtendKind;
}

/** The tpm evidence, as sent. */
export interface TpmEvidenceJson {
  ak_public: string;
  tpm_quote: { message: string; signature: string; pcrs: string[] };
  event_log: string;
  agent_extends: AgentExtendJson[];
  ek_cert: string;
  credential_proof: string;
}

/** The Request's tpm extra-params, decoded. */
export interface TpmRequestParams {
  ekCertPem: string;
  akPublic: Buffer;
}

/** The Challenge's tpm extra-params, decoded (what the guest hands to TPM2_ActivateCredential). */
export interface TpmChallengeParams {
  credentialBlob: Buffer;
  encryptedSecret: Buffer;
}

/** One agent extend, decoded. */
export interface AgentExtend {
  pcr: number;
  digestSha256: Buffer;
  what: AgentExtendKind;
}

/** The tpm evidence, decoded: bytes where the JSON has base64 or hex. */
export interface TpmEvidence {
  akPublic: Buffer;
  quote: { message: Buffer; signature: Buffer; pcrs: Buffer[] };
  eventLog: Buffer;
  agentExtends: AgentExtend[];
  ekCertPem: string;
  credentialProof: Buffer;
}

/** The longest padded base64 text of at most `bytes` bytes. */
const b64Chars = (bytes: number): number => 4 * Math.ceil(bytes / 3);
const BASE64_PATTERN = '^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$';
const base64 = (maxBytes: number, minBytes = 1) =>
  ({ type: 'string', pattern: BASE64_PATTERN, minLength: b64Chars(minBytes), maxLength: b64Chars(maxBytes) }) as const;
const SHA256_HEX = { type: 'string', pattern: '^[0-9a-f]{64}$' } as const;
const PEM_CERT = {
  type: 'string',
  maxLength: TPM_EVIDENCE_LIMITS.ekCertChars,
  pattern: '^\\s*-----BEGIN CERTIFICATE-----\\r?\\n[A-Za-z0-9+/=\\r\\n]+-----END CERTIFICATE-----\\s*$',
} as const;
const L = TPM_EVIDENCE_LIMITS;

const validateRequest = compileOnce<TpmRequestParamsJson>({
  type: 'object',
  additionalProperties: false,
  required: ['ek_cert', 'ak_public'],
  properties: { ek_cert: PEM_CERT, ak_public: base64(L.akPublicBytes) },
});

const validateChallenge = compileOnce<TpmChallengeParamsJson>({
  type: 'object',
  additionalProperties: false,
  required: ['credential_blob', 'encrypted_secret'],
  properties: { credential_blob: base64(L.credentialBlobBytes), encrypted_secret: base64(L.encryptedSecretBytes) },
});

const validateEvidence = compileOnce<TpmEvidenceJson>({
  type: 'object',
  additionalProperties: false,
  required: ['ak_public', 'tpm_quote', 'event_log', 'agent_extends', 'ek_cert', 'credential_proof'],
  properties: {
    ak_public: base64(L.akPublicBytes),
    tpm_quote: {
      type: 'object',
      additionalProperties: false,
      required: ['message', 'signature', 'pcrs'],
      properties: {
        message: base64(L.quoteMessageBytes),
        signature: base64(L.quoteSignatureBytes),
        pcrs: { type: 'array', minItems: 1, maxItems: L.quotedPcrs, items: SHA256_HEX },
      },
    },
    // Empty is allowed by the schema (a TPM without a firmware log); the verifier then finds
    // PCRs 0-7 unexplained, and says so.
    event_log: base64(L.eventLogBytes, 0),
    agent_extends: {
      type: 'array',
      maxItems: L.agentExtends,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['pcr', 'digest', 'what'],
        properties: {
          pcr: { type: 'integer', minimum: 0, maximum: 23 },
          digest: SHA256_HEX,
          what: { enum: [...AGENT_EXTEND_KINDS] },
        },
      },
    },
    ek_cert: PEM_CERT,
    credential_proof: base64(L.credentialProofBytes, L.credentialProofBytes),
  },
});

/** The top-level field an ajv error is about (`/tpm_quote/pcrs/3` -> `tpm_quote`), or the object itself. */
function fieldOf(instancePath: string, missing: string | undefined, whole: string): string {
  const first = instancePath.split('/')[1];
  if (first !== undefined && first !== '') return first;
  return missing ?? whole;
}

function check<T>(
  validate: () => ValidateFunction<T>,
  value: unknown,
  what: string,
  whole: string,
  reason: 'ATTEST_MESSAGE_INVALID' | 'ATTEST_EVIDENCE_INVALID',
): T {
  const v = validate();
  if (v(value)) return value as T;
  const errors = v.errors ?? [];
  const first = errors[0];
  const missing =
    first?.keyword === 'required'
      ? String((first.params as { missingProperty: string }).missingProperty)
      : first?.keyword === 'additionalProperties'
        ? String((first.params as { additionalProperty: string }).additionalProperty)
        : undefined;
  const field = fieldOf(first?.instancePath ?? '', missing, whole);
  throw invalid(reason, `${what}: ${describeSchemaErrors(errors).slice(0, 3).join('; ')}`, { details: { field } });
}

/**
 * The bytes of a base64 field the schema let through, their count checked exactly (a base64
 * length cap allows up to two bytes more than the cap it was computed from).
 */
function b64(
  s: string,
  field: string,
  what: string,
  reason: 'ATTEST_MESSAGE_INVALID' | 'ATTEST_EVIDENCE_INVALID',
  maxBytes: number,
  minBytes = 0,
): Buffer {
  const bytes = Buffer.from(s, 'base64');
  if (bytes.length > maxBytes || bytes.length < minBytes) {
    const range = minBytes === maxBytes ? `exactly ${maxBytes}` : `${minBytes}-${maxBytes}`;
    throw invalid(reason, `${what}: ${field} is ${bytes.length} bytes, not ${range}`, { details: { field: field.split('.')[0] } });
  }
  return bytes;
}

/** Decodes and checks the Request's tpm extra-params. Throws ATTEST_MESSAGE_INVALID naming the field. */
export function parseTpmRequestParams(value: unknown): TpmRequestParams {
  const j = check<TpmRequestParamsJson>(validateRequest, value, 'the tpm Request extra-params', 'extra-params', 'ATTEST_MESSAGE_INVALID');
  const what = 'the tpm Request extra-params';
  return { ekCertPem: j.ek_cert, akPublic: b64(j.ak_public, 'ak_public', what, 'ATTEST_MESSAGE_INVALID', L.akPublicBytes, 1) };
}

/** The Request's tpm extra-params for an EK certificate and an attestation key. */
export function encodeTpmRequestParams(p: TpmRequestParams): TpmRequestParamsJson {
  return { ek_cert: p.ekCertPem, ak_public: p.akPublic.toString('base64') };
}

/** Decodes and checks the Challenge's tpm extra-params (the guest's side). Throws ATTEST_MESSAGE_INVALID naming the field. */
export function parseTpmChallengeParams(value: unknown): TpmChallengeParams {
  const j = check<TpmChallengeParamsJson>(
    validateChallenge,
    value,
    'the tpm Challenge extra-params',
    'extra-params',
    'ATTEST_MESSAGE_INVALID',
  );
  const what = 'the tpm Challenge extra-params';
  return {
    credentialBlob: b64(j.credential_blob, 'credential_blob', what, 'ATTEST_MESSAGE_INVALID', L.credentialBlobBytes, 1),
    encryptedSecret: b64(j.encrypted_secret, 'encrypted_secret', what, 'ATTEST_MESSAGE_INVALID', L.encryptedSecretBytes, 1),
  };
}

/** The Challenge's tpm extra-params for a credential. */
export function encodeTpmChallengeParams(p: TpmChallengeParams): TpmChallengeParamsJson {
  return { credential_blob: p.credentialBlob.toString('base64'), encrypted_secret: p.encryptedSecret.toString('base64') };
}

/** Decodes and checks the tpm evidence. Throws ATTEST_EVIDENCE_INVALID naming the field (`details.field`). */
export function parseTpmEvidence(value: unknown): TpmEvidence {
  const j = check<TpmEvidenceJson>(validateEvidence, value, 'the tpm evidence', 'primary_evidence', 'ATTEST_EVIDENCE_INVALID');
  const what = 'the tpm evidence';
  const r = 'ATTEST_EVIDENCE_INVALID';
  return {
    akPublic: b64(j.ak_public, 'ak_public', what, r, L.akPublicBytes, 1),
    quote: {
      message: b64(j.tpm_quote.message, 'tpm_quote.message', what, r, L.quoteMessageBytes, 1),
      signature: b64(j.tpm_quote.signature, 'tpm_quote.signature', what, r, L.quoteSignatureBytes, 1),
      pcrs: j.tpm_quote.pcrs.map((h) => Buffer.from(h, 'hex')),
    },
    eventLog: b64(j.event_log, 'event_log', what, r, L.eventLogBytes),
    agentExtends: j.agent_extends.map((e) => ({ pcr: e.pcr, digestSha256: Buffer.from(e.digest, 'hex'), what: e.what })),
    ekCertPem: j.ek_cert,
    credentialProof: b64(j.credential_proof, 'credential_proof', what, r, L.credentialProofBytes, L.credentialProofBytes),
  };
}

/** The tpm evidence JSON (the guest's side); the result passes parseTpmEvidence's schema when the parts are within the caps. */
export function encodeTpmEvidence(e: TpmEvidence): TpmEvidenceJson {
  return {
    ak_public: e.akPublic.toString('base64'),
    tpm_quote: {
      message: e.quote.message.toString('base64'),
      signature: e.quote.signature.toString('base64'),
      pcrs: e.quote.pcrs.map((p) => p.toString('hex')),
    },
    event_log: e.eventLog.toString('base64'),
    agent_extends: e.agentExtends.map((x) => ({ pcr: x.pcr, digest: x.digestSha256.toString('hex'), what: x.what })),
    ek_cert: e.ekCertPem,
    credential_proof: e.credentialProof.toString('base64'),
  };
}

/** The quote's qualifying data for a session: sha256 of kbs-protocol.ts's runtimeDataBytes. */
export function tpmQuoteNonce(runtimeDataBytes: Buffer): Buffer {
  return createHash('sha256').update(runtimeDataBytes).digest();
}

/** The credential proof: HMAC-SHA256 keyed with the secret the TPM released by activation, over runtimeDataBytes. */
export function credentialProof(activatedSecret: Buffer, runtimeDataBytes: Buffer): Buffer {
  return createHmac('sha256', activatedSecret).update(runtimeDataBytes).digest();
}

/** Whether `proof` is the credential proof of `secret` over `runtimeDataBytes` (constant time). */
export function credentialProofMatches(proof: Buffer, secret: Buffer, runtimeDataBytes: Buffer): boolean {
  const expected = credentialProof(secret, runtimeDataBytes);
  return proof.length === expected.length && timingSafeEqual(proof, expected);
}
