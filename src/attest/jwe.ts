/**
 * Resources as the KBS protocol answers them: a flattened JWE (RFC 7516 section 7.2.2, trustee's
 * `Response`: protected, encrypted_key, iv, ciphertext, tag, optional aad) whose content key is
 * wrapped to the `tee-pubkey` the guest sent with its evidence. The broker encrypts; the guest,
 * which alone holds the private key, decrypts.
 *
 * Algorithms: `RSA-OAEP-256` for an RSA key, `ECDH-ES+A256KW` for an EC key (P-256 or P-384),
 * content `A256GCM`. Trustee also still accepts RSA1_5; kata-ts offers and accepts nothing else.
 */
import { generateKeyPairSync, type KeyObject, type webcrypto } from 'node:crypto';
import { FlattenedEncrypt, flattenedDecrypt, importJWK } from 'jose';
import { invalid, isKataError } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import { checkTeePubkey, type TeePubkey } from './kbs-protocol.js';
import './reasons.js';

/** The content encryption of every resource. */
export const JWE_ENC = 'A256GCM';
/** Key management by key type. */
export const JWE_ALG_RSA = 'RSA-OAEP-256';
export const JWE_ALG_EC = 'ECDH-ES+A256KW';

/** Largest resource the broker encrypts (and the guest accepts decrypted): 1 MiB. */
export const JWE_MAX_PLAINTEXT_BYTES = 1024 * 1024;
/** Largest flattened JWE a guest reads: the plaintext's base64url plus headers and key. */
export const JWE_MAX_SERIALIZED_CHARS = Math.ceil((JWE_MAX_PLAINTEXT_BYTES * 4) / 3) + 16 * 1024;

/** trustee's Response, the flattened JWE serialisation (all members base64url). */
export interface KbsResponseJwe {
  protected: string;
  encrypted_key: string;
  iv: string;
  ciphertext: string;
  tag: string;
  aad?: string;
}

const B64URL = { type: 'string', pattern: '^[A-Za-z0-9_-]*$' } as const;
const validateJwe = compileOnce<KbsResponseJwe>({
  type: 'object',
  additionalProperties: false,
  required: ['protected', 'encrypted_key', 'iv', 'ciphertext', 'tag'],
  properties: {
    protected: { ...B64URL, minLength: 1, maxLength: 8192 },
    encrypted_key: { ...B64URL, minLength: 1, maxLength: 4096 },
    iv: { ...B64URL, minLength: 1, maxLength: 64 },
    ciphertext: { ...B64URL, maxLength: JWE_MAX_SERIALIZED_CHARS },
    tag: { ...B64URL, minLength: 1, maxLength: 64 },
    aad: { ...B64URL, maxLength: 8192 },
  },
});

/** Decodes a Response (parsed JSON) into a flattened JWE; throws ATTEST_JWE_INVALID naming the field. */
export function decodeResponseJwe(doc: unknown): KbsResponseJwe {
  const v = validateJwe();
  if (!v(doc)) throw invalid('ATTEST_JWE_INVALID', `Response is invalid: ${describeSchemaErrors(v.errors).join('; ')}`);
  return doc;
}

/** The key management algorithm for a tee-pubkey. */
export function jweAlgFor(key: TeePubkey): typeof JWE_ALG_RSA | typeof JWE_ALG_EC {
  return key.kty === 'RSA' ? JWE_ALG_RSA : JWE_ALG_EC;
}

/**
 * Encrypts a resource to a guest's tee-pubkey (broker side). The key is checked again (it came
 * from a guest), the plaintext size is capped. Throws ATTEST_JWE_INVALID.
 */
export async function encryptResource(plaintext: Uint8Array, teePubkey: TeePubkey): Promise<KbsResponseJwe> {
  if (plaintext.byteLength > JWE_MAX_PLAINTEXT_BYTES)
    throw invalid('ATTEST_JWE_INVALID', `resource is ${plaintext.byteLength} bytes, over the ${JWE_MAX_PLAINTEXT_BYTES}-byte limit`);
  checkTeePubkey(teePubkey);
  const alg = jweAlgFor(teePubkey);
  const jwk =
    teePubkey.kty === 'RSA'
      ? { kty: 'RSA', n: teePubkey.n, e: teePubkey.e }
      : { kty: 'EC', crv: teePubkey.crv, x: teePubkey.x, y: teePubkey.y };
  let key: Awaited<ReturnType<typeof importJWK>>;
  try {
    key = await importJWK(jwk, alg);
  } catch (err) {
    throw invalid('ATTEST_JWE_INVALID', `tee-pubkey cannot be used for ${alg}`, { cause: err });
  }
  const out = await new FlattenedEncrypt(plaintext).setProtectedHeader({ alg, enc: JWE_ENC }).encrypt(key);
  if (out.encrypted_key === undefined || out.iv === undefined || out.tag === undefined || out.protected === undefined)
    throw invalid('ATTEST_JWE_INVALID', 'JWE lacks a member trustee requires');
  const res: KbsResponseJwe = {
    protected: out.protected,
    encrypted_key: out.encrypted_key,
    iv: out.iv,
    ciphertext: out.ciphertext,
    tag: out.tag,
  };
  if (out.aad !== undefined) res.aad = out.aad;
  return res;
}

/** The private key `decryptResource` takes: a node KeyObject, a WebCrypto key, or a private JWK. */
export type TeePrivateKey = KeyObject | webcrypto.CryptoKey | (webcrypto.JsonWebKey & { kty: string });

/**
 * Decrypts a Response with the guest's private key (guest side). Only `RSA-OAEP-256` /
 * `ECDH-ES+A256KW` with `A256GCM` are accepted, whatever the header says; throws
 * ATTEST_JWE_INVALID on anything that does not decrypt and authenticate.
 */
export async function decryptResource(doc: unknown, privateKey: TeePrivateKey): Promise<Uint8Array> {
  const jwe = decodeResponseJwe(doc);
  let key: Parameters<typeof flattenedDecrypt>[1];
  if ('kty' in privateKey && typeof (privateKey as { kty?: unknown }).kty === 'string') {
    const jwk = privateKey as webcrypto.JsonWebKey & { kty: string };
    const alg = jwk.kty === 'RSA' ? JWE_ALG_RSA : JWE_ALG_EC;
    try {
      key = await importJWK(jwk as Parameters<typeof importJWK>[0], alg);
    } catch (err) {
      throw invalid('ATTEST_JWE_INVALID', 'private key is not a usable JWK', { cause: err });
    }
  } else {
    key = privateKey as Parameters<typeof flattenedDecrypt>[1];
  }
  try {
    const out = await flattenedDecrypt(jwe, key as Parameters<typeof flattenedDecrypt>[1], {
      keyManagementAlgorithms: [JWE_ALG_RSA, JWE_ALG_EC],
      contentEncryptionAlgorithms: [JWE_ENC],
    });
    if (out.plaintext.byteLength > JWE_MAX_PLAINTEXT_BYTES)
      throw invalid('ATTEST_JWE_INVALID', `resource is ${out.plaintext.byteLength} bytes, over the limit`);
    return out.plaintext;
  } catch (err) {
    if (isKataError(err)) throw err;
    throw invalid('ATTEST_JWE_INVALID', `Response does not decrypt: ${err instanceof Error ? err.message : String(err)}`, {
      cause: err,
    });
  }
}

/** A fresh key pair for one attestation (guest side): its public half as the tee-pubkey. */
export interface TeeKeyPair {
  publicJwk: TeePubkey;
  privateKey: KeyObject;
}

/**
 * Makes the ephemeral key pair a guest sends as `tee-pubkey` (EC P-256 by default, as CoCo's
 * attester does; RSA 3072 on request). The private key never leaves the caller.
 */
export async function generateTeeKeyPair(kind: 'EC-P256' | 'EC-P384' | 'RSA' = 'EC-P256'): Promise<TeeKeyPair> {
  if (kind === 'RSA') {
    const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 3072, publicExponent: 0x10001 });
    const jwk = publicKey.export({ format: 'jwk' });
    return { publicJwk: { kty: 'RSA', alg: JWE_ALG_RSA, n: String(jwk.n), e: String(jwk.e) }, privateKey };
  }
  const crv = kind === 'EC-P256' ? 'P-256' : 'P-384';
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: crv === 'P-256' ? 'prime256v1' : 'secp384r1' });
  const jwk = publicKey.export({ format: 'jwk' });
  return { publicJwk: { kty: 'EC', crv, alg: JWE_ALG_EC, x: String(jwk.x), y: String(jwk.y) }, privateKey };
}
