/**
 * The `tdx` EvidenceVerifier (pure): an Intel TDX DCAP quote, checked as far as code can without
 * the hardware or Intel's collateral.
 *
 * Evidence (`tee-evidence.primary_evidence` for tee "tdx"), trustee's TdxEvidence shape:
 *   { "quote": base64 of the quote (v4 or v5, certification data type 6 with the PCK chain),
 *     "cc_eventlog"?: base64 of the CCEL table's log (accepted, not replayed here) }
 * The trust anchor (Intel's SGX root CA) is the caller's.
 *
 * Checks, in order (each names its field when it fails):
 *   1. the quote parses (header, TD report body, signature data, every size);
 *   2. the PCK chain reaches a configured Intel root, every certificate valid now; the QE report is
 *      signed by the PCK key and binds the attestation key; the quote is signed by that key
 *      (tdx-quote.ts verifyTdxQuote);
 *   then, all reported together: 3. the QE vendor is Intel; 4. the TD is not debuggable
 *   (td_attributes bit 0); 5. report_data = sha384(runtimeDataBytes) followed by 16 zero bytes;
 *   6. when the guest sent its initdata, mr_config_id equals its digest fitted to 48 bytes.
 * Not checked (needs Intel's PCS collateral): TCB status of the platform (TCB info by FMSPC), the
 * QE identity, the TDX module's identity, revocation (PCK and root CA CRLs).
 * Claims: mr_td, rtmr_0..rtmr_3, mr_config_id, report_data, and init_data (sha256 of the initdata
 * document, when mr_config_id binds it).
 */
import { invalid } from '../common/errors.js';
import { parseInitdataDocument, tdxMrConfigId } from '../measure/initdata.js';
import { emptyChallenge, failureOf } from './snp-verifier.js';
import {
  INTEL_QE_VENDOR_ID,
  parseTdxQuote,
  parseTdxTrustAnchors,
  TD_ATTRIBUTES_DEBUG_BIT,
  type TdxTrustAnchors,
  tdxReportDataFor,
  verifyTdxQuote,
} from './tdx-quote.js';
import type { AttestFailure, EvidenceVerifier, VerifyInput, VerifyResult } from './verifier.js';
import './reasons.js';

/** A quote with its PEM chain is ~5 KiB. */
const MAX_QUOTE_BYTES = 64 * 1024;
/** The CCEL log is at most a few hundred KiB (trustee's vectors: 64 KiB-1 MiB tables). */
const MAX_EVENTLOG_BYTES = 2 * 1024 * 1024;

function evidenceError(field: string, message: string): never {
  throw invalid('ATTEST_EVIDENCE_INVALID', `TDX evidence: ${message}`, { details: { field } });
}

function base64Of(v: unknown, field: string, max: number): Buffer {
  if (typeof v !== 'string') return evidenceError(field, `${field} is not a base64 string`);
  if (v.length > Math.ceil(max / 3) * 4) evidenceError(field, `${field} is longer than ${max} bytes`);
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0) evidenceError(field, `${field} is not standard, padded base64`);
  return Buffer.from(v, 'base64');
}

/** The quote bytes (and event log, when sent) of the evidence; throws ATTEST_EVIDENCE_INVALID naming the field. */
export function decodeTdxEvidence(evidence: unknown): { quote: Buffer; ccEventlog: Buffer | null } {
  if (typeof evidence !== 'object' || evidence === null || Array.isArray(evidence))
    evidenceError('primary_evidence', 'primary_evidence is not a JSON object');
  const e = evidence as Record<string, unknown>;
  for (const key of Object.keys(e))
    if (key !== 'quote' && key !== 'cc_eventlog') evidenceError(key, `primary_evidence has an unknown key "${key}"`);
  const quote = base64Of(e.quote, 'quote', MAX_QUOTE_BYTES);
  const ccEventlog =
    e.cc_eventlog === undefined || e.cc_eventlog === null ? null : base64Of(e.cc_eventlog, 'cc_eventlog', MAX_EVENTLOG_BYTES);
  return { quote, ccEventlog };
}

/** What the tdx verifier trusts and allows. */
export interface TdxVerifierOptions extends TdxTrustAnchors {
  /** Accept a debuggable TD (a lab setting; default false). */
  allowDebug?: boolean;
}

/**
 * The EvidenceVerifier for tee "tdx". Pure: its only inputs are the trust anchor and VerifyInput.
 * Throws ATTEST_TRUST_INVALID when the roots do not parse or one is not a self-signed CA.
 */
export function tdxVerifier(options: TdxVerifierOptions): EvidenceVerifier {
  // Parsed once, here: unusable roots stop the broker at start-up, not at the first pod.
  const roots = parseTdxTrustAnchors(options);
  return {
    tee: 'tdx',
    challenge: (requestExtraParams) => emptyChallenge('tdx', requestExtraParams),
    verify(input: VerifyInput): VerifyResult {
      let quote: ReturnType<typeof parseTdxQuote>;
      let verified: ReturnType<typeof verifyTdxQuote>;
      let eventlogSent: boolean;
      try {
        const decoded = decodeTdxEvidence(input.evidence);
        eventlogSent = decoded.ccEventlog !== null;
        quote = parseTdxQuote(decoded.quote);
        verified = verifyTdxQuote(quote, roots, input.nowMs);
      } catch (err) {
        return { ok: false, failures: [failureOf(err, 'primary_evidence')] };
      }
      const body = quote.body;
      const failures: AttestFailure[] = [];
      if (quote.qeVendorId.toString('hex') !== INTEL_QE_VENDOR_ID)
        failures.push({
          field: 'header.qe_vendor_id',
          reason: "the quote's QE is not Intel's",
          expected: INTEL_QE_VENDOR_ID,
          actual: quote.qeVendorId.toString('hex'),
        });
      const attributes = body.tdAttributes.readBigUInt64LE(0);
      if (!options.allowDebug && (attributes >> TD_ATTRIBUTES_DEBUG_BIT) & 1n)
        failures.push({
          field: 'td_attributes',
          reason: 'the TD is debuggable (td_attributes DEBUG is set)',
          actual: body.tdAttributes.toString('hex'),
        });
      const expectedReportData = tdxReportDataFor(input.runtimeDataBytes);
      if (!body.reportData.equals(expectedReportData))
        failures.push({
          field: 'report_data',
          reason: "report_data is not sha384 of this session's runtime data (another nonce or tee-pubkey)",
          expected: expectedReportData.toString('hex'),
          actual: body.reportData.toString('hex'),
        });
      const measurements: Record<string, string> = {
        mr_td: body.mrTd.toString('hex'),
        rtmr_0: body.rtmr[0].toString('hex'),
        rtmr_1: body.rtmr[1].toString('hex'),
        rtmr_2: body.rtmr[2].toString('hex'),
        rtmr_3: body.rtmr[3].toString('hex'),
        mr_config_id: body.mrConfigId.toString('hex'),
        report_data: body.reportData.toString('hex'),
      };
      if (input.initdataBody !== null) {
        try {
          const initdata = parseInitdataDocument(input.initdataBody);
          const expected = tdxMrConfigId(initdata);
          if (expected.equals(body.mrConfigId)) measurements.init_data = initdata.digests.sha256.toString('hex');
          else
            failures.push({
              field: 'init_data',
              reason: "the quote's mr_config_id is not the digest of the initdata the guest sent",
              expected: expected.toString('hex'),
              actual: body.mrConfigId.toString('hex'),
            });
        } catch (err) {
          failures.push({ ...failureOf(err, 'init_data'), field: 'init_data' });
        }
      }
      if (failures.length > 0) return { ok: false, failures };
      const details: Record<string, string> = {
        quote_version: String(quote.version),
        mr_seam: body.mrSeam.toString('hex'),
        mr_signer_seam: body.mrSignerSeam.toString('hex'),
        td_attributes: body.tdAttributes.toString('hex'),
        xfam: body.xfam.toString('hex'),
        tee_tcb_svn: body.teeTcbSvn.toString('hex'),
        pck_subject: verified.pckCert.subject.replace(/\n/g, ', '),
        fmspc: verified.fmspc,
        trailing_bytes: String(quote.trailingBytes),
        pce_id: verified.pceId,
        not_checked: 'TCB info, QE identity, TDX module identity, CRLs (no Intel collateral here)',
        cc_eventlog: eventlogSent ? 'sent, not replayed (the RTMRs are claimed as quoted)' : 'not sent',
      };
      return { ok: true, claims: { tee: 'tdx', measurements, details } };
    },
  };
}
