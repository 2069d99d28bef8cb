/**
 * The `snp` EvidenceVerifier (pure): an AMD SEV-SNP attestation report with its certificate
 * chain, checked as far as code can without the hardware or AMD's KDS.
 *
 * Evidence (`tee-evidence.primary_evidence` for tee "snp"), trustee's SnpEvidence shape:
 *   {
 *     "attestation_report": base64 of the 0x4A0-byte report
 *                           | the report as trustee's sev crate serialises it (an object of fields),
 *     "cert_chain": [ { "cert_type": "VCEK" | "VLEK" | "ASK" | "ASVK" | "ARK",
 *                       "data": base64 DER | an array of bytes (trustee's form) } ]
 *   }
 * `cert_chain` is required here and must hold the VCEK or VLEK: trustee fetches a missing one
 * from AMD's KDS, and there is no KDS here. The trust anchors (AMD's ARKs, optionally their ASKs
 * and ASVKs) are the caller's.
 *
 * Checks, in order (each names its field when it fails):
 *   1. the report parses (length, version 2/3/5, signature algorithm);
 *   2. the endorsement certificate chains to a configured ARK, every certificate valid now;
 *   3. the report's signature verifies with the endorsement key;
 *   then, all reported together: 4. REPORTED_TCB (and CHIP_ID for a VCEK) equal what the
 *   certificate was issued for; 5. VMPL is 0 (the report comes from the guest's most privileged
 *   level, not from a lower one it could be asked by); 6. the POLICY does not allow debugging;
 *   7. REPORT_DATA = sha384(runtimeDataBytes) followed by 16 zero bytes; 8. when the guest sent
 *   its initdata, HOST_DATA equals its digest fitted to 32 bytes (src/measure/initdata.ts).
 * Claims: snp_launch_measurement, snp_host_data, report_data, and init_data (sha256 of the
 * initdata document, when HOST_DATA binds it).
 */
import { invalid, isKataError } from '../common/errors.js';
import { parseInitdataDocument, snpHostData } from '../measure/initdata.js';
import {
  checkSnpReportedTcb,
  parseSnpReport,
  parseSnpTrustAnchors,
  SNP_CERT_TYPES,
  SNP_POLICY_DEBUG_BIT,
  SNP_REPORT_BYTES,
  type SnpCertEntry,
  type SnpCertType,
  type SnpTrustAnchors,
  snpReportDataFor,
  verifySnpCertChain,
  verifySnpReportSignature,
} from './snp-report.js';
import type { AttestFailure, ChallengeParams, EvidenceVerifier, VerifyInput, VerifyResult } from './verifier.js';
import './reasons.js';

/** A certificate is 1-2 KiB; room for a long one. */
const MAX_CERT_BYTES = 16 * 1024;
/** VCEK/VLEK, ASK/ASVK, ARK, and a spare (an extended report's table may carry more kinds). */
const MAX_CERTS = 8;

function evidenceError(field: string, message: string): never {
  throw invalid('ATTEST_EVIDENCE_INVALID', `SNP evidence: ${message}`, { details: { field } });
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Bytes from base64 or an array of byte values (trustee's serde form), at most `max`. */
function bytesOf(v: unknown, field: string, max: number): Buffer {
  if (typeof v === 'string') {
    if (v.length > Math.ceil(max / 3) * 4 + 4) evidenceError(field, `${field} is longer than ${max} bytes`);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0) evidenceError(field, `${field} is not standard, padded base64`);
    return Buffer.from(v, 'base64');
  }
  if (Array.isArray(v)) {
    if (v.length > max) evidenceError(field, `${field} is longer than ${max} bytes`);
    if (!v.every((b) => Number.isInteger(b) && b >= 0 && b <= 255)) evidenceError(field, `${field} is not an array of byte values`);
    return Buffer.from(v as number[]);
  }
  return evidenceError(field, `${field} is neither base64 nor an array of bytes`);
}

/* ---- trustee's sev-crate form of the report, encoded back into its bytes ---- */

function num(o: Record<string, unknown>, key: string, field: string, max: bigint): bigint {
  const v = o[key];
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0 || BigInt(v) > max)
    evidenceError(`${field}.${key}`, `${field}.${key} is not an integer from 0 to ${max}`);
  return BigInt(v);
}

function fixed(o: Record<string, unknown>, key: string, n: number): Buffer {
  const field = `attestation_report.${key}`;
  const b = bytesOf(o[key], field, n);
  if (b.length !== n) evidenceError(field, `${field} is ${b.length} bytes, not ${n}`);
  return b;
}

function tcbOf(o: Record<string, unknown>, key: string, turin: boolean): bigint {
  const field = `attestation_report.${key}`;
  const t = o[key];
  if (!isRecord(t)) return evidenceError(field, `${field} is not an object`);
  const u8 = (k: string) => num(t, k, field, 255n);
  const fmcNull = t.fmc === null || t.fmc === undefined;
  if (turin === fmcNull) evidenceError(`${field}.fmc`, `${field}.fmc must be ${turin ? 'a number on Turin' : 'null before Turin'}`);
  const at = (v: bigint, byte: number) => v << BigInt(8 * byte);
  if (turin) return at(u8('fmc'), 0) | at(u8('bootloader'), 1) | at(u8('tee'), 2) | at(u8('snp'), 3) | at(u8('microcode'), 7);
  return at(u8('bootloader'), 0) | at(u8('tee'), 1) | at(u8('snp'), 6) | at(u8('microcode'), 7);
}

function versionOf(o: Record<string, unknown>, key: string): Buffer {
  const field = `attestation_report.${key}`;
  const v = o[key];
  if (!isRecord(v)) return evidenceError(field, `${field} is not an object`);
  return Buffer.from([Number(num(v, 'build', field, 255n)), Number(num(v, 'minor', field, 255n)), Number(num(v, 'major', field, 255n))]);
}

/** The report bytes of trustee's JSON form (reserved bytes zero, as the PSP writes them). */
function reportFromTrusteeJson(o: Record<string, unknown>): Buffer {
  const f = 'attestation_report';
  const r = Buffer.alloc(SNP_REPORT_BYTES);
  const U32 = 0xffff_ffffn;
  const U64 = 0xffff_ffff_ffff_ffffn;
  const version = num(o, 'version', f, U32);
  r.writeUInt32LE(Number(version), 0x00);
  r.writeUInt32LE(Number(num(o, 'guest_svn', f, U32)), 0x04);
  r.writeBigUInt64LE(num(o, 'policy', f, U64), 0x08);
  fixed(o, 'family_id', 16).copy(r, 0x10);
  fixed(o, 'image_id', 16).copy(r, 0x20);
  r.writeUInt32LE(Number(num(o, 'vmpl', f, U32)), 0x30);
  r.writeUInt32LE(Number(num(o, 'sig_algo', f, U32)), 0x34);
  const family = version >= 3n ? Number(num(o, 'cpuid_fam_id', f, 255n)) : 0;
  const turin = family >= 0x1a;
  r.writeBigUInt64LE(tcbOf(o, 'current_tcb', turin), 0x38);
  r.writeBigUInt64LE(num(o, 'plat_info', f, U64), 0x40);
  r.writeUInt32LE(Number(num(o, 'key_info', f, U32)), 0x48);
  fixed(o, 'report_data', 64).copy(r, 0x50);
  fixed(o, 'measurement', 48).copy(r, 0x90);
  fixed(o, 'host_data', 32).copy(r, 0xc0);
  fixed(o, 'id_key_digest', 48).copy(r, 0xe0);
  fixed(o, 'author_key_digest', 48).copy(r, 0x110);
  fixed(o, 'report_id', 32).copy(r, 0x140);
  fixed(o, 'report_id_ma', 32).copy(r, 0x160);
  r.writeBigUInt64LE(tcbOf(o, 'reported_tcb', turin), 0x180);
  if (version >= 3n) {
    r.writeUInt8(family, 0x188);
    r.writeUInt8(Number(num(o, 'cpuid_mod_id', f, 255n)), 0x189);
    r.writeUInt8(Number(num(o, 'cpuid_step', f, 255n)), 0x18a);
  }
  fixed(o, 'chip_id', 64).copy(r, 0x1a0);
  r.writeBigUInt64LE(tcbOf(o, 'committed_tcb', turin), 0x1e0);
  versionOf(o, 'current').copy(r, 0x1e8);
  versionOf(o, 'committed').copy(r, 0x1ec);
  r.writeBigUInt64LE(tcbOf(o, 'launch_tcb', turin), 0x1f0);
  if (version >= 5n) {
    r.writeBigUInt64LE(num(o, 'launch_mit_vector', f, U64), 0x1f8);
    r.writeBigUInt64LE(num(o, 'current_mit_vector', f, U64), 0x200);
  }
  const sig = o.signature;
  if (!isRecord(sig)) return evidenceError('attestation_report.signature', 'attestation_report.signature is not an object');
  const component = (k: 'r' | 's') => {
    const b = bytesOf(sig[k], `signature.${k}`, 72);
    if (b.length !== 72) evidenceError(`signature.${k}`, `signature.${k} is ${b.length} bytes, not 72`);
    return b;
  };
  component('r').copy(r, 0x2a0);
  component('s').copy(r, 0x2e8);
  return r;
}

/** The report bytes and certificates of the evidence; throws ATTEST_EVIDENCE_INVALID naming the field. */
export function decodeSnpEvidence(evidence: unknown): { report: Buffer; certs: SnpCertEntry[] } {
  if (!isRecord(evidence)) evidenceError('primary_evidence', 'primary_evidence is not a JSON object');
  for (const key of Object.keys(evidence))
    if (key !== 'attestation_report' && key !== 'cert_chain') evidenceError(key, `primary_evidence has an unknown key "${key}"`);
  const ar = evidence.attestation_report;
  const report = isRecord(ar) ? reportFromTrusteeJson(ar) : bytesOf(ar, 'attestation_report', SNP_REPORT_BYTES);
  const chain = evidence.cert_chain;
  if (chain === undefined || chain === null)
    evidenceError('cert_chain', 'cert_chain is missing: the VCEK must come with the report (there is no KDS to fetch it from)');
  if (!Array.isArray(chain)) return evidenceError('cert_chain', 'cert_chain is not an array');
  if (chain.length > MAX_CERTS) evidenceError('cert_chain', `cert_chain has ${chain.length} entries, more than ${MAX_CERTS}`);
  const certs = chain.map((entry, i): SnpCertEntry => {
    const field = `cert_chain[${i}]`;
    if (!isRecord(entry)) return evidenceError(field, `${field} is not an object`);
    const type = entry.cert_type;
    if (typeof type !== 'string' || !(SNP_CERT_TYPES as readonly string[]).includes(type.toUpperCase()))
      evidenceError(`${field}.cert_type`, `${field}.cert_type is not one of ${SNP_CERT_TYPES.join(', ')}`);
    return { certType: type.toUpperCase() as SnpCertType, der: bytesOf(entry.data, `${field}.data`, MAX_CERT_BYTES) };
  });
  return { report, certs };
}

/** A thrown coded error as the failure it stands for. */
export function failureOf(err: unknown, defaultField: string): AttestFailure {
  if (isKataError(err)) {
    const field = (err.details as { field?: unknown } | undefined)?.field;
    return { field: typeof field === 'string' ? field : defaultField, reason: err.message };
  }
  throw err;
}

/** The challenge of a TEE that needs nothing from the Request: its extra-params must be empty. */
export function emptyChallenge(tee: string, requestExtraParams: unknown): ChallengeParams {
  const empty =
    requestExtraParams === undefined ||
    requestExtraParams === null ||
    requestExtraParams === '' ||
    (isRecord(requestExtraParams) && Object.keys(requestExtraParams).length === 0);
  if (!empty)
    throw invalid('ATTEST_MESSAGE_INVALID', `the ${tee} Request's extra-params must be empty`, { details: { field: 'extra-params' } });
  return { extraParams: {}, sessionState: null };
}

/** What the snp verifier trusts and allows. */
export interface SnpVerifierOptions extends SnpTrustAnchors {
  /** Accept a guest whose policy lets the host debug it (a lab setting; default false). */
  allowDebug?: boolean;
}

/**
 * The EvidenceVerifier for tee "snp". Pure: its only inputs are the trust anchors and VerifyInput.
 * Throws ATTEST_TRUST_INVALID when the AMD certificates do not parse or hold no ARK.
 */
export function snpVerifier(options: SnpVerifierOptions): EvidenceVerifier {
  // Parsed once, here: a bundle without a usable root stops the broker at start-up, not at the first pod.
  const anchors = parseSnpTrustAnchors(options);
  return {
    tee: 'snp',
    challenge: (requestExtraParams) => emptyChallenge('snp', requestExtraParams),
    verify(input: VerifyInput): VerifyResult {
      let report: ReturnType<typeof parseSnpReport>;
      let chain: ReturnType<typeof verifySnpCertChain>;
      try {
        const decoded = decodeSnpEvidence(input.evidence);
        report = parseSnpReport(decoded.report);
        chain = verifySnpCertChain(decoded.certs, anchors, input.nowMs);
        verifySnpReportSignature(report, chain.endorsementCert.publicKey);
      } catch (err) {
        return { ok: false, failures: [failureOf(err, 'primary_evidence')] };
      }
      // From here the report is genuine: collect every mismatch, not only the first.
      const failures: AttestFailure[] = [];
      try {
        checkSnpReportedTcb(report, chain);
      } catch (err) {
        failures.push(failureOf(err, 'reported_tcb'));
      }
      if (report.vmpl !== 0)
        failures.push({
          field: 'vmpl',
          reason: `the report was requested at VMPL ${report.vmpl}, not 0`,
          expected: '0',
          actual: String(report.vmpl),
        });
      if (!options.allowDebug && (report.policy >> SNP_POLICY_DEBUG_BIT) & 1n)
        failures.push({ field: 'policy', reason: "the guest's policy allows the host to debug it", actual: report.policy.toString(16) });
      const expectedReportData = snpReportDataFor(input.runtimeDataBytes);
      if (!report.reportData.equals(expectedReportData))
        failures.push({
          field: 'report_data',
          reason: "report_data is not sha384 of this session's runtime data (another nonce or tee-pubkey)",
          expected: expectedReportData.toString('hex'),
          actual: report.reportData.toString('hex'),
        });
      const measurements: Record<string, string> = {
        snp_launch_measurement: report.measurement.toString('hex'),
        snp_host_data: report.hostData.toString('hex'),
        report_data: report.reportData.toString('hex'),
      };
      if (input.initdataBody !== null) {
        try {
          const initdata = parseInitdataDocument(input.initdataBody);
          const expected = snpHostData(initdata);
          if (expected.equals(report.hostData)) measurements.init_data = initdata.digests.sha256.toString('hex');
          else
            failures.push({
              field: 'init_data',
              reason: "the report's host_data is not the digest of the initdata the guest sent",
              expected: expected.toString('hex'),
              actual: report.hostData.toString('hex'),
            });
        } catch (err) {
          failures.push({ ...failureOf(err, 'init_data'), field: 'init_data' });
        }
      }
      if (failures.length > 0) return { ok: false, failures };
      const tcb = report.reportedTcb;
      const details: Record<string, string> = {
        report_version: String(report.version),
        endorsement: chain.endorsement,
        root: chain.root.subject.replace(/\n/g, ', '),
        policy: report.policy.toString(16),
        vmpl: String(report.vmpl),
        guest_svn: String(report.guestSvn),
        reported_tcb: `bl${tcb.bootloader} tee${tcb.tee} snp${tcb.snp} ucode${tcb.microcode}${tcb.fmc === undefined ? '' : ` fmc${tcb.fmc}`}`,
        platform_info: report.platformInfo.toString(16),
        chip_id: report.chipId.toString('hex'),
      };
      return { ok: true, claims: { tee: 'snp', measurements, details } };
    },
  };
}
