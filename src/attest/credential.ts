/**
 * TPM2_MakeCredential as a verifier computes it, without a TPM (TPM 2.0 Library, Part 1,
 * "Credential Protection", "Secret Sharing" and the KDFa of "Key Derivation Function"; the
 * structures of Part 2). Pure: node:crypto only.
 *
 * Why: a guest says "this is my attestation key (AK), and this is my TPM's EK certificate". The
 * certificate proves the EK is a TPM's, but nothing yet ties the AK to that TPM. A credential made
 * here is readable only by a TPM that holds the EK's private key AND has loaded an object whose
 * name is exactly the AK's name (TPM2_ActivateCredential checks both): a guest that hands back the
 * secret proves the AK lives beside that EK.
 *
 * How, for an RSA EK (the TCG default template: nameAlg sha256, AES-128-CFB, 2048 bits):
 * 1. a random seed (as long as the EK nameAlg's digest) is encrypted to the EK with RSA-OAEP,
 *    hash = nameAlg, label "IDENTITY\0": TPM2B_ENCRYPTED_SECRET;
 * 2. symKey = KDFa(nameAlg, seed, "STORAGE", akName, "", EK's symmetric key bits); the secret, as
 *    a TPM2B_DIGEST (size, bytes), is encrypted with AES-CFB, zero IV;
 * 3. hmacKey = KDFa(nameAlg, seed, "INTEGRITY", "", "", digest bits); the outer HMAC is over the
 *    encrypted secret then akName;
 * 4. TPM2B_ID_OBJECT = size, then TPM2B_DIGEST(outer HMAC), then the encrypted secret.
 * For an ECC EK (TCG template L-2: P-256, sha256, AES-128-CFB; or a P-384 one) step 1 is ECDH
 * instead: an ephemeral key on the EK's curve, Z = the x coordinate of the shared point,
 * seed = KDFe(nameAlg, Z, "IDENTITY", ephemeral x, EK x, digest bits), and the encrypted secret
 * is the ephemeral public point (TPMS_ECC_POINT).
 * Both outputs are returned marshalled with their 16-bit size, as the TPM's command takes them.
 */
import {
  constants,
  createCipheriv,
  createHash,
  createHmac,
  createPublicKey,
  diffieHellman,
  generateKeyPairSync,
  type KeyObject,
  publicEncrypt,
  randomBytes,
  X509Certificate,
} from 'node:crypto';
import { invalid } from '../common/errors.js';
import './reasons.js';

/** The hash algorithms a TPM object's name may use, by TPM_ALG_ID. */
export const TPM_NAME_HASHES: Readonly<Record<number, { hash: TpmHash; bytes: number }>> = {
  4: { hash: 'sha1', bytes: 20 },
  11: { hash: 'sha256', bytes: 32 },
  12: { hash: 'sha384', bytes: 48 },
  13: { hash: 'sha512', bytes: 64 },
};

export type TpmHash = 'sha1' | 'sha256' | 'sha384' | 'sha512';

const HASH_BYTES: Readonly<Record<TpmHash, number>> = { sha1: 20, sha256: 32, sha384: 48, sha512: 64 };

/** The EK's parameters MakeCredential depends on: its nameAlg and its symmetric (AES-CFB) key size. */
export interface EkCredentialParameters {
  nameAlg: TpmHash;
  symmetricKeyBits: 128 | 192 | 256;
}

/** The TCG EK Credential Profile's default RSA 2048 template (L-1): sha256, AES-128-CFB. swtpm_setup makes this one. */
export const TCG_DEFAULT_RSA_EK: EkCredentialParameters = { nameAlg: 'sha256', symmetricKeyBits: 128 };

/** The TCG EK Credential Profile's default ECC template (L-2): NIST P-256, sha256, AES-128-CFB. */
export const TCG_DEFAULT_ECC_EK: EkCredentialParameters = { nameAlg: 'sha256', symmetricKeyBits: 128 };

/** The TCG high-range ECC NIST P-384 EK template's parameters: sha384, AES-256-CFB. */
export const TCG_ECC_P384_EK: EkCredentialParameters = { nameAlg: 'sha384', symmetricKeyBits: 256 };

/** RSA EK sizes the TCG templates define (L-1 and the high-range ones). */
const RSA_EK_BITS = [2048, 3072, 4096];

/** ECC EK curves the TCG templates define that node:crypto knows, with their coordinate size. */
const EC_EK_CURVES: Readonly<Record<string, { bytes: number; params: EkCredentialParameters }>> = {
  'P-256': { bytes: 32, params: TCG_DEFAULT_ECC_EK },
  prime256v1: { bytes: 32, params: TCG_DEFAULT_ECC_EK },
  'P-384': { bytes: 48, params: TCG_ECC_P384_EK },
  secp384r1: { bytes: 48, params: TCG_ECC_P384_EK },
};

/** The label OAEP carries when a seed is encrypted for credential activation ("IDENTITY" with its NUL). */
export const IDENTITY_LABEL = Buffer.from('IDENTITY\0', 'latin1');

/** What TPM2_MakeCredential outputs, each marshalled with its 16-bit size. */
export interface MadeCredential {
  /** TPM2B_ID_OBJECT: size, TPM2B_DIGEST integrityHMAC, encIdentity. */
  credentialBlob: Buffer;
  /** TPM2B_ENCRYPTED_SECRET: size, the seed encrypted to the EK. */
  encryptedSecret: Buffer;
}

function bad(message: string, field: string): never {
  throw invalid('ATTEST_CREDENTIAL_INVALID', message, { details: { field } });
}

function u16(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
}

/** A KDF label as Part 1 hashes it: with one terminating NUL (a label ending in NUL gets no second). */
function nulTerminated(label: string | Buffer): Buffer {
  const l = typeof label === 'string' ? Buffer.from(label, 'latin1') : label;
  return l.length > 0 && l[l.length - 1] === 0 ? l : Buffer.concat([l, Buffer.from([0])]);
}

/** Counter-mode output (counter from 1) cut to `bits`, a partial first byte masked; `what` names the KDF in errors. */
function counterKdf(what: string, bits: number, block: (counter: Buffer) => Buffer): Buffer {
  if (!Number.isInteger(bits) || bits <= 0 || bits > 65536) bad(`${what} was asked for ${bits} bits (1-65536)`, 'bits');
  const bytes = Math.ceil(bits / 8);
  const blocks: Buffer[] = [];
  for (let counter = 1, have = 0; have < bytes; counter++) {
    const b = block(u32(counter));
    blocks.push(b);
    have += b.length;
  }
  const out = Buffer.concat(blocks).subarray(0, bytes);
  if (bits % 8 !== 0) out[0] = (out[0] ?? 0) & ((1 << (bits % 8)) - 1);
  return out;
}

/**
 * KDFa (SP800-108 counter mode with HMAC, as Part 1 defines it): blocks of
 * HMAC(key, counter || label || 0x00 || contextU || contextV || bits), counter from 1, all big
 * endian, cut to `bits` (a partial first byte is masked). A label already ending in NUL gets no
 * second one.
 */
export function kdfa(hash: TpmHash, key: Buffer, label: string | Buffer, contextU: Buffer, contextV: Buffer, bits: number): Buffer {
  const labelZ = nulTerminated(label);
  return counterKdf('KDFa', bits, (counter) =>
    createHmac(hash, key).update(counter).update(labelZ).update(contextU).update(contextV).update(u32(bits)).digest(),
  );
}

/**
 * KDFe (SP800-56A's one-step KDF as Part 1 defines it): blocks of
 * H(counter || Z || label || 0x00 || partyU || partyV), counter from 1, cut to `bits`.
 */
export function kdfe(hash: TpmHash, z: Buffer, label: string | Buffer, partyU: Buffer, partyV: Buffer, bits: number): Buffer {
  const labelZ = nulTerminated(label);
  return counterKdf('KDFe', bits, (counter) =>
    createHash(hash).update(counter).update(z).update(labelZ).update(partyU).update(partyV).digest(),
  );
}

/**
 * A TPM object's name from its TPMT_PUBLIC bytes (no TPM2B size in front): its nameAlg (the
 * second field) followed by that hash of the whole structure.
 */
export function objectName(tpmtPublic: Buffer): Buffer {
  if (tpmtPublic.length < 4) bad(`a TPMT_PUBLIC of ${tpmtPublic.length} bytes is too short to name its nameAlg`, 'public');
  const alg = tpmtPublic.readUInt16BE(2);
  const h = TPM_NAME_HASHES[alg];
  if (h === undefined) bad(`the object's nameAlg 0x${alg.toString(16).padStart(4, '0')} is not sha1, sha256, sha384 or sha512`, 'public');
  return Buffer.concat([u16(alg), createHash(h.hash).update(tpmtPublic).digest()]);
}

/** Checks a TPM2B_NAME's content: a known hash algorithm followed by a digest of its size. */
function checkName(name: Buffer, field: string): void {
  if (name.length < 2) bad(`the ${field} is ${name.length} bytes, too short for a TPM object name`, field);
  const h = TPM_NAME_HASHES[name.readUInt16BE(0)];
  if (h === undefined)
    bad(`the ${field} starts with hash algorithm 0x${name.readUInt16BE(0).toString(16)}, not one a TPM names objects with`, field);
  if (name.length !== 2 + h.bytes) bad(`the ${field} is ${name.length} bytes, a ${h.hash} name is ${2 + h.bytes}`, field);
}

function checkParams(p: EkCredentialParameters): void {
  if (HASH_BYTES[p.nameAlg] === undefined) bad(`the EK nameAlg ${String(p.nameAlg)} is not one of sha1, sha256, sha384, sha512`, 'nameAlg');
  if (![128, 192, 256].includes(p.symmetricKeyBits))
    bad(`the EK's AES key size ${p.symmetricKeyBits} is not 128, 192 or 256 bits`, 'symmetricKeyBits');
}

function checkSecret(secret: Buffer, p: EkCredentialParameters): void {
  // TPM2_MakeCredential refuses a credential longer than the EK nameAlg's digest.
  const max = HASH_BYTES[p.nameAlg];
  if (secret.length < 1 || secret.length > max)
    bad(`the credential secret is ${secret.length} bytes; a ${p.nameAlg} EK takes 1-${max}`, 'secret');
}

/**
 * The TPM2B_ID_OBJECT for a given seed (steps 2-4 of the file's comment). Exposed so a test can
 * fix the seed; `makeCredential` draws it at random.
 */
export function credentialBlobFromSeed(
  seed: Buffer,
  akName: Buffer,
  secret: Buffer,
  params: EkCredentialParameters = TCG_DEFAULT_RSA_EK,
): Buffer {
  checkParams(params);
  checkName(akName, 'akName');
  checkSecret(secret, params);
  if (seed.length === 0) bad('the credential seed is empty', 'seed');
  const digestBytes = HASH_BYTES[params.nameAlg];
  const symKey = kdfa(params.nameAlg, seed, 'STORAGE', akName, Buffer.alloc(0), params.symmetricKeyBits);
  const cipher = createCipheriv(`aes-${params.symmetricKeyBits}-cfb`, symKey, Buffer.alloc(16));
  const encIdentity = Buffer.concat([cipher.update(Buffer.concat([u16(secret.length), secret])), cipher.final()]);
  const hmacKey = kdfa(params.nameAlg, seed, 'INTEGRITY', Buffer.alloc(0), Buffer.alloc(0), digestBytes * 8);
  const outerHmac = createHmac(params.nameAlg, hmacKey).update(encIdentity).update(akName).digest();
  const body = Buffer.concat([u16(outerHmac.length), outerHmac, encIdentity]);
  return Buffer.concat([u16(body.length), body]);
}

/**
 * The EK's public key from its certificate (PEM or DER), checked to be an RSA key of a size the
 * TCG templates make or an ECC key on NIST P-256 or P-384. Throws ATTEST_CREDENTIAL_INVALID
 * naming what is wrong.
 */
export function ekPublicKeyFromCertificate(cert: string | Buffer | X509Certificate): KeyObject {
  let x: X509Certificate;
  try {
    x = cert instanceof X509Certificate ? cert : new X509Certificate(cert);
  } catch (err) {
    bad(`the EK certificate does not parse: ${(err as Error).message}`, 'ek_cert');
  }
  const key = x.publicKey;
  checkEkKey(key);
  return key;
}

/** The EK's kind: RSA, or ECC with its curve's coordinate size and the TCG template's parameters. */
type EkKind = { kind: 'rsa' } | { kind: 'ecc'; bytes: number; params: EkCredentialParameters };

function checkEkKey(key: KeyObject): EkKind {
  if (key.type !== 'public') bad(`the EK key given is a ${key.type} key, not a public one`, 'ekPublicKey');
  if (key.asymmetricKeyType === 'ec') {
    const curve = key.asymmetricKeyDetails?.namedCurve ?? '';
    const c = EC_EK_CURVES[curve];
    if (c === undefined) bad(`the EK is an ECC key on ${curve || 'an unnamed curve'}, not NIST P-256 or P-384`, 'ekPublicKey');
    return { kind: 'ecc', ...c };
  }
  if (key.asymmetricKeyType !== 'rsa') bad(`the EK is a ${String(key.asymmetricKeyType)} key, not RSA or ECC`, 'ekPublicKey');
  const bits = key.asymmetricKeyDetails?.modulusLength ?? 0;
  if (!RSA_EK_BITS.includes(bits)) bad(`the EK is RSA ${bits}, not one of ${RSA_EK_BITS.join(', ')}`, 'ekPublicKey');
  return { kind: 'rsa' };
}

/** The x and y coordinates of an EC public key, each `bytes` long. */
function ecPoint(key: KeyObject, bytes: number): { x: Buffer; y: Buffer } {
  const jwk = key.export({ format: 'jwk' });
  const x = Buffer.from(jwk.x ?? '', 'base64url');
  const y = Buffer.from(jwk.y ?? '', 'base64url');
  if (x.length !== bytes || y.length !== bytes)
    bad(`the EK's point is ${x.length}+${y.length} bytes, not ${bytes}+${bytes}`, 'ekPublicKey');
  return { x, y };
}

/**
 * The seed and its TPM2B_ENCRYPTED_SECRET for an ECC EK: ECDH with an ephemeral key on its curve
 * (a fresh one unless a test fixes it), the seed derived with KDFe from the shared x coordinate,
 * the ephemeral point sent. `params` default to the TCG template's for the curve.
 */
export function eccCredentialSeed(
  ekPublicKey: KeyObject,
  params?: EkCredentialParameters,
  ephemeralPrivateKey?: KeyObject,
): { seed: Buffer; encryptedSecret: Buffer } {
  const ek = checkEkKey(ekPublicKey);
  if (ek.kind !== 'ecc') bad('an ECC seed needs an ECC EK', 'ekPublicKey');
  const p = params ?? ek.params;
  checkParams(p);
  const curve = ekPublicKey.asymmetricKeyDetails?.namedCurve as string;
  const privateKey = ephemeralPrivateKey ?? generateKeyPairSync('ec', { namedCurve: curve }).privateKey;
  if (privateKey.type !== 'private' || privateKey.asymmetricKeyDetails?.namedCurve !== curve)
    bad(`the ephemeral key is not a private key on the EK's curve ${curve}`, 'ephemeralPrivateKey');
  return eccSeed(ekPublicKey, ek.bytes, p, privateKey);
}

function eccSeed(
  ekPublicKey: KeyObject,
  bytes: number,
  params: EkCredentialParameters,
  privateKey: KeyObject,
): { seed: Buffer; encryptedSecret: Buffer } {
  const z = diffieHellman({ privateKey, publicKey: ekPublicKey });
  const e = ecPoint(createPublicKey(privateKey), bytes);
  const ek = ecPoint(ekPublicKey, bytes);
  const seed = kdfe(params.nameAlg, z, 'IDENTITY', e.x, ek.x, HASH_BYTES[params.nameAlg] * 8);
  const point = Buffer.concat([u16(e.x.length), e.x, u16(e.y.length), e.y]);
  return { seed, encryptedSecret: Buffer.concat([u16(point.length), point]) };
}

/**
 * TPM2_MakeCredential: a credential carrying `secret` that only the TPM holding `ekPublicKey`'s
 * private key can open, and only for the object named `akName` (nameAlg-prefixed, as
 * `objectName` computes it). `params` are the EK's own (its nameAlg and AES key size); unless
 * given, the TCG template's for the key: L-1 for RSA, L-2 for P-256, the high-range one for
 * P-384. Throws ATTEST_CREDENTIAL_INVALID on bad input.
 */
export function makeCredential(ekPublicKey: KeyObject, akName: Buffer, secret: Buffer, params?: EkCredentialParameters): MadeCredential {
  const ek = checkEkKey(ekPublicKey);
  const p = params ?? (ek.kind === 'ecc' ? ek.params : TCG_DEFAULT_RSA_EK);
  checkParams(p);
  if (ek.kind === 'ecc') {
    const curve = ekPublicKey.asymmetricKeyDetails?.namedCurve as string;
    const { seed, encryptedSecret } = eccSeed(ekPublicKey, ek.bytes, p, generateKeyPairSync('ec', { namedCurve: curve }).privateKey);
    return { credentialBlob: credentialBlobFromSeed(seed, akName, secret, p), encryptedSecret };
  }
  return rsaCredential(ekPublicKey, akName, secret, p);
}

function rsaCredential(ekPublicKey: KeyObject, akName: Buffer, secret: Buffer, params: EkCredentialParameters): MadeCredential {
  const seed = randomBytes(HASH_BYTES[params.nameAlg]);
  const credentialBlob = credentialBlobFromSeed(seed, akName, secret, params);
  const encrypted = publicEncrypt(
    { key: ekPublicKey, padding: constants.RSA_PKCS1_OAEP_PADDING, oaepHash: params.nameAlg, oaepLabel: IDENTITY_LABEL },
    seed,
  );
  return { credentialBlob, encryptedSecret: Buffer.concat([u16(encrypted.length), encrypted]) };
}
