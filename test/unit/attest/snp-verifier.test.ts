/**
 * The snp EvidenceVerifier. Genuine vectors show the chain and signature checks pass on real
 * AMD reports and that everything after them is judged (their REPORT_DATA is not ours, so they
 * are refused at report_data, and only there). The binding checks need a report over this
 * session's runtime data, which only the hardware could sign: those reports are signed by the
 * FAKE chain of snp-tdx-fake-signers.ts, trusted only by the verifier under test.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { runtimeDataBytes } from '../../../src/attest/kbs-protocol.js';
import { snpVerifier } from '../../../src/attest/snp-verifier.js';
import type { VerifyInput } from '../../../src/attest/verifier.js';
import { thrown } from '../../helpers/kata-error.js';
import { type FakeAmdChain, fakeAmdChain, fakeSnpReport } from './snp-tdx-fake-signers.js';

const DIR = join(import.meta.dirname, '../../fixtures/attest/snp');
const file = (name: string) => readFileSync(join(DIR, name));

const RUNTIME = runtimeDataBytes({
  nonce: 'bm9uY2Utb2YtdGhpcy1zZXNzaW9u',
  'tee-pubkey': { kty: 'EC', crv: 'P-256', alg: 'ECDH-ES+A256KW', x: 'eA', y: 'eQ' },
} as Parameters<typeof runtimeDataBytes>[0]);
const OTHER_RUNTIME = Buffer.from(RUNTIME.toString('utf8').replace('bm9uY2', 'b3RoZX'));
const INITDATA = Buffer.from('version = "0.1.0"\nalgorithm = "sha384"\n\n[data]\n"aa.toml" = "url = \'https://broker.test\'"\n');
const OTHER_INITDATA = Buffer.from(INITDATA.toString('utf8').replace('broker.test', 'evil.test'));
const TCB = { bootloader: 3, tee: 0, snp: 8, microcode: 115 };
const CHIP = Buffer.alloc(64, 0x42);
const MEASUREMENT = createHash('sha384').update('a launch').digest();

function reportDataFor(bytes: Buffer): Buffer {
  return Buffer.concat([createHash('sha384').update(bytes).digest(), Buffer.alloc(16)]);
}

function input(evidence: unknown, over: Partial<VerifyInput> = {}): VerifyInput {
  return { nonce: 'n', runtimeDataBytes: RUNTIME, initdataBody: INITDATA, evidence, sessionState: null, nowMs: Date.now(), ...over };
}

let chain: FakeAmdChain;
beforeAll(() => {
  chain = fakeAmdChain(TCB, CHIP);
});

function evidence(fields: Partial<Parameters<typeof fakeSnpReport>[0]> = {}, certs?: unknown[]) {
  const report = fakeSnpReport(
    {
      reportData: reportDataFor(RUNTIME),
      measurement: MEASUREMENT,
      hostData: createHash('sha384').update(INITDATA).digest().subarray(0, 32),
      chipId: CHIP,
      tcb: TCB,
      ...fields,
    },
    chain.vcekKey,
  );
  return {
    attestation_report: report.toString('base64'),
    cert_chain: certs ?? [{ cert_type: 'VCEK', data: chain.vcekDer.toString('base64') }],
  };
}

describe('snp verifier with FAKE-signed reports (binding checks)', () => {
  it("a report over this session's runtime data and initdata gives the claims", () => {
    const result = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(input(evidence()));
    expect(result).toMatchObject({ ok: true });
    if (!result.ok) return;
    expect(result.claims.tee).toBe('snp');
    expect(result.claims.measurements).toEqual({
      snp_launch_measurement: MEASUREMENT.toString('hex'),
      snp_host_data: createHash('sha384').update(INITDATA).digest().subarray(0, 32).toString('hex'),
      report_data: reportDataFor(RUNTIME).toString('hex'),
      init_data: createHash('sha256').update(INITDATA).digest('hex'),
    });
    expect(result.claims.details).toMatchObject({ endorsement: 'VCEK', vmpl: '0', reported_tcb: 'bl3 tee0 snp8 ucode115' });
  });

  it("the ASK and ARK may travel with the evidence (trustee's cert table); the ARK must be a configured one", () => {
    const certs = [
      { cert_type: 'VCEK', data: [...chain.vcekDer] },
      { cert_type: 'ASK', data: chain.askDer.toString('base64') },
      { cert_type: 'ARK', data: chain.arkDer.toString('base64') },
    ];
    const arkOnly = chain.amdCertsPem.slice(chain.amdCertsPem.indexOf('-----END CERTIFICATE-----') + 26);
    expect(snpVerifier({ amdCertsPem: arkOnly }).verify(input(evidence({}, certs))).ok).toBe(true);
    const other = fakeAmdChain(TCB, CHIP, 'Other');
    const refused = snpVerifier({ amdCertsPem: other.amdCertsPem }).verify(input(evidence({}, certs)));
    expect(refused).toMatchObject({ ok: false, failures: [{ field: 'cert_chain.ARK' }] });
  });

  it('a report bound to other runtime data is refused at report_data', () => {
    const result = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(input(evidence(), { runtimeDataBytes: OTHER_RUNTIME }));
    expect(result).toMatchObject({
      ok: false,
      failures: [
        { field: 'report_data', expected: reportDataFor(OTHER_RUNTIME).toString('hex'), actual: reportDataFor(RUNTIME).toString('hex') },
      ],
    });
  });

  it('a report whose HOST_DATA is not the sent initdata is refused at init_data', () => {
    const result = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(input(evidence(), { initdataBody: OTHER_INITDATA }));
    expect(result).toMatchObject({ ok: false, failures: [{ field: 'init_data' }] });
    const garbage = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(input(evidence(), { initdataBody: Buffer.from('not toml [') }));
    expect(garbage).toMatchObject({ ok: false, failures: [{ field: 'init_data' }] });
  });

  it('without initdata the report verifies with no init_data claim', () => {
    const result = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(input(evidence(), { initdataBody: null }));
    expect(result.ok && result.claims.measurements.init_data).toBe(undefined);
    expect(result.ok).toBe(true);
  });

  it('VMPL other than 0 and a debug policy are refused; every mismatch is listed', () => {
    const result = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(
      input(evidence({ vmpl: 2, policy: 0x30000n | (1n << 19n) }), { runtimeDataBytes: OTHER_RUNTIME }),
    );
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['vmpl', 'policy', 'report_data']);
    const lab = snpVerifier({ amdCertsPem: chain.amdCertsPem, allowDebug: true }).verify(
      input(evidence({ policy: 0x30000n | (1n << 19n) })),
    );
    expect(lab.ok).toBe(true);
  });

  it('a reported TCB other than the VCEK certifies is refused naming the component', () => {
    const result = snpVerifier({ amdCertsPem: chain.amdCertsPem }).verify(input(evidence({ tcb: { ...TCB, snp: 7 } })));
    expect(result).toMatchObject({ ok: false, failures: [{ field: 'reported_tcb.snp' }] });
  });
});

describe('snp verifier with genuine vectors', () => {
  it("trustee's Genoa evidence passes chain, signature, TCB, VMPL and policy, and is refused only at report_data", () => {
    const ev = JSON.parse(file('trustee-e2e-evidence.json').toString('utf8'));
    const v = snpVerifier({ amdCertsPem: file('genoa_ask_ark_asvk.pem').toString('utf8') });
    const result = v.verify(input(ev, { initdataBody: null, nowMs: Date.parse('2026-01-01') }));
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['report_data']);
  });

  it("trustee's VLEK report is refused at vmpl (it was asked for at VMPL 1) besides report_data", () => {
    const ev = {
      attestation_report: file('test-vlek-report.bin').toString('base64'),
      cert_chain: [{ cert_type: 'VLEK', data: file('test-vlek.der').toString('base64') }],
    };
    const v = snpVerifier({ amdCertsPem: file('milan_ask_ark_asvk.pem').toString('utf8') });
    const result = v.verify(input(ev, { initdataBody: null, nowMs: Date.parse('2025-06-01') }));
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['vmpl', 'report_data']);
  });

  it("go-sev-guest's report allows debugging: refused at policy besides report_data", () => {
    const ev = {
      attestation_report: file('go-sev-guest-attestation.bin').toString('base64'),
      cert_chain: [{ cert_type: 'VCEK', data: file('go-sev-guest-vcek.der').toString('base64') }],
    };
    const v = snpVerifier({ amdCertsPem: file('milan_ask_ark_asvk.pem').toString('utf8') });
    const result = v.verify(input(ev, { initdataBody: null, nowMs: Date.parse('2025-06-01') }));
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['policy', 'report_data']);
  });

  it('one bit of the genuine measurement is refused at signature, before any field is judged', () => {
    const report = Buffer.from(file('test-report.bin'));
    report[0x90] = (report[0x90] as number) ^ 1;
    const ev = {
      attestation_report: report.toString('base64'),
      cert_chain: [{ cert_type: 'VCEK', data: file('test-vcek.der').toString('base64') }],
    };
    const result = snpVerifier({ amdCertsPem: file('milan_ask_ark_asvk.pem').toString('utf8') }).verify(
      input(ev, { nowMs: Date.parse('2025-06-01') }),
    );
    expect(result).toMatchObject({ ok: false, failures: [{ field: 'signature' }] });
  });
});

/** A report in trustee's sev-crate JSON form, built from its bytes (what trustee's attester sends). */
function trusteeJson(report: Buffer): Record<string, unknown> {
  const bytes = (at: number, n: number) => [...report.subarray(at, at + n)];
  const tcb = (at: number) => ({ fmc: null, bootloader: report[at], tee: report[at + 1], snp: report[at + 6], microcode: report[at + 7] });
  const version = report.readUInt32LE(0);
  return {
    version,
    guest_svn: report.readUInt32LE(4),
    policy: Number(report.readBigUInt64LE(8)),
    family_id: bytes(0x10, 16),
    image_id: bytes(0x20, 16),
    vmpl: report.readUInt32LE(0x30),
    sig_algo: report.readUInt32LE(0x34),
    current_tcb: tcb(0x38),
    plat_info: Number(report.readBigUInt64LE(0x40)),
    key_info: report.readUInt32LE(0x48),
    report_data: bytes(0x50, 64),
    measurement: bytes(0x90, 48),
    host_data: bytes(0xc0, 32),
    id_key_digest: bytes(0xe0, 48),
    author_key_digest: bytes(0x110, 48),
    report_id: bytes(0x140, 32),
    report_id_ma: bytes(0x160, 32),
    reported_tcb: tcb(0x180),
    cpuid_fam_id: version >= 3 ? report[0x188] : null,
    cpuid_mod_id: version >= 3 ? report[0x189] : null,
    cpuid_step: version >= 3 ? report[0x18a] : null,
    chip_id: bytes(0x1a0, 64),
    committed_tcb: tcb(0x1e0),
    current: { build: report[0x1e8], minor: report[0x1e9], major: report[0x1ea] },
    committed: { build: report[0x1ec], minor: report[0x1ed], major: report[0x1ee] },
    launch_tcb: tcb(0x1f0),
    launch_mit_vector: version >= 5 ? Number(report.readBigUInt64LE(0x1f8)) : null,
    current_mit_vector: version >= 5 ? Number(report.readBigUInt64LE(0x200)) : null,
    signature: { r: bytes(0x2a0, 72), s: bytes(0x2e8, 72) },
  };
}

describe("trustee's JSON form of the report", () => {
  it('a genuine v2 report sent as sev-crate JSON verifies like its bytes (re-encoded exactly)', () => {
    const ev = {
      attestation_report: trusteeJson(file('test-report.bin')),
      cert_chain: [{ cert_type: 'VCEK', data: [...file('test-vcek.der')] }],
    };
    const v = snpVerifier({ amdCertsPem: file('milan_ask_ark_asvk.pem').toString('utf8') });
    const result = v.verify(input(ev, { initdataBody: null, nowMs: Date.parse('2025-06-01') }));
    expect(result.ok ? [] : result.failures.map((f) => f.field)).toEqual(['report_data']);
  });

  it('a FAKE-signed v5 report (mitigation vectors) verifies as bytes and as JSON', () => {
    const report = fakeSnpReport(
      {
        version: 5,
        reportData: reportDataFor(RUNTIME),
        measurement: MEASUREMENT,
        hostData: createHash('sha384').update(INITDATA).digest().subarray(0, 32),
        chipId: CHIP,
        tcb: TCB,
        mitVectors: [3n, 7n],
      },
      chain.vcekKey,
    );
    const certs = [{ cert_type: 'VCEK', data: chain.vcekDer.toString('base64') }];
    const v = snpVerifier({ amdCertsPem: chain.amdCertsPem });
    for (const attestation_report of [report.toString('base64'), trusteeJson(report)]) {
      const result = v.verify(input({ attestation_report, cert_chain: certs }));
      expect(result.ok && result.claims.details.report_version).toBe('5');
    }
    // Another mitigation vector is a signed byte like any other.
    const json = { ...trusteeJson(report), current_mit_vector: 8 };
    expect(v.verify(input({ attestation_report: json, cert_chain: certs }))).toMatchObject({
      ok: false,
      failures: [{ field: 'signature' }],
    });
  });
});

describe('snp evidence shape', () => {
  const v = () => snpVerifier({ amdCertsPem: chain.amdCertsPem });
  const cases: [string, () => unknown, string][] = [
    ['not an object', () => 'x', 'primary_evidence'],
    ['an unknown key', () => ({ ...evidence(), extra: 1 }), 'extra'],
    ['no cert_chain', () => ({ attestation_report: evidence().attestation_report }), 'cert_chain'],
    ['a cert_chain that is not an array', () => ({ ...evidence(), cert_chain: {} }), 'cert_chain'],
    ['an unknown cert_type', () => ({ ...evidence(), cert_chain: [{ cert_type: 'CRL', data: '' }] }), 'cert_chain[0].cert_type'],
    [
      'certificate data that is not base64',
      () => ({ ...evidence(), cert_chain: [{ cert_type: 'VCEK', data: '%%%%' }] }),
      'cert_chain[0].data',
    ],
    ['certificate data that is not DER', () => ({ ...evidence(), cert_chain: [{ cert_type: 'VCEK', data: 'AAAA' }] }), 'cert_chain.VCEK'],
    ['a report that is not base64', () => ({ ...evidence(), attestation_report: 'a b' }), 'attestation_report'],
    ['a truncated report', () => ({ ...evidence(), attestation_report: Buffer.alloc(100).toString('base64') }), 'attestation_report'],
    [
      'a sev-crate report missing its fields',
      () => ({ ...evidence(), attestation_report: { version: 3 } }),
      'attestation_report.guest_svn',
    ],
  ];
  it.each(cases)('%s is refused naming %s', (_what, ev, field) => {
    const result = v().verify(input(ev()));
    expect(result).toMatchObject({ ok: false, failures: [{ field }] });
  });

  it('a verifier is not built on AMD certificates without an ARK (ATTEST_TRUST_INVALID)', () => {
    const askOnly = chain.amdCertsPem.slice(0, chain.amdCertsPem.indexOf('-----END CERTIFICATE-----') + 25);
    for (const amdCertsPem of ['', askOnly, 'not pem']) {
      const err = thrown(() => snpVerifier({ amdCertsPem }));
      expect(err.reason).toBe('ATTEST_TRUST_INVALID');
      expect(err.details?.field).toBe('amdCertsPem');
    }
  });

  it('the challenge takes no extra-params', () => {
    expect(v().challenge(undefined, 'n')).toEqual({ extraParams: {}, sessionState: null });
    expect(v().challenge({}, 'n')).toEqual({ extraParams: {}, sessionState: null });
    expect(thrown(() => v().challenge({ ek_cert: 'x' }, 'n')).reason).toBe('ATTEST_MESSAGE_INVALID');
  });
});
