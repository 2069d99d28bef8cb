/**
 * src/attest/credential.ts: KDFa against the TCG reference implementation's self-test vectors
 * (the KDFa test of the TPM 2.0 reference code, as libtpms ships it in KdfTestData.h: key, label
 * "KDFSELFTESTLABEL", two 8-byte contexts, 160 bits, one expected output per hash), the sizes of
 * the structures MakeCredential produces, a round trip through the TPM's side of credential
 * activation written out here from Part 1 (with an RSA key of the test's own), object names, and
 * every input refused with a coded error naming the field. The same code is checked against a
 * real swtpm and tpm2-tools in test/integration/attest/credential.test.ts.
 */
import {
  constants,
  createDecipheriv,
  createHmac,
  generateKeyPairSync,
  type KeyObject,
  privateDecrypt,
  randomBytes,
  timingSafeEqual,
} from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  credentialBlobFromSeed,
  type EkCredentialParameters,
  ekPublicKeyFromCertificate,
  IDENTITY_LABEL,
  kdfa,
  makeCredential,
  objectName,
  TCG_DEFAULT_RSA_EK,
} from '../../../src/attest/credential.js';
import { parseAttestationKey } from '../../../src/measure/quote.js';
import { thrown } from '../../helpers/kata-error.js';

const FIXTURE = path.join(import.meta.dirname, '..', '..', 'fixtures', 'measure', 'tpm-quote-swtpm.json');

/** The reference implementation's KDFa self-test (facts: inputs and expected outputs). */
const KDF_KEY = Buffer.from('271fa08bbdc5060ec3dfa928ff9b73123a12da0c', 'hex');
const KDF_LABEL = Buffer.from('KDFSELFTESTLABEL\0', 'latin1');
const KDF_CONTEXT_U = Buffer.from('ce244f395dca7391', 'hex');
const KDF_CONTEXT_V = Buffer.from('da504031ddf12e83', 'hex');
const KDF_OUT = {
  sha1: '55b5a7184aa07423c47dae766c26a2377d7cf851',
  sha256: 'bb0259e1c8ba607e6a2cd704b69a902e9ade84c4',
  sha384: '1dce70c9113eb2dba47bd9cfc72bf46f45b09312',
  sha512: '8be2c1b85b78569b9fa759f5857c56d684810fd3',
} as const;

const DIGEST_BYTES = { sha1: 20, sha256: 32, sha384: 48, sha512: 64 } as const;

/**
 * TPM2_ActivateCredential's work as Part 1 describes it, for a key the test holds: the seed from
 * the encrypted secret, the outer HMAC checked, the secret decrypted. Throws on any mismatch.
 */
function activate(privateKey: KeyObject, akName: Buffer, blob: Buffer, encryptedSecret: Buffer, p: EkCredentialParameters): Buffer {
  expect(encryptedSecret.readUInt16BE(0)).toBe(encryptedSecret.length - 2);
  const seed = privateDecrypt(
    { key: privateKey, padding: constants.RSA_PKCS1_OAEP_PADDING, oaepHash: p.nameAlg, oaepLabel: IDENTITY_LABEL },
    encryptedSecret.subarray(2),
  );
  expect(blob.readUInt16BE(0)).toBe(blob.length - 2);
  const hmacSize = blob.readUInt16BE(2);
  const hmac = blob.subarray(4, 4 + hmacSize);
  const encIdentity = blob.subarray(4 + hmacSize);
  const hmacKey = kdfa(p.nameAlg, seed, 'INTEGRITY', Buffer.alloc(0), Buffer.alloc(0), DIGEST_BYTES[p.nameAlg] * 8);
  const expected = createHmac(p.nameAlg, hmacKey).update(encIdentity).update(akName).digest();
  if (hmac.length !== expected.length || !timingSafeEqual(hmac, expected)) throw new Error('integrity');
  const symKey = kdfa(p.nameAlg, seed, 'STORAGE', akName, Buffer.alloc(0), p.symmetricKeyBits);
  const d = createDecipheriv(`aes-${p.symmetricKeyBits}-cfb`, symKey, Buffer.alloc(16));
  const plain = Buffer.concat([d.update(encIdentity), d.final()]);
  expect(plain.readUInt16BE(0)).toBe(plain.length - 2);
  return plain.subarray(2);
}

const rsa = (bits: number) => generateKeyPairSync('rsa', { modulusLength: bits });
const rsa2048 = rsa(2048);
const akPublic = Buffer.from(JSON.parse(readFileSync(FIXTURE, 'utf8')).akPublic as string, 'hex');
const akName = objectName(akPublic);

describe('KDFa', () => {
  it("matches the reference implementation's self-test for sha1, sha256, sha384 and sha512", () => {
    for (const [hash, out] of Object.entries(KDF_OUT)) {
      expect(kdfa(hash as keyof typeof KDF_OUT, KDF_KEY, KDF_LABEL, KDF_CONTEXT_U, KDF_CONTEXT_V, 160).toString('hex'), hash).toBe(out);
    }
  });
  it('adds the NUL a label lacks, once', () => {
    expect(kdfa('sha256', KDF_KEY, 'KDFSELFTESTLABEL', KDF_CONTEXT_U, KDF_CONTEXT_V, 160).toString('hex')).toBe(KDF_OUT.sha256);
  });
  it('spans several HMAC blocks and masks a partial first byte', () => {
    const long = kdfa('sha256', KDF_KEY, 'X', Buffer.alloc(0), Buffer.alloc(0), 80 * 8);
    expect(long.length).toBe(80);
    expect(long.subarray(0, 32).equals(long.subarray(32, 64))).toBe(false);
    for (let i = 0; i < 16; i++) {
      const k = kdfa('sha256', randomBytes(16), 'X', Buffer.alloc(0), Buffer.alloc(0), 12);
      expect(k.length).toBe(2);
      expect(k[0] as number).toBeLessThan(16);
    }
  });
  it('refuses a bit count out of range', () => {
    expect(thrown(() => kdfa('sha256', KDF_KEY, 'X', Buffer.alloc(0), Buffer.alloc(0), 0)).reason).toBe('ATTEST_CREDENTIAL_INVALID');
  });
});

describe('objectName', () => {
  it('is the nameAlg and the hash of TPMT_PUBLIC: what the quote verifier names the swtpm AK', () => {
    expect(akName.length).toBe(34);
    expect(akName.subarray(0, 2).toString('hex')).toBe('000b');
    expect(akName).toEqual(parseAttestationKey(akPublic).name);
  });
  it('follows the nameAlg the public area names', () => {
    const sha1Public = Buffer.from(akPublic);
    sha1Public.writeUInt16BE(0x0004, 2);
    expect(objectName(sha1Public).length).toBe(22);
    const sha384Public = Buffer.from(akPublic);
    sha384Public.writeUInt16BE(0x000c, 2);
    expect(objectName(sha384Public).length).toBe(50);
  });
  it('refuses a public area too short or with an unknown nameAlg', () => {
    expect(thrown(() => objectName(Buffer.from('0023', 'hex'))).details?.field).toBe('public');
    const odd = Buffer.from(akPublic);
    odd.writeUInt16BE(0x0010, 2);
    expect(thrown(() => objectName(odd)).message).toMatch(/nameAlg 0x0010/);
  });
});

describe('makeCredential', () => {
  it('makes a TPM2B_ID_OBJECT and a TPM2B_ENCRYPTED_SECRET of the sizes Part 2 gives', () => {
    for (const size of [1, 16, 32]) {
      const c = makeCredential(rsa2048.publicKey, akName, randomBytes(size));
      // size, TPM2B_DIGEST(sha256 HMAC), encrypted TPM2B_DIGEST(secret)
      expect(c.credentialBlob.length).toBe(2 + 2 + 32 + 2 + size);
      expect(c.credentialBlob.readUInt16BE(0)).toBe(c.credentialBlob.length - 2);
      expect(c.credentialBlob.readUInt16BE(2)).toBe(32);
      expect(c.encryptedSecret.length).toBe(2 + 256);
    }
    expect(makeCredential(rsa(3072).publicKey, akName, randomBytes(32)).encryptedSecret.length).toBe(2 + 384);
  });

  it('opens on the TPM side of Part 1 with the EK private key and the same name, and only so', () => {
    const secret = randomBytes(32);
    const c = makeCredential(rsa2048.publicKey, akName, secret);
    expect(activate(rsa2048.privateKey, akName, c.credentialBlob, c.encryptedSecret, TCG_DEFAULT_RSA_EK)).toEqual(secret);
    const otherName = Buffer.from(akName);
    otherName[33] = (otherName[33] ?? 0) ^ 1;
    expect(() => activate(rsa2048.privateKey, otherName, c.credentialBlob, c.encryptedSecret, TCG_DEFAULT_RSA_EK)).toThrow('integrity');
    expect(() => activate(rsa(2048).privateKey, akName, c.credentialBlob, c.encryptedSecret, TCG_DEFAULT_RSA_EK)).toThrow();
    // The OAEP label is "IDENTITY" with its NUL: without it the seed does not decrypt.
    expect(() =>
      privateDecrypt(
        { key: rsa2048.privateKey, padding: constants.RSA_PKCS1_OAEP_PADDING, oaepHash: 'sha256', oaepLabel: Buffer.from('IDENTITY') },
        c.encryptedSecret.subarray(2),
      ),
    ).toThrow();
  });

  it("follows the EK's own parameters (a sha384, AES-256 EK)", () => {
    const p: EkCredentialParameters = { nameAlg: 'sha384', symmetricKeyBits: 256 };
    const secret = randomBytes(48);
    const c = makeCredential(rsa2048.publicKey, akName, secret, p);
    expect(c.credentialBlob.readUInt16BE(2)).toBe(48);
    expect(activate(rsa2048.privateKey, akName, c.credentialBlob, c.encryptedSecret, p)).toEqual(secret);
  });

  it('is a function of the seed: the same seed gives the same blob, another name another HMAC', () => {
    const seed = randomBytes(32);
    const secret = randomBytes(32);
    const a = credentialBlobFromSeed(seed, akName, secret);
    expect(credentialBlobFromSeed(seed, akName, secret)).toEqual(a);
    const other = credentialBlobFromSeed(seed, parseAttestationKey(akPublic).name.fill(7, 2), secret);
    expect(other.subarray(4, 36).equals(a.subarray(4, 36))).toBe(false);
    // Fresh seeds: two credentials for the same inputs share nothing.
    const x = makeCredential(rsa2048.publicKey, akName, secret);
    const y = makeCredential(rsa2048.publicKey, akName, secret);
    expect(x.credentialBlob.equals(y.credentialBlob)).toBe(false);
  });

  it('refuses bad input with ATTEST_CREDENTIAL_INVALID naming the field', () => {
    const field = (fn: () => unknown) => {
      const e = thrown(fn);
      expect(e.reason).toBe('ATTEST_CREDENTIAL_INVALID');
      return e.details?.field;
    };
    expect(field(() => makeCredential(rsa2048.publicKey, akName, Buffer.alloc(0)))).toBe('secret');
    expect(field(() => makeCredential(rsa2048.publicKey, akName, Buffer.alloc(33)))).toBe('secret');
    expect(field(() => makeCredential(rsa2048.publicKey, akName.subarray(0, 33), Buffer.alloc(32)))).toBe('akName');
    expect(
      field(() => makeCredential(rsa2048.publicKey, Buffer.concat([Buffer.from('0010', 'hex'), akName.subarray(2)]), Buffer.alloc(32))),
    ).toBe('akName');
    expect(field(() => makeCredential(rsa(1024).publicKey, akName, Buffer.alloc(32)))).toBe('ekPublicKey');
    expect(field(() => makeCredential(generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey, akName, Buffer.alloc(32)))).toBe(
      'ekPublicKey',
    );
    expect(field(() => makeCredential(rsa2048.privateKey, akName, Buffer.alloc(32)))).toBe('ekPublicKey');
    expect(
      field(() => makeCredential(rsa2048.publicKey, akName, Buffer.alloc(32), { nameAlg: 'sha256', symmetricKeyBits: 100 as 128 })),
    ).toBe('symmetricKeyBits');
    expect(
      field(() => makeCredential(rsa2048.publicKey, akName, Buffer.alloc(32), { nameAlg: 'md5' as 'sha256', symmetricKeyBits: 128 })),
    ).toBe('nameAlg');
    expect(field(() => ekPublicKeyFromCertificate('not a certificate'))).toBe('ek_cert');
  });
});
