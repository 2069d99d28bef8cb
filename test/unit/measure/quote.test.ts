/**
 * The quote verifier on a vector a real swtpm produced (test/fixtures/measure/tpm-quote-swtpm.json,
 * written by test/integration/measure/tpm-quote.test.ts with KATA_TS_WRITE_QUOTE_VECTOR=1: a fresh
 * swtpm 0.7, PCR 8 extended with sha256 of the vector's initdata document, an ECC P-256
 * attestation key under the endorsement hierarchy, TPM2_Quote of PCRs 0-11), and every refusal.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { extendPcr, ZERO_PCR_SHA256 } from '../../../src/measure/pcr.js';
import { appraiseQuote, parseAttestationKey, type QuoteEvidence, qualifiedName, verifyQuote } from '../../../src/measure/quote.js';
import { thrown } from '../../helpers/kata-error.js';

const vector = JSON.parse(
  readFileSync(path.join(import.meta.dirname, '..', '..', 'fixtures', 'measure', 'tpm-quote-swtpm.json'), 'utf8'),
) as {
  initdataDocument: string;
  nonce: string;
  attest: string;
  signature: string;
  akPublic: string;
  pcrValues: Record<string, string>;
};
const h = (s: string) => Buffer.from(s, 'hex');
const nonce = h(vector.nonce);
const evidence = (): QuoteEvidence => ({
  attest: h(vector.attest),
  signature: h(vector.signature),
  akPublic: h(vector.akPublic),
  pcrValues: Object.fromEntries(Object.entries(vector.pcrValues).map(([k, v]) => [Number(k), h(v)])),
});
const refusal = (e: QuoteEvidence, n = nonce): string => {
  const err = thrown(() => verifyQuote(e, n));
  expect(err.reason).toBe('MEASURE_QUOTE_INVALID');
  return err.message;
};

describe('verifyQuote on a real swtpm quote', () => {
  it('accepts it and reports the quoted PCRs, PCR 8 holding the initdata binding', () => {
    const q = verifyQuote(evidence(), nonce);
    expect(q.pcrs).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    expect(q.hierarchy).toBe('endorsement');
    const pcr8 = extendPcr(ZERO_PCR_SHA256, createHash('sha256').update(vector.initdataDocument).digest());
    expect(q.pcrValues[8]).toBe(pcr8.toString('hex'));
    // Nothing else extended PCR 0 on a bare swtpm.
    expect(q.pcrValues[0]).toBe('00'.repeat(32));
    expect(q.akName).toEqual(Buffer.concat([Buffer.from([0, 0x0b]), createHash('sha256').update(h(vector.akPublic)).digest()]));
    expect(qualifiedName(0x4000000b, q.akName)).toEqual(h(vector.attest).subarray(8, 8 + 34));
  });

  it('refuses another nonce', () => {
    expect(refusal(evidence(), Buffer.alloc(32))).toMatch(/not the verifier's nonce/);
  });
  it('refuses a changed byte anywhere in the quote', () => {
    for (const at of [0, 10, 50, h(vector.attest).length - 1]) {
      const e = evidence();
      e.attest[at] = (e.attest[at] ?? 0) ^ 0x80;
      expect(refusal(e)).toMatch(/signature does not verify/);
    }
  });
  it('refuses a changed or missing PCR value', () => {
    const e = evidence();
    e.pcrValues[8] = Buffer.alloc(32);
    expect(refusal(e)).toMatch(/do not hash to the quote's PCR digest/);
    const f = evidence();
    delete f.pcrValues[11];
    expect(refusal(f)).toMatch(/PCR 11 is quoted but its value was not given/);
  });
  it('refuses a changed signature and a truncated one', () => {
    const e = evidence();
    e.signature[10] = (e.signature[10] ?? 0) ^ 1;
    expect(refusal(e)).toMatch(/signature does not verify/);
    expect(refusal({ ...evidence(), signature: h(vector.signature).subarray(0, 20) })).toMatch(/truncated/);
  });
  it('refuses a key that is not restricted (it could sign a forged quote)', () => {
    const pub = h(vector.akPublic);
    pub.writeUInt32BE(pub.readUInt32BE(4) & ~0x00010000, 4);
    expect(refusal({ ...evidence(), akPublic: pub })).toMatch(/lack restricted, sign or fixedTPM/);
  });
  it('refuses another key (its point changed)', () => {
    const pub = h(vector.akPublic);
    pub[pub.length - 1] = (pub[pub.length - 1] ?? 0) ^ 1;
    expect(refusal({ ...evidence(), akPublic: pub })).toMatch(/not on P-256|does not verify/);
  });
  it('parses the key: restricted signing ECC P-256', () => {
    expect(parseAttestationKey(h(vector.akPublic)).objectAttributes & 0x50000).toBe(0x50000);
  });
});

describe('appraiseQuote', () => {
  const q = verifyQuote(evidence(), nonce);
  const pcr8 = extendPcr(ZERO_PCR_SHA256, createHash('sha256').update(vector.initdataDocument).digest()).toString('hex');
  it('matches predicted PCRs against the quoted ones', () => {
    expect(appraiseQuote(q, { 8: pcr8, 0: '00'.repeat(32) })).toEqual({ ok: true, matched: [0, 8], mismatched: [], notQuoted: [] });
  });
  it('names a PCR that differs and one the quote left out', () => {
    const other = createHash('sha256').update('another document').digest('hex');
    expect(appraiseQuote(q, { 8: other, 14: pcr8 })).toEqual({
      ok: false,
      matched: [],
      mismatched: [{ pcr: 8, predicted: other, quoted: pcr8 }],
      notQuoted: [14],
    });
  });
});
