/**
 * SEV-SNP attestation reports against the published vectors (test/fixtures/attest/README.md):
 * trustee's Milan VCEK and VLEK reports and its Genoa end-to-end evidence verify up to AMD's
 * roots; one flipped bit anywhere the PSP signs, a signature from another chip, a certificate
 * from another product line, a truncated or padded report, an expired certificate are each
 * refused with a coded error naming the field.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  checkSnpReportedTcb,
  parseSnpReport,
  SNP_REPORT_BYTES,
  type SnpCertEntry,
  vcekTcb,
  verifySnpCertChain,
  verifySnpReportSignature,
} from '../../../src/attest/snp-report.js';
import { decodeSnpEvidence } from '../../../src/attest/snp-verifier.js';
import { thrown } from '../../helpers/kata-error.js';

const DIR = join(import.meta.dirname, '../../fixtures/attest/snp');
const file = (name: string) => readFileSync(join(DIR, name));
const MILAN = { amdCertsPem: file('milan_ask_ark_asvk.pem').toString('utf8') };
const GENOA = { amdCertsPem: file('genoa_ask_ark_asvk.pem').toString('utf8') };
const REPORT = file('test-report.bin');
const VCEK: SnpCertEntry[] = [{ certType: 'VCEK', der: file('test-vcek.der') }];
/** Inside every vector certificate's validity (the VLEK's ends 2025-12-10). */
const NOW_MS = Date.parse('2025-06-01T00:00:00Z');

/** Parses, chains and checks the signature and TCB, as the verifier does before judging fields. */
function verifyAll(report: Buffer, certs: SnpCertEntry[], trust = MILAN, nowMs = NOW_MS) {
  const parsed = parseSnpReport(report);
  const chain = verifySnpCertChain(certs, trust, nowMs);
  verifySnpReportSignature(parsed, chain.endorsementCert.publicKey);
  checkSnpReportedTcb(parsed, chain);
  return { parsed, chain };
}

function flipBit(buf: Buffer, at: number, bit = 0): Buffer {
  const out = Buffer.from(buf);
  out[at] = (out[at] as number) ^ (1 << bit);
  return out;
}

describe('genuine SNP vectors', () => {
  it("trustee's v2 Milan report verifies with its VCEK up to the Milan ARK, fields read at their offsets", () => {
    const { parsed, chain } = verifyAll(REPORT, VCEK);
    expect(chain.endorsement).toBe('VCEK');
    expect(chain.root.subject).toContain('CN=ARK-Milan');
    expect(chain.intermediate.subject).toContain('CN=SEV-Milan');
    expect(parsed.version).toBe(2);
    expect(parsed.vmpl).toBe(0);
    expect(parsed.policy).toBe(0x3001fn);
    expect(parsed.signingKey).toBe('vcek');
    expect(parsed.cpuid).toBeUndefined();
    expect(parsed.measurement.toString('hex')).toBe(
      'a1f3930413247bb38cfc171579ea3c12d5fe4901f0c792f63fd75d98f1ef827c23500644e0e692e6be917f9050d3d38c',
    );
    expect(parsed.reportData.subarray(0, 32).toString('hex')).toBe('ec6c52d7533cc2c4f45be7849cf112ab82b2009fe7bd43e71ed08c14400ad7e2');
    expect(parsed.reportedTcb).toMatchObject({ bootloader: 3, tee: 0, snp: 8, microcode: 115 });
    expect(parsed.currentVersion).toBe('1.52.4');
  });

  it("trustee's v3 VLEK report (VMPL 1) verifies with its VLEK up to the Milan ASVK and ARK", () => {
    const { parsed, chain } = verifyAll(file('test-vlek-report.bin'), [{ certType: 'VLEK', der: file('test-vlek.der') }]);
    expect(chain.endorsement).toBe('VLEK');
    expect(chain.intermediate.subject).toContain('CN=SEV-VLEK-Milan');
    expect(parsed.version).toBe(3);
    expect(parsed.signingKey).toBe('vlek');
    expect(parsed.vmpl).toBe(1);
    expect(parsed.cpuid).toEqual({ family: 0x19, model: 0x01, stepping: 0x01 });
  });

  it("trustee's Genoa end-to-end evidence (sev-crate JSON) re-encodes to the bytes the PSP signed", () => {
    const evidence = JSON.parse(file('trustee-e2e-evidence.json').toString('utf8'));
    const { report, certs } = decodeSnpEvidence(evidence);
    const { parsed, chain } = verifyAll(report, certs, GENOA, Date.parse('2026-01-01T00:00:00Z'));
    expect(chain.root.subject).toContain('CN=ARK-Genoa');
    expect(parsed.version).toBe(3);
    expect(parsed.cpuid).toEqual({ family: 25, model: 160, stepping: 2 });
    expect(parsed.measurement).toEqual(Buffer.from(evidence.attestation_report.measurement));
    expect(parsed.reportedTcb).toMatchObject({ bootloader: 10, tee: 0, snp: 23, microcode: 25 });
  });
});

describe("google/go-sev-guest's vector", () => {
  it('its v2 Milan report (a debug policy) verifies with its VCEK up to the Milan ARK', () => {
    const { parsed } = verifyAll(file('go-sev-guest-attestation.bin'), [{ certType: 'VCEK', der: file('go-sev-guest-vcek.der') }]);
    expect(parsed.policy).toBe(0xb0000n);
    expect(parsed.reportedTcb).toMatchObject({ bootloader: 2, tee: 0, snp: 5, microcode: 68 });
    expect(parsed.reportData.subarray(0, 6).toString('hex')).toBe('010203040500');
  });
});

describe("virtee/sev's vectors", () => {
  it('its v2 Milan report verifies with its VCEK up to the Milan ARK', () => {
    const { parsed } = verifyAll(file('virtee-report-milan.bin'), [{ certType: 'VCEK', der: file('virtee-vcek-milan.der') }]);
    expect(parsed.measurement.toString('hex')).toBe(
      '7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f',
    );
  });

  it('its Turin VCEK chains to the Turin ARK and certifies an FMC and an 8-byte hwID, compared with the first 8 bytes of CHIP_ID', () => {
    const turin = { amdCertsPem: file('turin_ask_ark_asvk.pem').toString('utf8') };
    const chain = verifySnpCertChain([{ certType: 'VCEK', der: file('virtee-vcek-turin.der') }], turin, NOW_MS);
    expect(chain.root.subject).toContain('CN=ARK-Turin');
    const tcb = vcekTcb(chain.endorsementCert, 'cert_chain.VCEK');
    expect(tcb).toMatchObject({ fmc: 0, bootloader: 0, tee: 0, snp: 0, microcode: 9 });
    expect(tcb.hwid?.toString('hex')).toBe('1e550a8ee5cf9f4d');
    // A Turin-shaped report (fields only: no Turin report is published with this VCEK).
    const base = parseSnpReport(REPORT);
    const chipId = Buffer.concat([Buffer.from('1e550a8ee5cf9f4d', 'hex'), Buffer.alloc(56, 0xee)]);
    const report = { ...base, chipId, reportedTcb: { fmc: 0, bootloader: 0, tee: 0, snp: 0, microcode: 9, raw: '' } };
    expect(() => checkSnpReportedTcb(report, chain)).not.toThrow();
    expect(thrown(() => checkSnpReportedTcb({ ...report, chipId: flipBit(chipId, 7) }, chain)).details?.field).toBe('chip_id');
    expect(thrown(() => checkSnpReportedTcb({ ...report, reportedTcb: { ...report.reportedTcb, fmc: 1 } }, chain)).details?.field).toBe(
      'reported_tcb.fmc',
    );
  });
});

describe('refusals, each naming the field', () => {
  const signed: [string, number][] = [
    ['measurement', 0x90 + 17],
    ['report_data', 0x50],
    ['host_data', 0xc0 + 31],
    ['policy', 0x08],
    ['vmpl', 0x30],
    ['reported_tcb', 0x186],
    ['chip_id', 0x1a0 + 5],
    ['launch_tcb', 0x1f7],
  ];
  it.each(signed)('one bit of %s changes the signed bytes: refused as signature', (_name, at) => {
    const err = thrown(() => verifyAll(flipBit(REPORT, at, 3), VCEK));
    expect(err.reason).toBe('ATTEST_EVIDENCE_REFUSED');
    expect(err.details?.field).toBe('signature');
  });

  it('one bit of the signature itself is refused as signature', () => {
    for (const at of [0x2a0, 0x2a0 + 47, 0x2e8, 0x2e8 + 20]) {
      const err = thrown(() => verifyAll(flipBit(REPORT, at), VCEK));
      expect(err.details?.field).toBe('signature');
    }
  });

  it('a signature component wider than a P-384 scalar is malformed (signature.r / signature.s)', () => {
    expect(thrown(() => parseSnpReport(flipBit(REPORT, 0x2a0 + 60))).details?.field).toBe('signature.r');
    expect(thrown(() => parseSnpReport(flipBit(REPORT, 0x2e8 + 48))).details?.field).toBe('signature.s');
  });

  it('truncated or padded reports are refused as attestation_report, before anything is read', () => {
    for (const bytes of [
      REPORT.subarray(0, SNP_REPORT_BYTES - 1),
      REPORT.subarray(0, 0x2a0),
      Buffer.concat([REPORT, Buffer.alloc(1)]),
      Buffer.alloc(0),
    ]) {
      const err = thrown(() => parseSnpReport(bytes));
      expect(err.reason).toBe('ATTEST_EVIDENCE_INVALID');
      expect(err.details?.field).toBe('attestation_report');
    }
  });

  it('an unknown version, signature algorithm or signing key is refused naming it', () => {
    const v = Buffer.from(REPORT);
    v.writeUInt32LE(4, 0);
    expect(thrown(() => parseSnpReport(v)).details?.field).toBe('version');
    const a = Buffer.from(REPORT);
    a.writeUInt32LE(2, 0x34);
    expect(thrown(() => parseSnpReport(a)).details?.field).toBe('signature_algo');
    const k = Buffer.from(REPORT);
    k.writeUInt32LE(3 << 2, 0x48);
    expect(thrown(() => parseSnpReport(k)).details?.field).toBe('signing_key');
  });

  it("another chip's report does not verify with this VCEK (signature)", () => {
    const genoa = decodeSnpEvidence(JSON.parse(file('trustee-e2e-evidence.json').toString('utf8')));
    const err = thrown(() =>
      verifyAll(genoa.report, VCEK, { amdCertsPem: MILAN.amdCertsPem + GENOA.amdCertsPem }, Date.parse('2026-01-01')),
    );
    expect(err.details?.field).toBe('signature');
  });

  it('a VCEK from another product line is refused at cert_chain.VCEK (the Milan VCEK under Genoa roots)', () => {
    const err = thrown(() => verifyAll(REPORT, VCEK, GENOA));
    expect(err.reason).toBe('ATTEST_EVIDENCE_REFUSED');
    expect(err.details?.field).toBe('cert_chain.VCEK');
  });

  it('an ASK from another chain sent with the evidence does not sign the VCEK (cert_chain.VCEK)', () => {
    const genoaAsk = GENOA.amdCertsPem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/)?.[0] as string;
    const der = Buffer.from(genoaAsk.replace(/-----[^-]+-----|\s/g, ''), 'base64');
    // Only the Genoa roots are trusted; the Milan ASK is nowhere, the evidence's Genoa ASK did not sign this VCEK.
    const err = thrown(() => verifyAll(REPORT, [...VCEK, { certType: 'ASK', der }], GENOA));
    expect(err.details?.field).toBe('cert_chain.VCEK');
  });

  it('an ARK in the evidence that is not a configured root is refused (cert_chain.ARK)', () => {
    const genoaArk = GENOA.amdCertsPem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g)?.[1] as string;
    const der = Buffer.from(genoaArk.replace(/-----[^-]+-----|\s/g, ''), 'base64');
    const err = thrown(() => verifyAll(REPORT, [...VCEK, { certType: 'ARK', der }]));
    expect(err.details?.field).toBe('cert_chain.ARK');
  });

  it('evidence without a VCEK or VLEK is refused: there is no KDS to fetch one from', () => {
    expect(thrown(() => verifyAll(REPORT, [])).details?.field).toBe('cert_chain.VCEK');
  });

  it('a certificate out of its validity at the given clock is refused naming it', () => {
    const err = thrown(() => verifyAll(REPORT, VCEK, MILAN, Date.parse('2031-01-01T00:00:00Z')));
    expect(err.details?.field).toBe('cert_chain.VCEK');
    expect(err.message).toContain('not valid at 2031-01-01');
    expect(thrown(() => verifyAll(REPORT, VCEK, MILAN, Date.parse('2020-01-01T00:00:00Z'))).details?.field).toBe('cert_chain.VCEK');
  });

  it('a trust bundle without an ARK, or with a broken certificate, is a trust error naming amdCertsPem', () => {
    const askOnly = MILAN.amdCertsPem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/)?.[0] as string;
    const broken = '-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n';
    for (const amdCertsPem of ['', askOnly, broken + MILAN.amdCertsPem]) {
      const err = thrown(() => verifyAll(REPORT, VCEK, { amdCertsPem }));
      expect(err.reason).toBe('ATTEST_TRUST_INVALID');
      expect(err.details?.field).toBe('amdCertsPem');
    }
  });

  it('a reported TCB or chip id other than the VCEK certifies is refused naming it', () => {
    const { parsed, chain } = verifyAll(REPORT, VCEK);
    const snp = { ...parsed, reportedTcb: { ...parsed.reportedTcb, snp: 9 } };
    expect(thrown(() => checkSnpReportedTcb(snp, chain)).details?.field).toBe('reported_tcb.snp');
    const ucode = { ...parsed, reportedTcb: { ...parsed.reportedTcb, microcode: 114 } };
    expect(thrown(() => checkSnpReportedTcb(ucode, chain)).details?.field).toBe('reported_tcb.microcode');
    const chip = { ...parsed, chipId: flipBit(parsed.chipId, 3) };
    expect(thrown(() => checkSnpReportedTcb(chip, chain)).details?.field).toBe('chip_id');
    const vlek = { ...parsed, signingKey: 'vlek' as const };
    expect(thrown(() => checkSnpReportedTcb(vlek, chain)).details?.field).toBe('signing_key');
    // A masked chip id (all zero) names no chip and is not compared.
    expect(() => checkSnpReportedTcb({ ...parsed, chipId: Buffer.alloc(64) }, chain)).not.toThrow();
  });
});

describe('untrusted bytes never escape as anything but a coded error', () => {
  it('every single-byte change of the signed report or its signature is refused with a coded error naming a field', () => {
    for (let at = 0; at < 0x2a0 + 144; at += 3) {
      const err = thrown(() => verifyAll(flipBit(REPORT, at, at % 8), VCEK));
      expect(['ATTEST_EVIDENCE_INVALID', 'ATTEST_EVIDENCE_REFUSED'], `byte ${at}`).toContain(err.reason);
      expect(typeof err.details?.field, `byte ${at}`).toBe('string');
    }
  });
});
