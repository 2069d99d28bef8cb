/**
 * Checks a TPM 2.0 quote from a vtpm guest (pure, node:crypto): the attestation key's public area
 * (TPMT_PUBLIC), the signed TPMS_ATTEST and its TPMT_SIGNATURE, as guest/agent/tpm.ts hands them
 * over. A quote is accepted only when:
 * - the key is a restricted ECC P-256 signing key (a restricted key signs nothing but what the TPM
 *   produced itself, so an attest structure it signed is the TPM's, not a forgery fed to it);
 * - the ECDSA SHA-256 signature over the TPMS_ATTEST bytes verifies with that key;
 * - the structure is a quote (magic TPM_GENERATED_VALUE, type TPM_ST_ATTEST_QUOTE) whose signer
 *   is the key (its qualified name as a primary key of the endorsement or owner hierarchy) and whose qualifying data is the verifier's nonce;
 * - the PCR values given with it hash, in selection order, to the quote's PCR digest.
 * What it does not establish: that the key lives in the pod's swtpm. That is credential
 * activation's (src/attest/credential.ts, with the guest's TpmClient.activateCredential), which
 * binds the key to the swtpm's EK certificate.
 */
import { createHash, createPublicKey, verify } from 'node:crypto';
import { invalid } from '../common/errors.js';
import './reasons.js';
import { TpmReader } from './tpm-reader.js';

const TPM_GENERATED_VALUE = 0xff544347;
const TPM_ST_ATTEST_QUOTE = 0x8018;
const TPM_ALG_SHA256 = 0x000b;
const TPM_ALG_NULL = 0x0010;
const TPM_ALG_ECDSA = 0x0018;
const TPM_ALG_ECC = 0x0023;
const TPM_ECC_NIST_P256 = 0x0003;
const ATTR_RESTRICTED = 0x00010000;
const ATTR_SIGN = 0x00040000;
const ATTR_FIXED_TPM = 0x00000002;
const P256_BYTES = 32;

/** A reader of untrusted evidence whose short or overlong structures are MEASURE_QUOTE_INVALID. */
class Reader extends TpmReader {
  constructor(buf: Buffer, what: string) {
    super(buf, (p) =>
      bad(
        p.kind === 'short'
          ? `${what} is truncated at byte ${p.at} (needs ${p.need} more, has ${p.has})`
          : `${what} has ${p.extra} bytes after its end`,
      ),
    );
  }
}

function bad(message: string): never {
  throw invalid('MEASURE_QUOTE_INVALID', message);
}

const hex = (n: number): string => `0x${n.toString(16).padStart(4, '0')}`;

/** The attestation key, as its TPMT_PUBLIC says. */
export interface AttestationKey {
  /** nameAlg (sha256) followed by sha256 of the TPMT_PUBLIC bytes: what TPMS_ATTEST names as signer. */
  name: Buffer;
  /** The key as node:crypto takes it. */
  publicKey: ReturnType<typeof createPublicKey>;
  objectAttributes: number;
}

/** Parses an ECC P-256 restricted signing key's TPMT_PUBLIC. */
export function parseAttestationKey(akPublic: Buffer): AttestationKey {
  const r = new Reader(akPublic, 'the attestation key (TPMT_PUBLIC)');
  const type = r.u16();
  if (type !== TPM_ALG_ECC) bad(`the attestation key's type is ${hex(type)}, not ECC (0x0023)`);
  const nameAlg = r.u16();
  if (nameAlg !== TPM_ALG_SHA256) bad(`the attestation key's nameAlg is ${hex(nameAlg)}, not sha256`);
  const attrs = r.u32();
  if ((attrs & (ATTR_RESTRICTED | ATTR_SIGN | ATTR_FIXED_TPM)) !== (ATTR_RESTRICTED | ATTR_SIGN | ATTR_FIXED_TPM))
    bad(`the attestation key's attributes 0x${attrs.toString(16)} lack restricted, sign or fixedTPM`);
  r.sized(); // authPolicy
  const sym = r.u16();
  if (sym !== TPM_ALG_NULL) bad(`the attestation key has a symmetric algorithm ${hex(sym)}: a signing key has none`);
  const scheme = r.u16();
  if (scheme !== TPM_ALG_ECDSA) bad(`the attestation key's scheme is ${hex(scheme)}, not ECDSA`);
  const schemeHash = r.u16();
  if (schemeHash !== TPM_ALG_SHA256) bad(`the attestation key signs with hash ${hex(schemeHash)}, not sha256`);
  const curve = r.u16();
  if (curve !== TPM_ECC_NIST_P256) bad(`the attestation key's curve is ${hex(curve)}, not NIST P-256`);
  const kdf = r.u16();
  if (kdf !== TPM_ALG_NULL) r.u16(); // a kdf's hash: not expected on a signing key, skipped
  const x = r.sized();
  const y = r.sized();
  r.end();
  if (x.length !== P256_BYTES || y.length !== P256_BYTES) bad(`the attestation key's point is ${x.length}+${y.length} bytes, not 32+32`);
  let publicKey: AttestationKey['publicKey'];
  try {
    publicKey = createPublicKey({
      key: { kty: 'EC', crv: 'P-256', x: x.toString('base64url'), y: y.toString('base64url') },
      format: 'jwk',
    });
  } catch (err) {
    bad(`the attestation key's point is not on P-256: ${(err as Error).message}`);
  }
  const name = Buffer.concat([Buffer.from([0x00, 0x0b]), createHash('sha256').update(akPublic).digest()]);
  return { name, publicKey, objectAttributes: attrs };
}

/** A TPMT_SIGNATURE (ECDSA, sha256) as r || s, each 32 bytes (IEEE P1363). */
function parseSignature(signature: Buffer): Buffer {
  const r = new Reader(signature, 'the signature (TPMT_SIGNATURE)');
  const alg = r.u16();
  if (alg !== TPM_ALG_ECDSA) bad(`the signature's algorithm is ${hex(alg)}, not ECDSA`);
  const h = r.u16();
  if (h !== TPM_ALG_SHA256) bad(`the signature's hash is ${hex(h)}, not sha256`);
  const sr = r.sized();
  const ss = r.sized();
  r.end();
  if (sr.length > P256_BYTES || ss.length > P256_BYTES) bad('the signature has an r or s longer than 32 bytes');
  const out = Buffer.alloc(2 * P256_BYTES);
  sr.copy(out, P256_BYTES - sr.length);
  ss.copy(out, 2 * P256_BYTES - ss.length);
  return out;
}

/** What a verified quote says. */
export interface VerifiedQuote {
  /** The sha256-bank PCRs quoted, lowest first. */
  pcrs: number[];
  /** The quote's PCR digest (sha256 of the selected values, in order). */
  pcrDigest: Buffer;
  /** The PCR values given with the quote, now known to be the quoted ones (lower-case hex). */
  pcrValues: Record<number, string>;
  clock: { clockMs: bigint; resetCount: number; restartCount: number; safe: boolean };
  firmwareVersion: bigint;
  akName: Buffer;
  /** The hierarchy the key is a primary key of (its qualified name says which). */
  hierarchy: 'endorsement' | 'owner';
}

/** The hierarchies guest/agent/tpm.ts makes its key under, by handle. */
const PRIMARY_HIERARCHIES = [
  { name: 'endorsement', handle: 0x4000000b },
  { name: 'owner', handle: 0x40000001 },
] as const;

/**
 * A primary key's qualified name, what TPMS_ATTEST names as signer: nameAlg, then sha256 of the
 * hierarchy's handle (a hierarchy's qualified name is its handle) followed by the key's name.
 */
export function qualifiedName(hierarchyHandle: number, keyName: Buffer): Buffer {
  const h = Buffer.alloc(4);
  h.writeUInt32BE(hierarchyHandle);
  return Buffer.concat([Buffer.from([0x00, 0x0b]), createHash('sha256').update(h).update(keyName).digest()]);
}

/** What a verifier is handed (guest/agent/tpm.ts TpmQuote, over the agent's GetTpmQuote). */
export interface QuoteEvidence {
  attest: Buffer;
  signature: Buffer;
  akPublic: Buffer;
  pcrValues: Record<number, Buffer>;
}

/**
 * Verifies a quote against `nonce` (see the file's comment for every check). Throws
 * MEASURE_QUOTE_INVALID saying which check failed.
 */
export function verifyQuote(evidence: QuoteEvidence, nonce: Buffer): VerifiedQuote {
  const ak = parseAttestationKey(evidence.akPublic);
  const sig = parseSignature(evidence.signature);
  if (!verify('sha256', evidence.attest, { key: ak.publicKey, dsaEncoding: 'ieee-p1363' }, sig))
    bad('the signature does not verify with the attestation key over the quote');
  const r = new Reader(evidence.attest, 'the quote (TPMS_ATTEST)');
  const magic = r.u32();
  if (magic !== TPM_GENERATED_VALUE) bad(`the quote's magic is 0x${magic.toString(16)}, not TPM_GENERATED_VALUE`);
  const type = r.u16();
  if (type !== TPM_ST_ATTEST_QUOTE) bad(`the attestation is of type ${hex(type)}, not a quote (0x8018)`);
  const signer = r.sized();
  const hierarchy = PRIMARY_HIERARCHIES.find((h) => qualifiedName(h.handle, ak.name).equals(signer))?.name;
  if (hierarchy === undefined)
    bad("the quote's signer is not the attestation key given with it, as a primary key of the endorsement or owner hierarchy");
  const extra = r.sized();
  if (!extra.equals(nonce)) bad("the quote's qualifying data is not the verifier's nonce");
  const clock = { clockMs: r.u64(), resetCount: r.u32(), restartCount: r.u32(), safe: r.u8() === 1 };
  const firmwareVersion = r.u64();
  const banks = r.u32();
  const pcrs: number[] = [];
  for (let i = 0; i < banks; i++) {
    const alg = r.u16();
    const bitmap = r.bytes(r.u8());
    if (alg !== TPM_ALG_SHA256) bad(`the quote selects bank ${hex(alg)}; only sha256 is verified`);
    for (let p = 0; p < bitmap.length * 8; p++) if (((bitmap[p >> 3] ?? 0) >> (p & 7)) & 1) pcrs.push(p);
  }
  const pcrDigest = Buffer.from(r.sized());
  r.end();
  const values: Record<number, string> = {};
  const h = createHash('sha256');
  for (const p of pcrs) {
    const v = evidence.pcrValues[p];
    if (v === undefined) bad(`PCR ${p} is quoted but its value was not given`);
    if (v.length !== 32) bad(`PCR ${p}'s value is ${v.length} bytes, not 32`);
    h.update(v);
    values[p] = v.toString('hex');
  }
  if (!h.digest().equals(pcrDigest)) bad("the PCR values given do not hash to the quote's PCR digest");
  return { pcrs, pcrDigest, pcrValues: values, clock, firmwareVersion, akName: ak.name, hierarchy };
}

/** How a verified quote compares with a pod's predicted PCRs (the reference-values document's `vtpm.pcrs`). */
export interface QuoteAppraisal {
  /** Every predicted PCR was quoted with the predicted value. */
  ok: boolean;
  matched: number[];
  mismatched: Array<{ pcr: number; predicted: string; quoted: string }>;
  /** Predicted but not in the quote's selection: the verifier asked for too little. */
  notQuoted: number[];
}

/**
 * Compares a verified quote's PCRs with the predicted ones (`kata-ts plan --measurements`'s
 * `vtpm.pcrs`, keyed by PCR number). PCRs the prediction leaves out (firmware-defined) are not
 * judged here; a policy that wants them compares them itself.
 */
export function appraiseQuote(quote: VerifiedQuote, predictedPcrs: Readonly<Record<string, string>>): QuoteAppraisal {
  const matched: number[] = [];
  const mismatched: QuoteAppraisal['mismatched'] = [];
  const notQuoted: number[] = [];
  for (const [key, predicted] of Object.entries(predictedPcrs).sort(([a], [b]) => Number(a) - Number(b))) {
    const pcr = Number(key);
    const quoted = quote.pcrValues[pcr];
    if (quoted === undefined) notQuoted.push(pcr);
    else if (quoted === predicted.toLowerCase()) matched.push(pcr);
    else mismatched.push({ pcr, predicted: predicted.toLowerCase(), quoted });
  }
  return { ok: mismatched.length === 0 && notQuoted.length === 0, matched, mismatched, notQuoted };
}
