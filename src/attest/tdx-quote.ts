/**
 * Intel TDX quotes (pure): the DCAP ECDSA quote, versions 4 and 5, a TD's report signed by the
 * quoting enclave (QE) with an attestation key, which the QE's own report binds to the platform's
 * PCK certificate (Intel's "Quote Generation and Verification" library, TDX DCAP quote format).
 *
 * Layout, little-endian:
 *   Header (48): version u16, att_key_type u16 (2: ECDSA P-256), tee_type u32 (0x81: TDX),
 *                reserved u16 ×2, qe_vendor_id [16], user_data [20]
 *   v4: TD report body (584)                     v5: body_type u16, body_size u32, body
 *        (type 2: TDX 1.0, 584 bytes; type 3: TDX 1.5, 648 bytes with tee_tcb_svn_2 and mr_servicetd)
 *   TD report body: tee_tcb_svn [16] @0, mr_seam [48] @16, mr_signer_seam [48] @64,
 *     seam_attributes [8] @112, td_attributes [8] @120, xfam [8] @128, mr_td [48] @136,
 *     mr_config_id [48] @184, mr_owner [48] @232, mr_owner_config [48] @280,
 *     rtmr0-3 [48 each] @328, report_data [64] @520, (1.5:) tee_tcb_svn_2 [16] @584, mr_servicetd [48] @600
 *   signature_data_len u32, then the signature data:
 *     quote signature [64] (r || s, big-endian) over header || body (v5: with body_type and size),
 *     attestation key [64] (P-256 x || y),
 *     certification data: type u16 (6: QE report certification data), size u32, then
 *       QE report [384] (an SGX report body: report_data [64] at 320),
 *       QE report signature [64] (by the PCK key, over the QE report),
 *       QE authentication data: size u16, bytes,
 *       certification data: type u16 (5: PCK certificate chain, PEM), size u32, bytes.
 * The QE binds the attestation key by report_data = sha256(attestation key || QE auth data)
 * followed by 32 zero bytes.
 *
 * What a full DCAP verification adds and needs Intel's collateral for (not done here): TCB info
 * for the platform's FMSPC (is this TCB up to date), the QE identity (is the QE genuine and
 * current), the TDX module identity, and the PCK and root CA revocation lists.
 */
import { createHash, createPublicKey, type KeyObject, verify as verifySignature, type X509Certificate } from 'node:crypto';
import { invalid, unauthenticated } from '../common/errors.js';
import { certExtensions, certificatesFromPem, derContentItems } from './snp-report.js';
import './reasons.js';

export const TDX_QUOTE_HEADER_BYTES = 48;
export const TDX_TEE_TYPE = 0x81;
export const TDX_ATT_KEY_TYPE_ECDSA_P256 = 2;
/** Intel's QE vendor id. */
export const INTEL_QE_VENDOR_ID = '939a7233f79c4ca9940a0db3957f0607';
export const TD_REPORT_BODY_V10_BYTES = 584;
export const TD_REPORT_BODY_V15_BYTES = 648;
export const SGX_REPORT_BODY_BYTES = 384;
export const CERT_DATA_TYPE_QE_REPORT = 6;
export const CERT_DATA_TYPE_PCK_CHAIN = 5;
/** A PEM PCK chain is ~3.7 KiB; QE authentication data is 32 bytes in practice. */
const MAX_CERT_DATA_BYTES = 64 * 1024;
/** td_attributes bit 0: the TD is debuggable (the host can read its state). */
export const TD_ATTRIBUTES_DEBUG_BIT = 0n;

/** The TD report body, every field a copy. */
export interface TdReportBody {
  teeTcbSvn: Buffer;
  mrSeam: Buffer;
  mrSignerSeam: Buffer;
  seamAttributes: Buffer;
  tdAttributes: Buffer;
  xfam: Buffer;
  mrTd: Buffer;
  mrConfigId: Buffer;
  mrOwner: Buffer;
  mrOwnerConfig: Buffer;
  rtmr: [Buffer, Buffer, Buffer, Buffer];
  reportData: Buffer;
  /** TDX 1.5 bodies only. */
  teeTcbSvn2?: Buffer;
  mrServiceTd?: Buffer;
}

/** The QE's own SGX report, the fields a verifier reads. */
export interface QeReport {
  raw: Buffer;
  cpuSvn: Buffer;
  miscSelect: number;
  attributes: Buffer;
  mrEnclave: Buffer;
  mrSigner: Buffer;
  isvProdId: number;
  isvSvn: number;
  reportData: Buffer;
}

export interface TdxQuote {
  version: 4 | 5;
  attKeyType: number;
  teeType: number;
  qeVendorId: Buffer;
  userData: Buffer;
  body: TdReportBody;
  /** Header and body as signed by the attestation key. */
  signed: Buffer;
  /** r || s, big-endian. */
  signature: Buffer;
  /** P-256 x || y. */
  attestationKey: Buffer;
  qeReport: QeReport;
  qeReportSignature: Buffer;
  qeAuthData: Buffer;
  pckChainPem: string;
  /** Bytes after the signature data (unsigned padding), ignored. */
  trailingBytes: number;
}

function bad(field: string, message: string): never {
  throw invalid('ATTEST_EVIDENCE_INVALID', `TDX quote: ${message}`, { details: { field } });
}

function refused(field: string, message: string): never {
  throw unauthenticated('ATTEST_EVIDENCE_REFUSED', `TDX quote: ${message}`, { details: { field } });
}

/** A bounds-checked reader: a read past the end names the field it was reading. */
class Reader {
  at = 0;
  constructor(
    private readonly buf: Buffer,
    private readonly what = 'the quote',
  ) {}
  need(n: number, field: string): void {
    if (n < 0 || this.at + n > this.buf.length)
      bad(field, `${this.what} ends inside ${field} (needs ${n} bytes at offset ${this.at}, has ${this.buf.length - this.at})`);
  }
  bytes(n: number, field: string): Buffer {
    this.need(n, field);
    const out = Buffer.from(this.buf.subarray(this.at, this.at + n));
    this.at += n;
    return out;
  }
  u16(field: string): number {
    return this.bytes(2, field).readUInt16LE(0);
  }
  u32(field: string): number {
    return this.bytes(4, field).readUInt32LE(0);
  }
  rest(): number {
    return this.buf.length - this.at;
  }
}

function parseBody(b: Buffer): TdReportBody {
  const f = (at: number, n: number) => Buffer.from(b.subarray(at, at + n));
  const body: TdReportBody = {
    teeTcbSvn: f(0, 16),
    mrSeam: f(16, 48),
    mrSignerSeam: f(64, 48),
    seamAttributes: f(112, 8),
    tdAttributes: f(120, 8),
    xfam: f(128, 8),
    mrTd: f(136, 48),
    mrConfigId: f(184, 48),
    mrOwner: f(232, 48),
    mrOwnerConfig: f(280, 48),
    rtmr: [f(328, 48), f(376, 48), f(424, 48), f(472, 48)],
    reportData: f(520, 64),
  };
  if (b.length === TD_REPORT_BODY_V15_BYTES) {
    body.teeTcbSvn2 = f(584, 16);
    body.mrServiceTd = f(600, 48);
  }
  return body;
}

function parseQeReport(raw: Buffer): QeReport {
  return {
    raw,
    cpuSvn: Buffer.from(raw.subarray(0, 16)),
    miscSelect: raw.readUInt32LE(16),
    attributes: Buffer.from(raw.subarray(48, 64)),
    mrEnclave: Buffer.from(raw.subarray(64, 96)),
    mrSigner: Buffer.from(raw.subarray(128, 160)),
    isvProdId: raw.readUInt16LE(256),
    isvSvn: raw.readUInt16LE(258),
    reportData: Buffer.from(raw.subarray(320, 384)),
  };
}

/**
 * Parses a TDX quote (v4 or v5, ECDSA P-256, certification data type 6 carrying a PEM PCK
 * chain). Bytes after the signature data are ignored (counted in `trailingBytes`). Throws
 * ATTEST_EVIDENCE_INVALID naming the field: a truncated quote, another
 * version, key type or TEE, a body or certification data of another type, a size that does not add up.
 */
export function parseTdxQuote(bytes: Buffer): TdxQuote {
  const r = new Reader(bytes);
  const version = r.u16('header.version');
  if (version !== 4 && version !== 5) bad('header.version', `version ${version} is not 4 or 5`);
  const attKeyType = r.u16('header.att_key_type');
  if (attKeyType !== TDX_ATT_KEY_TYPE_ECDSA_P256) bad('header.att_key_type', `att_key_type ${attKeyType} is not 2 (ECDSA P-256)`);
  const teeType = r.u32('header.tee_type');
  if (teeType !== TDX_TEE_TYPE) bad('header.tee_type', `tee_type 0x${teeType.toString(16)} is not 0x81 (TDX)`);
  r.bytes(4, 'header.reserved');
  const qeVendorId = r.bytes(16, 'header.qe_vendor_id');
  const userData = r.bytes(20, 'header.user_data');
  let bodyBytes: number = TD_REPORT_BODY_V10_BYTES;
  if (version === 5) {
    const bodyType = r.u16('body_type');
    const bodySize = r.u32('body_size');
    const expected = bodyType === 2 ? TD_REPORT_BODY_V10_BYTES : bodyType === 3 ? TD_REPORT_BODY_V15_BYTES : undefined;
    if (expected === undefined) bad('body_type', `body_type ${bodyType} is not a TD report (2: TDX 1.0, 3: TDX 1.5)`);
    if (bodySize !== expected) bad('body_size', `body_size ${bodySize} is not ${expected} for body_type ${bodyType}`);
    bodyBytes = expected;
  }
  const body = parseBody(r.bytes(bodyBytes, 'td_report'));
  const signed = Buffer.from(bytes.subarray(0, r.at));
  const sigDataLen = r.u32('signature_data_len');
  if (sigDataLen > r.rest()) bad('signature_data_len', `signature_data_len ${sigDataLen} is more than the ${r.rest()} bytes that follow`);
  // Bytes after the signature data are signed by nobody and read by nobody: quotes fetched through
  // a fixed-size buffer arrive zero-padded (go-tdx-guest's COS vector), so they are tolerated.
  const trailingBytes = r.rest() - sigDataLen;
  const s = new Reader(r.bytes(sigDataLen, 'signature_data'), 'the signature data');
  const signature = s.bytes(64, 'signature');
  const attestationKey = s.bytes(64, 'attestation_key');
  const certType = s.u16('certification_data.type');
  if (certType !== CERT_DATA_TYPE_QE_REPORT)
    bad('certification_data.type', `certification_data.type ${certType} is not 6 (QE report certification data)`);
  const certSize = s.u32('certification_data.size');
  if (certSize !== s.rest())
    bad('certification_data.size', `certification_data.size ${certSize} is not the ${s.rest()} bytes left of the signature data`);
  const qeReport = parseQeReport(s.bytes(SGX_REPORT_BODY_BYTES, 'qe_report'));
  const qeReportSignature = s.bytes(64, 'qe_report_signature');
  const authSize = s.u16('qe_auth_data.size');
  const qeAuthData = s.bytes(authSize, 'qe_auth_data');
  const pckType = s.u16('pck_cert_chain.type');
  if (pckType !== CERT_DATA_TYPE_PCK_CHAIN)
    bad('pck_cert_chain.type', `the QE's certification data type ${pckType} is not 5 (PCK certificate chain)`);
  const pckSize = s.u32('pck_cert_chain.size');
  if (pckSize > MAX_CERT_DATA_BYTES) bad('pck_cert_chain.size', `pck_cert_chain.size ${pckSize} is over ${MAX_CERT_DATA_BYTES}`);
  if (pckSize !== s.rest())
    bad('pck_cert_chain.size', `pck_cert_chain.size ${pckSize} is not the ${s.rest()} bytes left of the signature data`);
  // Quotes from some providers end the PEM with a NUL.
  const pckChainPem = s.bytes(pckSize, 'pck_cert_chain').toString('latin1').replace(/\0+$/, '');
  return {
    version,
    attKeyType,
    teeType,
    qeVendorId,
    userData,
    body,
    signed,
    signature,
    attestationKey,
    qeReport,
    qeReportSignature,
    qeAuthData,
    pckChainPem,
    trailingBytes,
  };
}

/** The P-256 public key of 64 raw bytes (x || y). */
function p256Key(xy: Buffer, field: string): KeyObject {
  try {
    return createPublicKey({
      key: { kty: 'EC', crv: 'P-256', x: xy.subarray(0, 32).toString('base64url'), y: xy.subarray(32, 64).toString('base64url') },
      format: 'jwk',
    });
  } catch (err) {
    throw unauthenticated('ATTEST_EVIDENCE_REFUSED', `TDX quote: ${field} is not a point on P-256`, { details: { field }, cause: err });
  }
}

/** What the caller trusts: Intel's SGX root CA (the PCK chain's root). */
export interface TdxTrustAnchors {
  /** PEM of the Intel SGX Root CA (a bundle: every certificate in it is a trusted root). */
  intelRootCaPem: string;
}

/**
 * Parses the configured roots. Throws ATTEST_TRUST_INVALID (field `intelRootCaPem`) when a
 * certificate does not parse, none is given, or one is not a self-signed CA.
 */
export function parseTdxTrustAnchors(trust: TdxTrustAnchors): X509Certificate[] {
  const roots = certificatesFromPem(trust.intelRootCaPem, 'intelRootCaPem', 'ATTEST_TRUST_INVALID');
  const bad = (m: string): never => {
    throw invalid('ATTEST_TRUST_INVALID', `intelRootCaPem ${m}`, { details: { field: 'intelRootCaPem' } });
  };
  if (roots.length === 0) bad('holds no certificate');
  for (const r of roots)
    if (!(r.ca && r.checkIssued(r) && r.verify(r.publicKey))) bad(`holds ${r.subject.replace(/\n/g, ', ')}, not a self-signed CA`);
  return roots;
}

/** What verifyTdxQuote established. */
export interface TdxVerifiedQuote {
  pckCert: X509Certificate;
  intermediate: X509Certificate;
  root: X509Certificate;
  /** The platform's FMSPC (hex, 6 bytes) and PCE id (hex, 2 bytes) from the PCK's SGX extension: the keys of Intel's TCB info. */
  fmspc: string;
  pceId: string;
}

/** Intel's SGX extension 1.2.840.113741.1.13.1 and its FMSPC (.4) and PCE-ID (.3) members, as DER OID content. */
const SGX_EXTENSION_OID = '2a864886f84d010d01';
const SGX_FMSPC_OID = `${SGX_EXTENSION_OID}04`;
const SGX_PCE_ID_OID = `${SGX_EXTENSION_OID}03`;

/** The FMSPC and PCE id a PCK certificate names. Throws ATTEST_EVIDENCE_REFUSED (pck_cert_chain.pck) without them. */
export function pckPlatformIds(pck: X509Certificate): { fmspc: string; pceId: string } {
  const ids = new Map<string, Buffer>();
  try {
    const ext = certExtensions(pck).get(SGX_EXTENSION_OID);
    // The extension is a SEQUENCE of SEQUENCE { OID, value }.
    const [outer] = ext === undefined ? [] : derContentItems(ext);
    for (const item of outer === undefined ? [] : derContentItems(outer.value)) {
      const [oid, value] = derContentItems(item.value);
      if (oid?.tag === 0x06 && value?.tag === 0x04) ids.set(oid.value.toString('hex'), value.value);
    }
  } catch (err) {
    throw unauthenticated('ATTEST_EVIDENCE_REFUSED', 'TDX quote: the PCK certificate has an unreadable SGX extension', {
      details: { field: 'pck_cert_chain.pck' },
      cause: err,
    });
  }
  const fmspc = ids.get(SGX_FMSPC_OID);
  const pceId = ids.get(SGX_PCE_ID_OID);
  if (fmspc?.length !== 6 || pceId?.length !== 2)
    refused('pck_cert_chain.pck', 'the PCK certificate names no FMSPC (6 bytes) and PCE id (2 bytes) in its SGX extension');
  return { fmspc: fmspc.toString('hex'), pceId: pceId.toString('hex') };
}

function checkValidity(c: X509Certificate, field: string, nowMs: number): void {
  const from = Date.parse(c.validFrom);
  const to = Date.parse(c.validTo);
  if (!(nowMs >= from && nowMs <= to))
    refused(
      field,
      `${field} (${c.subject.replace(/\n/g, ', ')}) is not valid at ${new Date(nowMs).toISOString()} (${c.validFrom} - ${c.validTo})`,
    );
}

/**
 * Verifies the signature chain of a parsed quote, in the order trust flows: the PCK chain to a
 * configured Intel root (PCK -> platform or processor CA -> root, each valid at `nowMs`; a root
 * the quote carries must be byte for byte a configured one), the QE report signed by the PCK key,
 * the QE report binding the attestation key, and the quote signed by the attestation key.
 * Throws ATTEST_EVIDENCE_REFUSED naming the field that failed (and ATTEST_TRUST_INVALID for roots
 * parseTdxTrustAnchors refuses: pass its result to parse them once).
 */
export function verifyTdxQuote(quote: TdxQuote, trust: TdxTrustAnchors | readonly X509Certificate[], nowMs: number): TdxVerifiedQuote {
  const roots: readonly X509Certificate[] = 'intelRootCaPem' in trust ? parseTdxTrustAnchors(trust) : trust;
  const chain = certificatesFromPem(quote.pckChainPem, 'pck_cert_chain');
  const [pckCert, intermediate, quotedRoot, ...extra] = chain;
  if (pckCert === undefined || intermediate === undefined)
    refused('pck_cert_chain', `pck_cert_chain has ${chain.length} certificates, not PCK, its CA and the root`);
  if (extra.length > 0) refused('pck_cert_chain', `pck_cert_chain has ${chain.length} certificates, more than PCK, its CA and the root`);
  if (quotedRoot !== undefined && !roots.some((root) => root.raw.equals(quotedRoot.raw)))
    refused('pck_cert_chain.root', "the quote's root certificate is not a configured Intel SGX root CA");
  if (!(pckCert.checkIssued(intermediate) && pckCert.verify(intermediate.publicKey)))
    refused('pck_cert_chain.pck', 'the PCK certificate is not signed by the PCK CA that follows it');
  const root = roots.find((c) => intermediate.checkIssued(c) && intermediate.verify(c.publicKey));
  if (root === undefined) refused('pck_cert_chain.intermediate', 'the PCK CA is not signed by a configured Intel SGX root CA');
  if (!intermediate.ca) refused('pck_cert_chain.intermediate', 'the PCK CA is not a CA certificate');
  checkValidity(pckCert, 'pck_cert_chain.pck', nowMs);
  checkValidity(intermediate, 'pck_cert_chain.intermediate', nowMs);
  checkValidity(root, 'pck_cert_chain.root', nowMs);

  const pckKey = pckCert.publicKey;
  if (pckKey.asymmetricKeyType !== 'ec' || pckKey.asymmetricKeyDetails?.namedCurve !== 'prime256v1')
    refused('pck_cert_chain.pck', 'the PCK certificate does not hold a P-256 key');
  if (!verifySignature('sha256', quote.qeReport.raw, { key: pckKey, dsaEncoding: 'ieee-p1363' }, quote.qeReportSignature))
    refused(
      'qe_report_signature',
      'the QE report is not signed by the PCK key (a QE report byte was changed, or another platform signed it)',
    );

  const binding = createHash('sha256').update(quote.attestationKey).update(quote.qeAuthData).digest();
  if (!quote.qeReport.reportData.subarray(0, 32).equals(binding) || quote.qeReport.reportData.subarray(32).some((b) => b !== 0))
    refused(
      'attestation_key',
      "the QE report's report_data is not sha256(attestation key || QE auth data): the QE did not certify this attestation key",
    );

  const attKey = p256Key(quote.attestationKey, 'attestation_key');
  if (!verifySignature('sha256', quote.signed, { key: attKey, dsaEncoding: 'ieee-p1363' }, quote.signature))
    refused('signature', "the quote's signature does not verify with the attestation key (a header or TD report byte was changed)");
  return { pckCert, intermediate, root, ...pckPlatformIds(pckCert) };
}

/** sha384 of the bytes, zero-padded to REPORTDATA's 64 bytes: what a quote bound to them carries. */
export function tdxReportDataFor(bytes: Buffer): Buffer {
  const out = Buffer.alloc(64);
  createHash('sha384').update(bytes).digest().copy(out);
  return out;
}
