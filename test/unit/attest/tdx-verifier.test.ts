/**
 * The tdx EvidenceVerifier. Genuine quotes show the signature chain passes on real Intel quotes
 * and that everything after it is judged (their REPORTDATA is not ours: refused at report_data,
 * and the v4 vector's TD is a debug TD). The binding checks need a quote over this session's
 * runtime data, which only the hardware could sign: those quotes are signed by the FAKE Intel
 * chain and QE of snp-tdx-fake-signers.ts, trusted only by the verifier under test.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { tdxVerifier } from '../../../src/attest/tdx-verifier.js';
import type { VerifyInput } from '../../../src/attest/verifier.js';
import { thrown } from '../../helpers/kata-error.js';
import { FAKE_FMSPC, type FakeIntelChain, fakeIntelChain, fakeTdxQuote } from './snp-tdx-fake-signers.js';

const DIR = join(import.meta.dirname, '../../fixtures/attest/tdx');
const file = (name: string) => readFileSync(join(DIR, name));
const INTEL = { intelRootCaPem: file('intel-sgx-root-ca.pem').toString('utf8') };

const RUNTIME = Buffer.from('{"nonce":"c2Vzc2lvbg==","tee-pubkey":{"kty":"EC","crv":"P-256","alg":"ECDH-ES+A256KW","x":"eA","y":"eQ"}}');
const OTHER_RUNTIME = Buffer.from(RUNTIME.toString('utf8').replace('c2Vzc2lvbg', 'b3RoZXI'));
const INITDATA = Buffer.from('version = "0.1.0"\nalgorithm = "sha256"\n\n[data]\n"aa.toml" = "url = \'https://broker.test\'"\n');
const OTHER_INITDATA = Buffer.from(INITDATA.toString('utf8').replace('broker.test', 'evil.test'));
const MR_TD = createHash('sha384').update('td').digest();
const RTMR = [0, 1, 2, 3].map((i) => createHash('sha384').update(`rtmr${i}`).digest());

const reportDataFor = (bytes: Buffer) => Buffer.concat([createHash('sha384').update(bytes).digest(), Buffer.alloc(16)]);
/** sha256 of the document, then 16 zero bytes: the 48-byte MRCONFIGID of a sha256 initdata. */
const MR_CONFIG_ID = Buffer.concat([createHash('sha256').update(INITDATA).digest(), Buffer.alloc(16)]);

function input(evidence: unknown, over: Partial<VerifyInput> = {}): VerifyInput {
  return { nonce: 'n', runtimeDataBytes: RUNTIME, initdataBody: INITDATA, evidence, sessionState: null, nowMs: Date.now(), ...over };
}

let chain: FakeIntelChain;
beforeAll(() => {
  chain = fakeIntelChain();
});

function evidence(over: Partial<Parameters<typeof fakeTdxQuote>[0]> = {}) {
  const quote = fakeTdxQuote({ mrTd: MR_TD, rtmr: RTMR, mrConfigId: MR_CONFIG_ID, reportData: reportDataFor(RUNTIME), ...over }, chain);
  return { quote: quote.toString('base64') };
}

describe('tdx verifier with FAKE-signed quotes (binding checks)', () => {
  it("a quote over this session's runtime data and initdata gives the claims", () => {
    const result = tdxVerifier({ intelRootCaPem: chain.rootPem }).verify(input(evidence()));
    expect(result).toMatchObject({ ok: true });
    if (!result.ok) return;
    expect(result.claims.tee).toBe('tdx');
    expect(result.claims.measurements).toEqual({
      mr_td: MR_TD.toString('hex'),
      rtmr_0: RTMR[0]?.toString('hex'),
      rtmr_1: RTMR[1]?.toString('hex'),
      rtmr_2: RTMR[2]?.toString('hex'),
      rtmr_3: RTMR[3]?.toString('hex'),
      mr_config_id: MR_CONFIG_ID.toString('hex'),
      report_data: reportDataFor(RUNTIME).toString('hex'),
      init_data: createHash('sha256').update(INITDATA).digest('hex'),
    });
    expect(result.claims.details.cc_eventlog).toBe('not sent');
    expect(result.claims.details.fmspc).toBe(FAKE_FMSPC);
  });

  it('a quote bound to other runtime data is refused at report_data', () => {
    const result = tdxVerifier({ intelRootCaPem: chain.rootPem }).verify(input(evidence(), { runtimeDataBytes: OTHER_RUNTIME }));
    expect(result).toMatchObject({
      ok: false,
      failures: [{ field: 'report_data', expected: reportDataFor(OTHER_RUNTIME).toString('hex') }],
    });
  });

  it('a quote whose MRCONFIGID is not the sent initdata is refused at init_data; without initdata there is no init_data claim', () => {
    const v = tdxVerifier({ intelRootCaPem: chain.rootPem });
    expect(v.verify(input(evidence(), { initdataBody: OTHER_INITDATA }))).toMatchObject({ ok: false, failures: [{ field: 'init_data' }] });
    const none = v.verify(input(evidence(), { initdataBody: null }));
    expect(none.ok).toBe(true);
    expect(none.ok && 'init_data' in none.claims.measurements).toBe(false);
  });

  it('a debug TD is refused at td_attributes, unless the lab allows it', () => {
    const debug = evidence({ tdAttributes: 1n });
    expect(tdxVerifier({ intelRootCaPem: chain.rootPem }).verify(input(debug))).toMatchObject({
      ok: false,
      failures: [{ field: 'td_attributes' }],
    });
    expect(tdxVerifier({ intelRootCaPem: chain.rootPem, allowDebug: true }).verify(input(debug)).ok).toBe(true);
  });

  it('a quote whose chain ends at a root the verifier does not trust is refused (pck_cert_chain.root)', () => {
    const result = tdxVerifier(INTEL).verify(input(evidence()));
    expect(result).toMatchObject({ ok: false, failures: [{ field: 'pck_cert_chain.root' }] });
  });
});

describe('tdx verifier with genuine vectors', () => {
  it("trustee's v5 quote passes the signature chain and is refused only at report_data", () => {
    const result = tdxVerifier(INTEL).verify(
      input({ quote: file('tdx_quote_5.dat').toString('base64') }, { initdataBody: null, nowMs: Date.parse('2025-06-01') }),
    );
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['report_data']);
  });

  it("trustee's v4 quote is a debug TD: refused at td_attributes besides report_data", () => {
    const result = tdxVerifier(INTEL).verify(
      input({ quote: file('tdx_quote_4.dat').toString('base64') }, { initdataBody: null, nowMs: Date.parse('2025-06-01') }),
    );
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['td_attributes', 'report_data']);
  });

  it('one bit of the genuine mr_td is refused at signature, before any field is judged', () => {
    const quote = Buffer.from(file('tdx_quote_5.dat'));
    quote[48 + 6 + 136] = (quote[48 + 6 + 136] as number) ^ 0x80;
    const result = tdxVerifier(INTEL).verify(input({ quote: quote.toString('base64') }, { nowMs: Date.parse('2025-06-01') }));
    expect(result).toMatchObject({ ok: false, failures: [{ field: 'signature' }] });
  });
});

describe('tdx evidence shape', () => {
  const cases: [string, () => unknown, string][] = [
    ['not an object', () => [], 'primary_evidence'],
    ['an unknown key', () => ({ ...evidence(), td_report: 'AAAA' }), 'td_report'],
    ['no quote', () => ({}), 'quote'],
    ['a quote that is not base64', () => ({ quote: 'not base64!' }), 'quote'],
    ['a quote over the size cap', () => ({ quote: 'A'.repeat(100_000) }), 'quote'],
    ['a truncated quote', () => ({ quote: Buffer.alloc(40).toString('base64') }), 'header.version'],
    ['a cc_eventlog that is not base64', () => ({ ...evidence(), cc_eventlog: 7 }), 'cc_eventlog'],
  ];
  it.each(cases)('%s is refused naming %s', (_what, ev, field) => {
    const result = tdxVerifier({ intelRootCaPem: chain.rootPem }).verify(input(ev()));
    expect(result).toMatchObject({ ok: false, failures: [{ field }] });
  });

  it('an event log is accepted and said not to be replayed', () => {
    const result = tdxVerifier({ intelRootCaPem: chain.rootPem }).verify(
      input({ ...evidence(), cc_eventlog: Buffer.from('log').toString('base64') }),
    );
    expect(result.ok && result.claims.details.cc_eventlog).toContain('not replayed');
  });

  it('a verifier is not built on roots that are missing, broken or not self-signed CAs (ATTEST_TRUST_INVALID)', () => {
    const pck = chain.chainPem.slice(0, chain.chainPem.indexOf('-----END CERTIFICATE-----') + 25);
    const broken = '-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n';
    for (const intelRootCaPem of ['', pck, broken]) {
      const err = thrown(() => tdxVerifier({ intelRootCaPem }));
      expect(err.reason).toBe('ATTEST_TRUST_INVALID');
      expect(err.details?.field).toBe('intelRootCaPem');
    }
  });

  it('the challenge takes no extra-params', () => {
    const v = tdxVerifier(INTEL);
    expect(v.challenge(null, 'n')).toEqual({ extraParams: {}, sessionState: null });
    expect(thrown(() => v.challenge({ x: 1 }, 'n')).details?.field).toBe('extra-params');
  });
});
