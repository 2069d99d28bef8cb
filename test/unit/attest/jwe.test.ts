import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { compactDecrypt, decodeProtectedHeader, exportJWK, flattenedDecrypt } from 'jose';
import { describe, expect, it } from 'vitest';
import {
  decodeResponseJwe,
  decryptResource,
  encryptResource,
  generateTeeKeyPair,
  JWE_MAX_PLAINTEXT_BYTES,
} from '../../../src/attest/jwe.js';
import type { TeePubkey } from '../../../src/attest/kbs-protocol.js';
import { isReason } from '../../../src/common/errors.js';

async function refusal(fn: () => Promise<unknown>): Promise<string> {
  try {
    await fn();
  } catch (err) {
    expect(isReason(err, 'ATTEST_JWE_INVALID', 'ATTEST_MESSAGE_INVALID')).toBe(true);
    return (err as Error).message;
  }
  throw new Error('expected a refusal');
}

const secret = Buffer.from('the database password \u00e9\u0000\u00ff', 'utf8');

describe('JWE round trip', () => {
  it.each([
    ['EC-P256', 'ECDH-ES+A256KW'],
    ['EC-P384', 'ECDH-ES+A256KW'],
    ['RSA', 'RSA-OAEP-256'],
  ] as const)('%s: encrypted with %s/A256GCM, decrypted by decryptResource and by jose directly', async (kind, alg) => {
    const pair = await generateTeeKeyPair(kind);
    const jwe = await encryptResource(secret, pair.publicJwk);
    expect(Object.keys(jwe).sort()).toEqual(['ciphertext', 'encrypted_key', 'iv', 'protected', 'tag']);
    const header = decodeProtectedHeader(jwe);
    expect(header.alg).toBe(alg);
    expect(header.enc).toBe('A256GCM');
    if (kind !== 'RSA') expect((header.epk as { crv?: string } | undefined)?.crv).toBe(kind === 'EC-P256' ? 'P-256' : 'P-384');
    expect(Buffer.from(await decryptResource(jwe, pair.privateKey))).toEqual(secret);
    // The same bytes through jose alone, as any JOSE implementation in a guest would read them.
    const direct = await flattenedDecrypt(jwe, pair.privateKey);
    expect(Buffer.from(direct.plaintext)).toEqual(secret);
    // And as a compact serialisation (no aad in a KBS Response, so it converts 1:1).
    const compact = [jwe.protected, jwe.encrypted_key, jwe.iv, jwe.ciphertext, jwe.tag].join('.');
    expect(Buffer.from((await compactDecrypt(compact, pair.privateKey)).plaintext)).toEqual(secret);
    // A private JWK works as the key too.
    const jwk = await exportJWK(pair.privateKey);
    expect(Buffer.from(await decryptResource(jwe, { ...jwk, kty: jwk.kty as string }))).toEqual(secret);
  });

  it('an empty resource round-trips', async () => {
    const pair = await generateTeeKeyPair();
    expect((await decryptResource(await encryptResource(Buffer.alloc(0), pair.publicJwk), pair.privateKey)).byteLength).toBe(0);
  });

  it('each encryption is fresh (content key, iv, epk)', async () => {
    const pair = await generateTeeKeyPair();
    const a = await encryptResource(secret, pair.publicJwk);
    const b = await encryptResource(secret, pair.publicJwk);
    expect(a.iv).not.toBe(b.iv);
    expect(a.ciphertext).not.toBe(b.ciphertext);
    expect(a.protected).not.toBe(b.protected);
  });
});

describe('JWE refusals', () => {
  it('another key does not decrypt', async () => {
    const pair = await generateTeeKeyPair();
    const other = await generateTeeKeyPair();
    const jwe = await encryptResource(secret, pair.publicJwk);
    expect(await refusal(() => decryptResource(jwe, other.privateKey))).toMatch(/^Response does not decrypt/);
  });

  it('a changed ciphertext, tag, iv or protected header does not decrypt', async () => {
    const pair = await generateTeeKeyPair();
    const jwe = await encryptResource(secret, pair.publicJwk);
    const flip = (s: string) => (s[0] === 'A' ? `B${s.slice(1)}` : `A${s.slice(1)}`);
    for (const field of ['ciphertext', 'tag', 'iv', 'encrypted_key'] as const)
      await refusal(() => decryptResource({ ...jwe, [field]: flip(jwe[field]) }, pair.privateKey));
    const header = JSON.parse(Buffer.from(jwe.protected, 'base64url').toString()) as Record<string, unknown>;
    const reheader = Buffer.from(JSON.stringify({ ...header, kid: 'x' })).toString('base64url');
    await refusal(() => decryptResource({ ...jwe, protected: reheader }, pair.privateKey));
  });

  it('a header naming another algorithm is refused whatever the key (no dir, no A128GCM, no RSA1_5)', async () => {
    const pair = await generateTeeKeyPair();
    const jwe = await encryptResource(secret, pair.publicJwk);
    const header = JSON.parse(Buffer.from(jwe.protected, 'base64url').toString()) as Record<string, unknown>;
    for (const change of [{ enc: 'A128GCM' }, { alg: 'dir' }, { alg: 'RSA1_5' }]) {
      const p = Buffer.from(JSON.stringify({ ...header, ...change })).toString('base64url');
      await refusal(() => decryptResource({ ...jwe, protected: p }, pair.privateKey));
    }
  });

  it('a Response that is not trustee-shaped is refused naming the field', async () => {
    const pair = await generateTeeKeyPair();
    const jwe = await encryptResource(secret, pair.publicJwk);
    const { tag: _tag, ...noTag } = jwe;
    expect(await refusal(() => decryptResource(noTag, pair.privateKey))).toContain("must have required property 'tag'");
    expect(await refusal(() => decryptResource({ ...jwe, iv: 'a+b' }, pair.privateKey))).toContain('/iv must match pattern');
    expect(await refusal(() => decryptResource({ ...jwe, extra: 'x' }, pair.privateKey))).toContain('/extra is not a known key');
    expect(await refusal(() => decryptResource('x', pair.privateKey))).toContain('must be object');
    expect(() => decodeResponseJwe({ ...jwe, ciphertext: 1 })).toThrow(/\/ciphertext must be string/);
  });

  it('refuses to encrypt to a key that is not usable or a resource over the cap', async () => {
    const pair = await generateTeeKeyPair();
    const key = pair.publicJwk as Extract<TeePubkey, { kty: 'EC' }>;
    expect(await refusal(() => encryptResource(secret, { ...key, x: key.y, y: key.x }))).toContain('is not a usable EC public key');
    expect(await refusal(() => encryptResource(Buffer.alloc(JWE_MAX_PLAINTEXT_BYTES + 1), pair.publicJwk))).toContain('over the');
  });

  it('refuses an RSA key below 2048 bits', async () => {
    const { publicKey } = generateKeyPairSync('rsa', { modulusLength: 1024 });
    const jwk = publicKey.export({ format: 'jwk' });
    expect(await refusal(() => encryptResource(secret, { kty: 'RSA', alg: 'RSA-OAEP-256', n: String(jwk.n), e: String(jwk.e) }))).toMatch(
      /1024-bit modulus, below 2048 bits/,
    );
  });

  it('a private key of the wrong kind does not decrypt', async () => {
    const pair = await generateTeeKeyPair('RSA');
    const jwe = await encryptResource(secret, pair.publicJwk);
    const ec = createPrivateKey(
      generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).privateKey.export({ format: 'pem', type: 'pkcs8' }),
    );
    await refusal(() => decryptResource(jwe, ec));
  });
});
