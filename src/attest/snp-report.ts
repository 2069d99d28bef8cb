/**
 * AMD SEV-SNP attestation reports (pure): the ATTESTATION_REPORT structure the PSP signs for a
 * guest (SEV-SNP Firmware ABI specification, "ATTESTATION_REPORT Structure"), its ECDSA P-384
 * signature, and the VCEK/VLEK -> ASK/ASVK -> ARK certificate chain AMD's key distribution
 * service (KDS) issues.
 *
 * Layout, 0x4A0 bytes, little-endian, for report versions 2, 3 and 5 (3 adds the CPUID family,
 * model and stepping; 5 adds the mitigation vectors; all other offsets are the same):
 *   0x000 VERSION u32          0x004 GUEST_SVN u32       0x008 POLICY u64
 *   0x010 FAMILY_ID [16]       0x020 IMAGE_ID [16]       0x030 VMPL u32
 *   0x034 SIGNATURE_ALGO u32   0x038 CURRENT_TCB u64     0x040 PLATFORM_INFO u64
 *   0x048 AUTHOR_KEY_EN bit 0, MASK_CHIP_KEY bit 1, SIGNING_KEY bits 2-4 (u32)
 *   0x050 REPORT_DATA [64]     0x090 MEASUREMENT [48]    0x0C0 HOST_DATA [32]
 *   0x0E0 ID_KEY_DIGEST [48]   0x110 AUTHOR_KEY_DIGEST [48]
 *   0x140 REPORT_ID [32]       0x160 REPORT_ID_MA [32]   0x180 REPORTED_TCB u64
 *   0x188 CPUID_FAM_ID u8, 0x189 CPUID_MOD_ID u8, 0x18A CPUID_STEP u8 (v3+)
 *   0x1A0 CHIP_ID [64]         0x1E0 COMMITTED_TCB u64
 *   0x1E8 CURRENT_BUILD, _MINOR, _MAJOR u8     0x1EC COMMITTED_BUILD, _MINOR, _MAJOR u8
 *   0x1F0 LAUNCH_TCB u64       0x1F8 LAUNCH_MIT_VECTOR u64, 0x200 CURRENT_MIT_VECTOR u64 (v5)
 *   0x2A0 SIGNATURE: R [72], S [72] (little-endian, zero above the 48 bytes of a P-384 scalar)
 * The signature covers bytes 0x000-0x29F with SHA-384 (SIGNATURE_ALGO 1).
 *
 * A TCB_VERSION (u64) is {BOOT_LOADER, TEE, 4 reserved, SNP, MICROCODE} bytes on Milan and Genoa
 * and {FMC, BOOT_LOADER, TEE, SNP, 3 reserved, MICROCODE} on Turin (CPUID family 0x1A).
 *
 * The certificates: the VCEK (per chip and TCB, ECDSA P-384, carries the chip id and the TCB it
 * was issued for as extensions under 1.3.6.1.4.1.3704.1) or the VLEK (per cloud provider) is
 * signed by the ASK (or ASVK for VLEKs), which the self-signed ARK signs; both with RSA-PSS
 * SHA-384. The trust anchors are AMD's ARKs, given by the caller: nothing here fetches.
 */
import { createHash, type KeyObject, verify as verifySignature, X509Certificate } from 'node:crypto';
import { invalid, unauthenticated } from '../common/errors.js';
import './reasons.js';

export const SNP_REPORT_BYTES = 0x4a0;
/** The signed part of the report. */
export const SNP_REPORT_SIGNED_BYTES = 0x2a0;
/** The report versions this parser knows (the layout is shared; 3 and 5 add fields). */
export const SNP_REPORT_VERSIONS: readonly number[] = [2, 3, 5];
/** SIGNATURE_ALGO 1: ECDSA P-384 with SHA-384, the only one the PSP uses. */
export const SNP_SIGNATURE_ALGO_ECDSA_P384_SHA384 = 1;
/** POLICY bit 19: the hypervisor may debug (read and write) the guest's memory. */
export const SNP_POLICY_DEBUG_BIT = 19n;

const SIG_COMPONENT_BYTES = 72;
const P384_SCALAR_BYTES = 48;

/** A TCB_VERSION decoded (fmc only on Turin and later). */
export interface SnpTcb {
  bootloader: number;
  tee: number;
  snp: number;
  microcode: number;
  fmc?: number;
  /** The u64 as reported, hex (16 digits). */
  raw: string;
}

/** Which key signed the report (the SIGNING_KEY field). */
export type SnpSigningKey = 'vcek' | 'vlek' | 'none';

/** A parsed report; byte fields are copies of the report's bytes. */
export interface SnpReport {
  version: number;
  guestSvn: number;
  policy: bigint;
  familyId: Buffer;
  imageId: Buffer;
  vmpl: number;
  signatureAlgo: number;
  currentTcb: SnpTcb;
  platformInfo: bigint;
  authorKeyEn: boolean;
  maskChipKey: boolean;
  signingKey: SnpSigningKey;
  reportData: Buffer;
  measurement: Buffer;
  hostData: Buffer;
  idKeyDigest: Buffer;
  authorKeyDigest: Buffer;
  reportId: Buffer;
  reportIdMa: Buffer;
  reportedTcb: SnpTcb;
  /** v3 and later: CPUID family, model and stepping of the chip (tells Milan, Genoa, Turin). */
  cpuid?: { family: number; model: number; stepping: number };
  chipId: Buffer;
  committedTcb: SnpTcb;
  currentVersion: string;
  committedVersion: string;
  launchTcb: SnpTcb;
  /** v5: the mitigation vectors. */
  launchMitVector?: bigint;
  currentMitVector?: bigint;
  /** R and S as big-endian 48-byte scalars (converted from the report's little-endian form). */
  signatureR: Buffer;
  signatureS: Buffer;
  /** The exact bytes signed (0x000-0x29F). */
  signed: Buffer;
}

function bad(field: string, message: string): never {
  throw invalid('ATTEST_EVIDENCE_INVALID', `SNP report: ${message}`, { details: { field } });
}

function refused(field: string, message: string): never {
  throw unauthenticated('ATTEST_EVIDENCE_REFUSED', `SNP evidence: ${message}`, { details: { field } });
}

/** True when the report comes from a Turin (family 0x1A) or later chip: another TCB layout. */
function isTurinOrLater(cpuid: SnpReport['cpuid']): boolean {
  return cpuid !== undefined && cpuid.family >= 0x1a;
}

function decodeTcb(value: bigint, turin: boolean): SnpTcb {
  const byte = (i: number) => Number((value >> BigInt(8 * i)) & 0xffn);
  const raw = value.toString(16).padStart(16, '0');
  if (turin) return { fmc: byte(0), bootloader: byte(1), tee: byte(2), snp: byte(3), microcode: byte(7), raw };
  return { bootloader: byte(0), tee: byte(1), snp: byte(6), microcode: byte(7), raw };
}

/** A little-endian 72-byte signature component as a big-endian P-384 scalar; the rest must be zero. */
function scalar(report: Buffer, at: number, field: string): Buffer {
  const le = report.subarray(at, at + SIG_COMPONENT_BYTES);
  if (le.subarray(P384_SCALAR_BYTES).some((b) => b !== 0)) bad(field, `${field} has non-zero bytes above a P-384 scalar`);
  return Buffer.from(le.subarray(0, P384_SCALAR_BYTES)).reverse();
}

const SIGNING_KEYS: Record<number, SnpSigningKey> = { 0: 'vcek', 1: 'vlek', 7: 'none' };

/**
 * Parses an ATTESTATION_REPORT. Throws ATTEST_EVIDENCE_INVALID naming the field (`details.field`):
 * a length other than 0x4A0, an unknown version or signature algorithm, a reserved SIGNING_KEY,
 * signature components wider than P-384.
 */
export function parseSnpReport(bytes: Buffer): SnpReport {
  if (bytes.length !== SNP_REPORT_BYTES) bad('attestation_report', `attestation_report is ${bytes.length} bytes, not ${SNP_REPORT_BYTES}`);
  const r = Buffer.from(bytes);
  const u32 = (at: number) => r.readUInt32LE(at);
  const u64 = (at: number) => r.readBigUInt64LE(at);
  const copy = (at: number, n: number) => Buffer.from(r.subarray(at, at + n));
  const version = u32(0x00);
  if (!SNP_REPORT_VERSIONS.includes(version))
    bad('version', `version ${version} is not one this parser knows (${SNP_REPORT_VERSIONS.join(', ')})`);
  const signatureAlgo = u32(0x34);
  if (signatureAlgo !== SNP_SIGNATURE_ALGO_ECDSA_P384_SHA384)
    bad('signature_algo', `signature_algo ${signatureAlgo} is not 1 (ECDSA P-384 with SHA-384)`);
  const keyInfo = u32(0x48);
  const signingKey = SIGNING_KEYS[(keyInfo >> 2) & 0x7];
  if (signingKey === undefined) bad('signing_key', `signing_key ${(keyInfo >> 2) & 0x7} is reserved`);
  const cpuid = version >= 3 ? { family: r.readUInt8(0x188), model: r.readUInt8(0x189), stepping: r.readUInt8(0x18a) } : undefined;
  const turin = isTurinOrLater(cpuid);
  const fwVersion = (at: number) => `${r.readUInt8(at + 2)}.${r.readUInt8(at + 1)}.${r.readUInt8(at)}`;
  const report: SnpReport = {
    version,
    guestSvn: u32(0x04),
    policy: u64(0x08),
    familyId: copy(0x10, 16),
    imageId: copy(0x20, 16),
    vmpl: u32(0x30),
    signatureAlgo,
    currentTcb: decodeTcb(u64(0x38), turin),
    platformInfo: u64(0x40),
    authorKeyEn: (keyInfo & 1) !== 0,
    maskChipKey: (keyInfo & 2) !== 0,
    signingKey,
    reportData: copy(0x50, 64),
    measurement: copy(0x90, 48),
    hostData: copy(0xc0, 32),
    idKeyDigest: copy(0xe0, 48),
    authorKeyDigest: copy(0x110, 48),
    reportId: copy(0x140, 32),
    reportIdMa: copy(0x160, 32),
    reportedTcb: decodeTcb(u64(0x180), turin),
    chipId: copy(0x1a0, 64),
    committedTcb: decodeTcb(u64(0x1e0), turin),
    currentVersion: fwVersion(0x1e8),
    committedVersion: fwVersion(0x1ec),
    launchTcb: decodeTcb(u64(0x1f0), turin),
    signatureR: scalar(r, 0x2a0, 'signature.r'),
    signatureS: scalar(r, 0x2a0 + SIG_COMPONENT_BYTES, 'signature.s'),
    signed: copy(0, SNP_REPORT_SIGNED_BYTES),
  };
  if (cpuid !== undefined) report.cpuid = cpuid;
  if (version >= 5) {
    report.launchMitVector = u64(0x1f8);
    report.currentMitVector = u64(0x200);
  }
  return report;
}

/**
 * Checks the report's signature with the endorsement key (the VCEK's or VLEK's public key).
 * Throws ATTEST_EVIDENCE_REFUSED (field `signature`) when it does not verify: a changed byte of
 * the signed part (measurement, report_data, host_data, ...) or another chip's key.
 */
export function verifySnpReportSignature(report: SnpReport, endorsementKey: KeyObject): void {
  const details = endorsementKey.asymmetricKeyDetails;
  if (endorsementKey.asymmetricKeyType !== 'ec' || details?.namedCurve !== 'secp384r1')
    refused('cert_chain.VCEK', 'the endorsement key is not an ECDSA P-384 key');
  const ok = verifySignature(
    'sha384',
    report.signed,
    { key: endorsementKey, dsaEncoding: 'ieee-p1363' },
    Buffer.concat([report.signatureR, report.signatureS]),
  );
  if (!ok)
    refused(
      'signature',
      "the report's signature does not verify with the endorsement key (a signed field was changed, or another chip signed it)",
    );
}

/* ---------------- certificates ---------------- */

/** The kinds of certificate an SNP cert table (the extended report's, or trustee's cert_chain) names. */
export const SNP_CERT_TYPES = ['ARK', 'ASK', 'ASVK', 'VCEK', 'VLEK'] as const;
export type SnpCertType = (typeof SNP_CERT_TYPES)[number];

/** One certificate the evidence carries, DER. */
export interface SnpCertEntry {
  certType: SnpCertType;
  der: Buffer;
}

/** What the caller trusts: AMD's ARKs (self-signed), and optionally ASKs/ASVKs to use when the evidence carries none. */
export interface SnpTrustAnchors {
  /** PEM bundle: every self-signed certificate in it is a trusted root, every other one an intermediate offered to the chain. */
  amdCertsPem: string;
}

/** A verified chain. */
export interface SnpVerifiedChain {
  endorsement: 'VCEK' | 'VLEK';
  endorsementCert: X509Certificate;
  intermediate: X509Certificate;
  root: X509Certificate;
}

const PEM_CERT = /-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----/g;

/** Certificates a trust bundle may hold: every product line's ARK, ASK and ASVK, with room to spare. */
export const MAX_TRUST_ANCHOR_CERTS = 32;

/**
 * Every certificate of a PEM bundle; throws `reason` naming `field` on a bad one (evidence:
 * ATTEST_EVIDENCE_INVALID; the caller's trust anchors: ATTEST_TRUST_INVALID).
 */
export function certificatesFromPem(
  pem: string,
  field: string,
  reason: 'ATTEST_EVIDENCE_INVALID' | 'ATTEST_TRUST_INVALID' = 'ATTEST_EVIDENCE_INVALID',
): X509Certificate[] {
  const blocks = pem.match(PEM_CERT) ?? [];
  // Evidence holds certificates and nothing else: a damaged block would otherwise be skipped
  // unseen (an operator's bundle may carry comments between its certificates).
  if (reason === 'ATTEST_EVIDENCE_INVALID' && pem.replace(PEM_CERT, '').trim() !== '')
    throw invalid(reason, `${field} holds text that is not a PEM certificate`, { details: { field } });
  if (reason === 'ATTEST_TRUST_INVALID' && blocks.length > MAX_TRUST_ANCHOR_CERTS)
    throw invalid(reason, `${field} holds ${blocks.length} certificates, more than ${MAX_TRUST_ANCHOR_CERTS}`, { details: { field } });
  return blocks.map((block, i) => {
    try {
      return new X509Certificate(block);
    } catch (err) {
      throw invalid(reason, `${field}: certificate ${i} is not an X.509 certificate`, { details: { field }, cause: err });
    }
  });
}

/** The caller's AMD certificates, split into roots (self-signed ARKs) and intermediates (ASKs, ASVKs). */
export interface SnpAnchors {
  roots: X509Certificate[];
  intermediates: X509Certificate[];
}

/**
 * Parses the trust bundle. Throws ATTEST_TRUST_INVALID (field `amdCertsPem`) when a certificate
 * does not parse or no self-signed ARK is in it: a verifier must not start trusting nothing, or
 * something else than its operator meant.
 */
export function parseSnpTrustAnchors(trust: SnpTrustAnchors): SnpAnchors {
  const all = certificatesFromPem(trust.amdCertsPem, 'amdCertsPem', 'ATTEST_TRUST_INVALID');
  const roots = all.filter(selfSigned);
  if (roots.length === 0)
    throw invalid('ATTEST_TRUST_INVALID', 'amdCertsPem holds no AMD root (a self-signed ARK)', { details: { field: 'amdCertsPem' } });
  return { roots, intermediates: all.filter((c) => !selfSigned(c)) };
}

function certFromDer(der: Buffer, field: string): X509Certificate {
  try {
    return new X509Certificate(der);
  } catch (err) {
    throw invalid('ATTEST_EVIDENCE_INVALID', `SNP evidence: ${field} is not a DER X.509 certificate`, { details: { field }, cause: err });
  }
}

function selfSigned(c: X509Certificate): boolean {
  return c.checkIssued(c) && c.verify(c.publicKey);
}

/** Whether `child` names `parent` as issuer and carries its signature. */
function signedBy(child: X509Certificate, parent: X509Certificate): boolean {
  return child.checkIssued(parent) && child.verify(parent.publicKey);
}

function checkValidity(c: X509Certificate, field: string, nowMs: number, who: (f: string, m: string) => never): void {
  const from = Date.parse(c.validFrom);
  const to = Date.parse(c.validTo);
  if (!(nowMs >= from && nowMs <= to))
    who(
      field,
      `${field} (${c.subject.replace(/\n/g, ', ')}) is not valid at ${new Date(nowMs).toISOString()} (${c.validFrom} - ${c.validTo})`,
    );
}

/**
 * Verifies the endorsement key's chain: the evidence's VCEK (or VLEK) is signed by an ASK (or
 * ASVK) from the evidence or the anchors, which a configured ARK signs. An ARK in the evidence
 * is accepted only when it is byte for byte a configured one. Every certificate must be valid at
 * `nowMs`. Throws ATTEST_EVIDENCE_REFUSED naming the certificate (`cert_chain.VCEK`, ...), and
 * ATTEST_TRUST_INVALID for a bundle parseSnpTrustAnchors refuses (pass its result to parse once).
 */
export function verifySnpCertChain(certs: readonly SnpCertEntry[], trust: SnpTrustAnchors | SnpAnchors, nowMs: number): SnpVerifiedChain {
  const { roots, intermediates: trustedIntermediates } = 'roots' in trust ? trust : parseSnpTrustAnchors(trust);
  const byType = (t: SnpCertType) => certs.filter((c) => c.certType === t).map((c) => certFromDer(c.der, `cert_chain.${t}`));
  const [vcek] = byType('VCEK');
  const [vlek] = byType('VLEK');
  const endorsementCert = vcek ?? vlek;
  if (endorsementCert === undefined) refused('cert_chain.VCEK', 'the evidence carries no VCEK or VLEK (there is no KDS to fetch one from)');
  const endorsement = vcek !== undefined ? 'VCEK' : 'VLEK';
  const field = `cert_chain.${endorsement}`;
  for (const ark of byType('ARK')) {
    if (!roots.some((root) => root.raw.equals(ark.raw)))
      refused('cert_chain.ARK', 'the evidence carries an ARK that is not a configured AMD root');
  }
  const intermediates = [...byType(endorsement === 'VCEK' ? 'ASK' : 'ASVK'), ...trustedIntermediates];
  const intermediate = intermediates.find((c) => signedBy(endorsementCert, c));
  if (intermediate === undefined)
    refused(
      field,
      `the ${endorsement} is not signed by any ${endorsement === 'VCEK' ? 'ASK' : 'ASVK'} of the evidence or the configured AMD certificates`,
    );
  const interField = endorsement === 'VCEK' ? 'cert_chain.ASK' : 'cert_chain.ASVK';
  const root = roots.find((c) => signedBy(intermediate, c));
  if (root === undefined)
    refused(interField, `the ${interField.slice(11)} that signed the ${endorsement} is not signed by a configured ARK`);
  if (!intermediate.ca) refused(interField, `the ${interField.slice(11)} is not a CA certificate`);
  checkValidity(endorsementCert, field, nowMs, refused);
  checkValidity(intermediate, interField, nowMs, refused);
  checkValidity(root, 'cert_chain.ARK', nowMs, refused);
  const key = endorsementCert.publicKey;
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'secp384r1')
    refused(field, `the ${endorsement} does not hold an ECDSA P-384 key`);
  return { endorsement, endorsementCert, intermediate, root };
}

/* ---------------- VCEK extensions ---------------- */

/** AMD's VCEK extension OIDs (1.3.6.1.4.1.3704.1...), DER content bytes of the OID. */
const AMD_OID_PREFIX = [0x2b, 0x06, 0x01, 0x04, 0x01, 0x9c, 0x78, 0x01];
const VCEK_OIDS = {
  bootloader: [...AMD_OID_PREFIX, 0x03, 0x01],
  tee: [...AMD_OID_PREFIX, 0x03, 0x02],
  snp: [...AMD_OID_PREFIX, 0x03, 0x03],
  microcode: [...AMD_OID_PREFIX, 0x03, 0x08],
  fmc: [...AMD_OID_PREFIX, 0x03, 0x09],
  hwid: [...AMD_OID_PREFIX, 0x04],
} as const;

interface Der {
  tag: number;
  /** The content bytes. */
  value: Buffer;
  /** Bytes of the whole element (header + content). */
  size: number;
}

/** One DER element at `at`; throws on anything that runs past the buffer (certificates are untrusted). */
function derAt(buf: Buffer, at: number): Der {
  if (at + 2 > buf.length) throw new Error('DER element header past the end');
  const tag = buf[at] as number;
  let len = buf[at + 1] as number;
  let header = 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    if (n === 0 || n > 4 || at + 2 + n > buf.length) throw new Error('DER length form not supported');
    len = 0;
    for (let i = 0; i < n; i++) len = len * 256 + (buf[at + 2 + i] as number);
    header += n;
  }
  if (at + header + len > buf.length) throw new Error('DER element runs past the end');
  return { tag, value: buf.subarray(at + header, at + header + len), size: header + len };
}

function derChildren(value: Buffer): Der[] {
  const out: Der[] = [];
  for (let at = 0; at < value.length; ) {
    const d = derAt(value, at);
    out.push(d);
    at += d.size;
  }
  return out;
}

/** The DER elements of a SEQUENCE's content, in order; throws a plain Error on malformed DER. */
export function derContentItems(content: Buffer): { tag: number; value: Buffer }[] {
  return derChildren(content);
}

/**
 * The certificate's extensions: the OID's DER content bytes (hex) -> the extnValue's content.
 * Node exposes only the extensions OpenSSL knows; AMD's and Intel's are read here. Throws a
 * plain Error on malformed DER (OpenSSL parsed the certificate, so that means a bug).
 */
export function certExtensions(cert: X509Certificate): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const tbs = derChildren(derAt(cert.raw, 0).value)[0];
  if (tbs === undefined) throw new Error('no tbsCertificate');
  const wrapper = derChildren(tbs.value).find((d) => d.tag === 0xa3);
  if (wrapper === undefined) return out;
  const list = derChildren(wrapper.value)[0];
  for (const ext of derChildren(list?.value ?? Buffer.alloc(0))) {
    const parts = derChildren(ext.value);
    const oid = parts[0];
    const value = parts[parts.length - 1];
    if (oid?.tag === 0x06 && value?.tag === 0x04) out.set(oid.value.toString('hex'), value.value);
  }
  return out;
}

/** A TCB component extension: a DER INTEGER (0-255). */
function extInteger(ext: Buffer): number {
  const d = derAt(ext, 0);
  if (d.tag !== 0x02 || d.value.length === 0 || d.value.length > 2) throw new Error('not a small INTEGER');
  const n = d.value.readUIntBE(0, d.value.length);
  if (n > 255) throw new Error('INTEGER above 255');
  return n;
}

/**
 * The hwID: 64 bytes on Milan and Genoa, 8 on Turin (whose KDS names a chip by the first 8 bytes
 * of CHIP_ID); the raw bytes as the extension's value (older VCEKs, Turin's), or wrapped in an
 * OCTET STRING.
 */
function extHwid(ext: Buffer): Buffer {
  if (ext.length === 64 || ext.length === 8) return ext;
  const d = derAt(ext, 0);
  if (d.tag !== 0x04 || (d.value.length !== 64 && d.value.length !== 8)) throw new Error('not an OCTET STRING of 64 or 8 bytes');
  return d.value;
}

/** What a VCEK certifies: the TCB it was issued for, and the chip (VLEKs name no chip). */
export interface VcekTcb {
  bootloader: number;
  tee: number;
  snp: number;
  microcode: number;
  fmc?: number;
  hwid?: Buffer;
}

/** Reads the TCB and hwID extensions of a VCEK or VLEK. Throws ATTEST_EVIDENCE_INVALID naming the certificate. */
export function vcekTcb(cert: X509Certificate, field: string): VcekTcb {
  try {
    const exts = certExtensions(cert);
    const get = (oid: readonly number[]) => exts.get(Buffer.from(oid).toString('hex'));
    const int = (name: keyof typeof VCEK_OIDS) => {
      const v = get(VCEK_OIDS[name]);
      if (v === undefined) throw new Error(`no ${name} SPL extension`);
      return extInteger(v);
    };
    const out: VcekTcb = { bootloader: int('bootloader'), tee: int('tee'), snp: int('snp'), microcode: int('microcode') };
    const fmc = get(VCEK_OIDS.fmc);
    if (fmc !== undefined) out.fmc = extInteger(fmc);
    const hwid = get(VCEK_OIDS.hwid);
    if (hwid !== undefined) out.hwid = extHwid(hwid);
    return out;
  } catch (err) {
    throw invalid('ATTEST_EVIDENCE_INVALID', `SNP evidence: ${field} has unreadable AMD extensions (${(err as Error).message})`, {
      details: { field },
      cause: err,
    });
  }
}

/**
 * Checks that the endorsement certificate was issued for the report's REPORTED_TCB (and, for a
 * VCEK, the report's CHIP_ID): the PSP signs with the key of the TCB it reports, so another TCB
 * means another key. Throws ATTEST_EVIDENCE_REFUSED naming the report field that differs.
 */
export function checkSnpReportedTcb(report: SnpReport, chain: SnpVerifiedChain): void {
  const field = `cert_chain.${chain.endorsement}`;
  if (report.signingKey !== chain.endorsement.toLowerCase())
    refused(
      'signing_key',
      `the report says it was signed by the ${report.signingKey.toUpperCase()}, the evidence verified it with the ${chain.endorsement}`,
    );
  const tcb = vcekTcb(chain.endorsementCert, field);
  const parts = ['bootloader', 'tee', 'snp', 'microcode'] as const;
  for (const p of parts) {
    if (tcb[p] !== report.reportedTcb[p])
      refused(`reported_tcb.${p}`, `reported_tcb.${p} is ${report.reportedTcb[p]} but the ${chain.endorsement} was issued for ${tcb[p]}`);
  }
  if (report.reportedTcb.fmc !== undefined && tcb.fmc !== report.reportedTcb.fmc)
    refused('reported_tcb.fmc', `reported_tcb.fmc is ${report.reportedTcb.fmc} but the ${chain.endorsement} was issued for ${tcb.fmc}`);
  if (chain.endorsement === 'VCEK') {
    if (tcb.hwid === undefined) refused(field, 'the VCEK has no hwID extension');
    // A chip may mask its id (MASK_CHIP_ID): the report then carries zeros and names no chip.
    const masked = report.chipId.every((b) => b === 0);
    if (!masked && !tcb.hwid.equals(report.chipId.subarray(0, tcb.hwid.length)))
      refused('chip_id', 'chip_id is not the chip the VCEK was issued to');
  }
}

/** sha384 of the bytes, zero-padded to REPORT_DATA's 64 bytes: what a report bound to them carries. */
export function snpReportDataFor(bytes: Buffer): Buffer {
  const out = Buffer.alloc(64);
  createHash('sha384').update(bytes).digest().copy(out);
  return out;
}
