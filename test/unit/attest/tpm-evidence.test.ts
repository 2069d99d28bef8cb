/**
 * The tpm evidence and extra-params schemas (src/attest/tpm-evidence.ts): a good document
 * round-trips through encode/parse; every field, when missing, mistyped, oversized or not
 * base64/hex, is refused with a coded error naming that field; unknown keys are refused.
 */
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  credentialProof,
  credentialProofMatches,
  encodeTpmChallengeParams,
  encodeTpmEvidence,
  encodeTpmRequestParams,
  parseTpmChallengeParams,
  parseTpmEvidence,
  parseTpmRequestParams,
  TPM_EVIDENCE_LIMITS,
  type TpmEvidence,
  type TpmEvidenceJson,
  tpmQuoteNonce,
} from '../../../src/attest/tpm-evidence.js';
import { thrown } from '../../helpers/kata-error.js';

const CERT = `-----BEGIN CERTIFICATE-----\n${randomBytes(600)
  .toString('base64')
  .replace(/(.{64})/g, '$1\n')}\n-----END CERTIFICATE-----\n`;

function sample(): TpmEvidence {
  return {
    akPublic: randomBytes(88),
    quote: { message: randomBytes(145), signature: randomBytes(72), pcrs: [0, 1, 2].map(() => randomBytes(32)) },
    eventLog: randomBytes(3000),
    agentExtends: [{ pcr: 8, digestSha256: randomBytes(32), what: 'initdata' }],
    ekCertPem: CERT,
    credentialProof: randomBytes(32),
  };
}

const clone = <T>(v: T): T => JSON.parse(JSON.stringify(v)) as T;

describe('tpm evidence', () => {
  it('round-trips through encode and parse', () => {
    const e = sample();
    const json = clone(encodeTpmEvidence(e));
    expect(parseTpmEvidence(json)).toEqual(e);
  });

  it('accepts an empty event log and no agent extends', () => {
    const json = clone(encodeTpmEvidence({ ...sample(), eventLog: Buffer.alloc(0), agentExtends: [] }));
    const e = parseTpmEvidence(json);
    expect(e.eventLog.length).toBe(0);
    expect(e.agentExtends).toEqual([]);
  });

  const bad: Array<[string, string, (j: TpmEvidenceJson) => unknown]> = [
    ['ak_public', 'missing', (j) => ({ ...j, ak_public: undefined })],
    ['ak_public', 'not base64', (j) => ({ ...j, ak_public: 'AAA*' })],
    ['ak_public', 'unpadded', (j) => ({ ...j, ak_public: 'AAA' })],
    ['ak_public', 'empty', (j) => ({ ...j, ak_public: '' })],
    ['ak_public', 'too long', (j) => ({ ...j, ak_public: randomBytes(TPM_EVIDENCE_LIMITS.akPublicBytes + 3).toString('base64') })],
    ['tpm_quote', 'missing', (j) => ({ ...j, tpm_quote: undefined })],
    ['tpm_quote', 'message not base64', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, message: '!!!!' } })],
    ['tpm_quote', 'message too long', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, message: randomBytes(2000).toString('base64') } })],
    ['tpm_quote', 'signature missing', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, signature: undefined } })],
    ['tpm_quote', 'pcrs empty', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, pcrs: [] } })],
    ['tpm_quote', 'pcr upper-case hex', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, pcrs: ['AB'.repeat(32)] } })],
    ['tpm_quote', 'pcr of 31 bytes', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, pcrs: ['ab'.repeat(31)] } })],
    ['tpm_quote', '25 pcrs', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, pcrs: Array(25).fill('00'.repeat(32)) } })],
    ['tpm_quote', 'unknown key', (j) => ({ ...j, tpm_quote: { ...j.tpm_quote, extra: 1 } })],
    ['event_log', 'missing', (j) => ({ ...j, event_log: undefined })],
    ['event_log', 'not a string', (j) => ({ ...j, event_log: 12 })],
    ['event_log', 'too long', (j) => ({ ...j, event_log: 'AAAA'.repeat(TPM_EVIDENCE_LIMITS.eventLogBytes / 3 + 1) })],
    ['agent_extends', 'missing', (j) => ({ ...j, agent_extends: undefined })],
    ['agent_extends', 'pcr 24', (j) => ({ ...j, agent_extends: [{ ...j.agent_extends[0], pcr: 24 }] })],
    ['agent_extends', 'pcr not integer', (j) => ({ ...j, agent_extends: [{ ...j.agent_extends[0], pcr: 8.5 }] })],
    ['agent_extends', 'digest short', (j) => ({ ...j, agent_extends: [{ ...j.agent_extends[0], digest: 'ab' }] })],
    ['agent_extends', 'unknown what', (j) => ({ ...j, agent_extends: [{ ...j.agent_extends[0], what: 'policy' }] })],
    ['agent_extends', 'too many', (j) => ({ ...j, agent_extends: Array(17).fill(j.agent_extends[0]) })],
    ['ek_cert', 'missing', (j) => ({ ...j, ek_cert: undefined })],
    ['ek_cert', 'not PEM', (j) => ({ ...j, ek_cert: 'MIIB' })],
    ['ek_cert', 'a key, not a certificate', (j) => ({ ...j, ek_cert: j.ek_cert.replaceAll('CERTIFICATE', 'PUBLIC KEY') })],
    ['ek_cert', 'too long', (j) => ({ ...j, ek_cert: j.ek_cert.replace('\n', `\n${'A'.repeat(20_000)}\n`) })],
    ['credential_proof', 'missing', (j) => ({ ...j, credential_proof: undefined })],
    ['credential_proof', '31 bytes', (j) => ({ ...j, credential_proof: randomBytes(31).toString('base64') })],
    ['credential_proof', '33 bytes', (j) => ({ ...j, credential_proof: randomBytes(33).toString('base64') })],
    ['surprise', 'unknown top-level key', (j) => ({ ...j, surprise: true })],
  ];
  for (const [field, what, mutate] of bad) {
    it(`refuses ${field}: ${what}`, () => {
      const json = clone(encodeTpmEvidence(sample()));
      const err = thrown(() => parseTpmEvidence(clone(mutate(json))));
      expect(err.reason).toBe('ATTEST_EVIDENCE_INVALID');
      expect(err.details?.field).toBe(field);
      expect(err.message).toMatch(/^the tpm evidence: /);
    });
  }

  it('refuses what is not an object, naming the whole evidence', () => {
    for (const v of [null, 'x', [], 3]) {
      const err = thrown(() => parseTpmEvidence(v));
      expect(err.reason).toBe('ATTEST_EVIDENCE_INVALID');
      expect(err.details?.field).toBe('primary_evidence');
    }
  });
});

describe('tpm extra-params', () => {
  it('Request round-trips; each field refused by name', () => {
    const p = { ekCertPem: CERT, akPublic: randomBytes(88) };
    expect(parseTpmRequestParams(clone(encodeTpmRequestParams(p)))).toEqual(p);
    const j = encodeTpmRequestParams(p);
    for (const [field, v] of [
      ['ek_cert', { ...j, ek_cert: 'nope' }],
      ['ek_cert', { ak_public: j.ak_public }],
      ['ak_public', { ...j, ak_public: '' }],
      ['ak_public', { ...j, ak_public: 'A'.repeat(2000) }],
      ['other', { ...j, other: 1 }],
      ['extra-params', null],
    ] as const) {
      const err = thrown(() => parseTpmRequestParams(v));
      expect(err.reason).toBe('ATTEST_MESSAGE_INVALID');
      expect(err.details?.field).toBe(field);
    }
  });

  it('Challenge round-trips; each field refused by name', () => {
    const p = { credentialBlob: randomBytes(70), encryptedSecret: randomBytes(258) };
    expect(parseTpmChallengeParams(clone(encodeTpmChallengeParams(p)))).toEqual(p);
    const j = encodeTpmChallengeParams(p);
    for (const [field, v] of [
      ['credential_blob', { ...j, credential_blob: '' }],
      ['credential_blob', { ...j, credential_blob: randomBytes(600).toString('base64') }],
      ['encrypted_secret', { credential_blob: j.credential_blob }],
      ['encrypted_secret', { ...j, encrypted_secret: 'a b=' }],
      ['nonce', { ...j, nonce: 'x' }],
    ] as const) {
      const err = thrown(() => parseTpmChallengeParams(v));
      expect(err.reason).toBe('ATTEST_MESSAGE_INVALID');
      expect(err.details?.field).toBe(field);
    }
  });
});

describe('bindings', () => {
  it('the quote nonce is sha256 of the runtime data bytes; the proof is HMAC-SHA256 keyed with the secret', () => {
    const rd = Buffer.from('{"nonce":"abc","tee-pubkey":{}}');
    expect(tpmQuoteNonce(rd)).toEqual(createHash('sha256').update(rd).digest());
    expect(tpmQuoteNonce(rd).length).toBe(32);
    const secret = randomBytes(32);
    const proof = credentialProof(secret, rd);
    expect(proof).toEqual(createHmac('sha256', secret).update(rd).digest());
    expect(credentialProofMatches(proof, secret, rd)).toBe(true);
    expect(credentialProofMatches(proof, randomBytes(32), rd)).toBe(false);
    expect(credentialProofMatches(proof, secret, Buffer.from('{"nonce":"abd","tee-pubkey":{}}'))).toBe(false);
    expect(credentialProofMatches(proof.subarray(0, 31), secret, rd)).toBe(false);
  });
});
