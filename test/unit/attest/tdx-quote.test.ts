/**
 * TDX DCAP quotes against the published vectors (test/fixtures/attest/README.md): trustee's v4
 * and v5 quotes verify from the quote signature down to Intel's SGX root CA; one flipped bit in
 * the TD report, the signature, the attestation key, the QE report or its authentication data, a
 * PCK chain from another platform, a foreign root, a truncated or padded quote are each refused
 * with a coded error naming the field.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseTdxQuote, pckPlatformIds, verifyTdxQuote } from '../../../src/attest/tdx-quote.js';
import { thrown } from '../../helpers/kata-error.js';
import { fakeIntelChain } from './snp-tdx-fake-signers.js';

const DIR = join(import.meta.dirname, '../../fixtures/attest/tdx');
const file = (name: string) => readFileSync(join(DIR, name));
const INTEL = { intelRootCaPem: file('intel-sgx-root-ca.pem').toString('utf8') };
const Q4 = file('tdx_quote_4.dat');
const Q5 = file('tdx_quote_5.dat');
const NOW_MS = Date.parse('2025-06-01T00:00:00Z');

/** v4 offsets: header 48, body 584, signature data length 4, then signature, key, cert data. */
const BODY = 48;
const SIG = BODY + 584 + 4;
const ATT_KEY = SIG + 64;
const QE_REPORT = ATT_KEY + 64 + 6;
const QE_SIG = QE_REPORT + 384;
const QE_AUTH = QE_SIG + 64 + 2;

function verifyAll(bytes: Buffer, trust = INTEL, nowMs = NOW_MS) {
  const quote = parseTdxQuote(bytes);
  return { quote, verified: verifyTdxQuote(quote, trust, nowMs) };
}

function flipBit(buf: Buffer, at: number, bit = 0): Buffer {
  const out = Buffer.from(buf);
  out[at] = (out[at] as number) ^ (1 << bit);
  return out;
}

describe('genuine TDX vectors', () => {
  it("trustee's v4 quote verifies down to the Intel SGX root CA, fields read at their offsets", () => {
    const { quote, verified } = verifyAll(Q4);
    expect(quote.version).toBe(4);
    expect(quote.qeVendorId.toString('hex')).toBe('939a7233f79c4ca9940a0db3957f0607');
    expect(quote.body.mrTd.toString('hex')).toBe(
      '705ee9381b8633a9fbe532b52345e8433343d2868959f57889d84ca377c395b689cac1599ccea1b7d420483a9ce5f031',
    );
    expect(quote.body.tdAttributes.toString('hex')).toBe('0100001000000000');
    expect(quote.body.mrConfigId.every((b) => b === 0)).toBe(true);
    expect(quote.qeAuthData.length).toBe(32);
    expect(verified.pckCert.subject).toContain('CN=Intel SGX PCK Certificate');
    expect(verified.intermediate.subject).toContain('CN=Intel SGX PCK Platform CA');
    expect(verified.fmspc).toBe('50806f000000');
    expect(verified.pceId).toBe('0000');
    expect(verified.root.fingerprint256.replace(/:/g, '').toLowerCase()).toBe(
      '44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3',
    );
  });

  it("trustee's v5 quote (body type 3, TDX 1.5) verifies, its TD report read after the body type and size", () => {
    const { quote } = verifyAll(Q5);
    expect(quote.version).toBe(5);
    expect(quote.body.mrTd.toString('hex')).toBe(
      'dfba221b48a22af8511542ee796603f37382800840dcd978703909bf8e64d4c8a1e9de86e7c9638bfcba422f3886400a',
    );
    expect(quote.body.teeTcbSvn2?.length).toBe(16);
    expect(quote.body.mrServiceTd?.length).toBe(48);
  });
});

describe("google/go-tdx-guest's vectors", () => {
  const NOW_2026 = Date.parse('2026-06-01T00:00:00Z');
  it('a COS guest quote (v4) read through an 8000-byte buffer verifies, its zero padding counted and ignored', () => {
    const { quote, verified } = verifyAll(file('go-tdx-guest-cos-113-quote.dat'), INTEL, NOW_2026);
    expect(quote.trailingBytes).toBe(3065);
    expect(quote.body.reportData.every((b) => b === 0)).toBe(true);
    expect(verified.fmspc).toBe('00806f050000');
  });

  it('a production Sapphire Rapids quote with unsigned text appended verifies; the appended bytes change nothing signed', () => {
    const bytes = file('go-tdx-guest-prod-quote-spr-e4.dat');
    const { quote } = verifyAll(bytes, INTEL, NOW_2026);
    expect(quote.trailingBytes).toBe(39);
    expect(quote.body.mrTd.subarray(0, 12).toString('hex')).toBe('6363b8043668a3ad953278e1');
    expect(verifyAll(flipBit(bytes, bytes.length - 2), INTEL, NOW_2026).quote.body.mrTd).toEqual(quote.body.mrTd);
    expect(verifyAll(Buffer.concat([Q4, Buffer.alloc(1)])).quote.trailingBytes).toBe(1);
  });

  it('a v5 sample quote (TDX 1.5 body) verifies with its 2026 PCK, and is refused before the PCK was issued', () => {
    const bytes = file('go-tdx-guest-quote-v5-sample.dat');
    const { quote, verified } = verifyAll(bytes, INTEL, NOW_2026);
    expect(quote.version).toBe(5);
    expect(quote.body.mrServiceTd?.length).toBe(48);
    expect(verified.fmspc).toBe('90c06f000000');
    expect(thrown(() => verifyAll(bytes, INTEL, Date.parse('2025-06-01'))).details?.field).toBe('pck_cert_chain.pck');
  });
});

describe('refusals, each naming the field', () => {
  const body: [string, number][] = [
    ['mr_td', BODY + 136 + 10],
    ['rtmr_2', BODY + 424],
    ['mr_config_id', BODY + 184],
    ['report_data', BODY + 520 + 63],
    ['td_attributes', BODY + 120],
    ['header user_data', 30],
  ];
  it.each(body)('one bit of %s changes what the attestation key signed: refused as signature', (_name, at) => {
    const err = thrown(() => verifyAll(flipBit(Q4, at, 5)));
    expect(err.reason).toBe('ATTEST_EVIDENCE_REFUSED');
    expect(err.details?.field).toBe('signature');
  });

  it('one bit of the quote signature is refused as signature', () => {
    expect(thrown(() => verifyAll(flipBit(Q4, SIG + 3))).details?.field).toBe('signature');
    expect(thrown(() => verifyAll(flipBit(Q4, SIG + 40))).details?.field).toBe('signature');
  });

  it('one bit of the attestation key breaks the QE binding (attestation_key)', () => {
    expect(thrown(() => verifyAll(flipBit(Q4, ATT_KEY + 7))).details?.field).toBe('attestation_key');
  });

  it('one bit of the QE authentication data breaks the QE binding (attestation_key)', () => {
    expect(thrown(() => verifyAll(flipBit(Q4, QE_AUTH + 1))).details?.field).toBe('attestation_key');
  });

  it('one bit of the QE report or its signature is refused as qe_report_signature', () => {
    expect(thrown(() => verifyAll(flipBit(Q4, QE_REPORT + 64))).details?.field).toBe('qe_report_signature');
    expect(thrown(() => verifyAll(flipBit(Q4, QE_SIG + 10))).details?.field).toBe('qe_report_signature');
  });

  it("another platform's PCK chain does not carry the key that signed this QE report (qe_report_signature)", () => {
    const q4 = parseTdxQuote(Q4);
    const q5 = parseTdxQuote(Q5);
    const err = thrown(() => verifyTdxQuote({ ...q4, pckChainPem: q5.pckChainPem }, INTEL, NOW_MS));
    expect(err.details?.field).toBe('qe_report_signature');
  });

  it('a root other than the configured one is refused (pck_cert_chain.root), and a chain to it under a fake root too', () => {
    const fake = fakeIntelChain();
    expect(thrown(() => verifyAll(Q4, { intelRootCaPem: fake.rootPem })).details?.field).toBe('pck_cert_chain.root');
    const q4 = parseTdxQuote(Q4);
    // The genuine PCK CA is not signed by the fake root, even when the quote omits its root.
    const [pck, ca] = q4.pckChainPem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g) as string[];
    const err = thrown(() => verifyTdxQuote({ ...q4, pckChainPem: `${pck}\n${ca}\n` }, { intelRootCaPem: fake.rootPem }, NOW_MS));
    expect(err.details?.field).toBe('pck_cert_chain.intermediate');
  });

  it('a PCK certificate without the SGX extension (FMSPC, PCE id) is refused (pck_cert_chain.pck)', () => {
    const { verified } = verifyAll(Q4);
    const err = thrown(() => pckPlatformIds(verified.intermediate));
    expect(err.reason).toBe('ATTEST_EVIDENCE_REFUSED');
    expect(err.details?.field).toBe('pck_cert_chain.pck');
  });

  it('a PCK chain of one certificate is refused (pck_cert_chain)', () => {
    const q4 = parseTdxQuote(Q4);
    const [pck] = q4.pckChainPem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g) as string[];
    expect(thrown(() => verifyTdxQuote({ ...q4, pckChainPem: pck as string }, INTEL, NOW_MS)).details?.field).toBe('pck_cert_chain');
  });

  it('a certificate out of its validity at the given clock is refused naming it', () => {
    const err = thrown(() => verifyAll(Q4, INTEL, Date.parse('2031-01-01T00:00:00Z')));
    expect(err.details?.field).toBe('pck_cert_chain.pck');
  });

  it('truncated or padded quotes are refused naming the field where they end', () => {
    const cases: [number, string][] = [
      [0, 'header.version'],
      [10, 'header.reserved'],
      [47, 'header.user_data'],
      [BODY + 100, 'td_report'],
      [BODY + 584 + 2, 'signature_data_len'],
    ];
    for (const [len, field] of cases) {
      const err = thrown(() => parseTdxQuote(Q4.subarray(0, len)));
      expect(err.reason).toBe('ATTEST_EVIDENCE_INVALID');
      expect(err.details?.field, `truncated to ${len}`).toBe(field);
    }
    // Cut anywhere after the length: the length no longer adds up.
    expect(thrown(() => parseTdxQuote(Q4.subarray(0, Q4.length - 1))).details?.field).toBe('signature_data_len');
  });

  it('inner sizes that do not add up are refused naming them', () => {
    const cert = Buffer.from(Q4);
    cert.writeUInt32LE(cert.readUInt32LE(ATT_KEY + 64 + 2) + 1, ATT_KEY + 64 + 2);
    expect(thrown(() => parseTdxQuote(cert)).details?.field).toBe('certification_data.size');
    const auth = Buffer.from(Q4);
    auth.writeUInt16LE(0xffff, QE_AUTH - 2);
    expect(thrown(() => parseTdxQuote(auth)).details?.field).toBe('qe_auth_data');
    const pckType = Buffer.from(Q4);
    pckType.writeUInt16LE(1, QE_AUTH + 32);
    expect(thrown(() => parseTdxQuote(pckType)).details?.field).toBe('pck_cert_chain.type');
  });

  it('another version, key type, TEE or certification data type is refused naming it', () => {
    const set = (at: number, v: number, bytes: 2 | 4) => {
      const b = Buffer.from(Q4);
      bytes === 2 ? b.writeUInt16LE(v, at) : b.writeUInt32LE(v, at);
      return b;
    };
    expect(thrown(() => parseTdxQuote(set(0, 3, 2))).details?.field).toBe('header.version');
    expect(thrown(() => parseTdxQuote(set(2, 3, 2))).details?.field).toBe('header.att_key_type');
    expect(thrown(() => parseTdxQuote(set(4, 0, 4))).details?.field).toBe('header.tee_type');
    expect(thrown(() => parseTdxQuote(set(ATT_KEY + 64, 5, 2))).details?.field).toBe('certification_data.type');
    const v5 = Buffer.from(Q5);
    v5.writeUInt16LE(9, 48);
    expect(thrown(() => parseTdxQuote(v5)).details?.field).toBe('body_type');
    const size = Buffer.from(Q5);
    size.writeUInt32LE(584, 50);
    expect(thrown(() => parseTdxQuote(size)).details?.field).toBe('body_size');
  });
});

describe('untrusted bytes never escape as anything but a coded error', () => {
  it('every truncation of the v4 and v5 quotes is ATTEST_EVIDENCE_INVALID', () => {
    for (const q of [Q4, Q5]) {
      for (let len = 0; len < q.length; len++) {
        const err = thrown(() => parseTdxQuote(q.subarray(0, len)));
        expect(err.reason, `truncated to ${len}`).toBe('ATTEST_EVIDENCE_INVALID');
      }
    }
  });

  it('every single-byte change of the v4 quote is refused with a coded error naming a field', () => {
    // One position in 7 keeps the test quick while touching every structure of the quote.
    for (let at = 0; at < Q4.length; at += 7) {
      const q = Buffer.from(Q4);
      q[at] = (q[at] as number) ^ 0xff;
      const err = thrown(() => verifyAll(q));
      expect(['ATTEST_EVIDENCE_INVALID', 'ATTEST_EVIDENCE_REFUSED'], `byte ${at}`).toContain(err.reason);
      expect(typeof err.details?.field, `byte ${at}`).toBe('string');
    }
  });
});
