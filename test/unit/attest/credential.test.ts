/**
 * src/attest/credential.ts: KDFa against the TCG reference implementation's self-test vectors
 * (the KDFa test of the TPM 2.0 reference code, as libtpms ships it in KdfTestData.h: key, label
 * "KDFSELFTESTLABEL", two 8-byte contexts, 160 bits, one expected output per hash), KDFe and the
 * ECC seed against chrisfenner/tpm-test-vectors (generated with go-tpm, the ECC credential vector
 * checked there with TPM2_ActivateCredential on a simulator), the sizes of
 * the structures MakeCredential produces, a round trip through the TPM's side of credential
 * activation written out here from Part 1 (with an RSA key of the test's own), object names, and
 * every input refused with a coded error naming the field. The same code is checked against a
 * real swtpm and tpm2-tools in test/integration/attest/credential.test.ts.
 */
import {
  constants,
  createDecipheriv,
  createECDH,
  createHmac,
  createPrivateKey,
  createPublicKey,
  diffieHellman,
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
  eccCredentialSeed,
  ekPublicKeyFromCertificate,
  IDENTITY_LABEL,
  kdfa,
  kdfe,
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

/** KDFe vectors of chrisfenner/tpm-test-vectors (vectors/kdfe.json): hash, Z, use, partyU, partyV, bits, result. */
const KDFE_VECTORS = [
  [
    'sha1',
    'beefefba63c91e8eb318785c374600',
    'ATH',
    'ff8318b65e46b3',
    '32aa861b336c991a52b15c0c72889895e8cad4ff',
    111,
    '123decb8050fca8d6585f61946e2',
  ],
  [
    'sha1',
    '9b050039c8e5ca60deeb978f2faf573c94af61',
    'IDENTITY',
    'ff1a1852db7b60a5c963f17eb306f3a905d100ae',
    '0047ee45771a256d58b091b6d6',
    32,
    '94c3c160',
  ],
  ['sha1', '', 'STORAGE', '', 'c0227aff', 253, '0f10d821af67e1ec776b390f3b4572bb433efd2b94fa7842d879d24d825ed2f9'],
  [
    'sha256',
    '739245447ead0deea5f834f06e043159c6ff',
    'IDENTITY',
    'ad503e36c2314ec9afa2f4047bf19ce7fbc6fe2def32c58459c0fc828c00',
    'ba6dd80b788034161743c95e8ef7a9486fbd69d3ff',
    13,
    '0956',
  ],
  [
    'sha256',
    'ff16189cb377c3dbf0488b66ada0',
    'STORAGE',
    'b16cf6dcfb71cc1615c35ed617deb0f6c925eb8828827a675c190c2b0f40',
    'ff9d00b4',
    359,
    '5529ebfa7d4dbdaf0923f36a8f0ac0e2842c1def72e0735d50eb0783494afa5163891c4f08287869a0a5b5fc4c',
  ],
] as const;

/**
 * ECC labeled-encapsulation vectors of the same repository (vectors/ecc_labeled_encaps.json), label
 * IDENTITY: the EK's TPMT_PUBLIC, the ephemeral scalar, the seed and the TPMS_ECC_POINT sent.
 * "12_P256_SHA256_256_restricted" is the one validated there with TPM2_ActivateCredential.
 */
const ECC_VECTORS = [
  {
    name: '12_P256_SHA256_256_restricted',
    params: { nameAlg: 'sha256', symmetricKeyBits: 256 } as EkCredentialParameters,
    ephemeral: '9efafbaf83563f8ac5a27815eae1017ca78c92f9cde976b1a2e0ad95b8a19bc1',
    seed: '2a03ff2b874e44d36a567e67a0bf08227b9e65a0e9ca5215d4a9e573c23159a1',
    ekPublic:
      '0023000b0003046000000006010000430010000300100020fe4cf1f3e8f583c19e1af6190a7c20751658914a93cd77efb871cb1557377560002007b6b7c55bea1d17b1a9d96f367cf315b2942d517fd8642e9d9157036831c4d5',
    point:
      '002017ca41bd94c7f12436cf135ff1852408ef6a1ee1989e4e6250ef73c348dd6fa90020346f6016d6f6a2ef8e07df6d7b53b362005fc21cda1e1ab25e61f38a87e017b8',
  },
  {
    name: '05_P256_SHA1_SHA512_unrestricted',
    params: { nameAlg: 'sha1', symmetricKeyBits: 128 } as EkCredentialParameters,
    ephemeral: '90c239edb871c42a9f87c15d5e251e09933e1d0f33461d4f15994f3ae2e5bfbc',
    seed: 'c6183193a3cd360bb888b0d60206febe2408e830',
    ekPublic:
      '0023000400020460000000100019000d0003001000209f97f6bb5c4e52d4ad69a34f932c771627c17a9ae95d5d3bc7b3ec8efd6f679f002040a792b9e7b5ca3d5c007a29df4aa5c85dc90316c077e6862515176af5a594c6',
    point:
      '0020706820953d3b0987d04a79f119545f3993c28a6d10c1fc20991440b03744124f0020f67964a22f73386cf95bc65418ea99a1b7b838a34d589285d848710cf599a5c9',
  },
];

/** A P-256 public key from the x and y that end a TPMT_PUBLIC (two 32-byte TPM2Bs). */
function p256FromTpmPublic(pub: Buffer): KeyObject {
  const x = pub.subarray(pub.length - 66, pub.length - 34);
  const y = pub.subarray(pub.length - 32);
  return createPublicKey({ key: { kty: 'EC', crv: 'P-256', x: x.toString('base64url'), y: y.toString('base64url') }, format: 'jwk' });
}

/** A P-256 private key from its scalar. */
function p256Private(d: Buffer): KeyObject {
  const ecdh = createECDH('prime256v1');
  ecdh.setPrivateKey(d);
  const pub = ecdh.getPublicKey();
  const jwk = {
    kty: 'EC',
    crv: 'P-256',
    d: d.toString('base64url'),
    x: pub.subarray(1, 33).toString('base64url'),
    y: pub.subarray(33).toString('base64url'),
  };
  return createPrivateKey({ key: jwk, format: 'jwk' });
}

describe('KDFe and the ECC seed', () => {
  it('KDFe matches the published vectors', () => {
    for (const [hash, z, use, u, v, bits, out] of KDFE_VECTORS) {
      expect(kdfe(hash, Buffer.from(z, 'hex'), use, Buffer.from(u, 'hex'), Buffer.from(v, 'hex'), bits).toString('hex')).toBe(out);
    }
  });
  it('the seed and the point sent for a given ephemeral key match the published ECC vectors', () => {
    for (const v of ECC_VECTORS) {
      const ek = p256FromTpmPublic(Buffer.from(v.ekPublic, 'hex'));
      const made = eccCredentialSeed(ek, v.params, p256Private(Buffer.from(v.ephemeral, 'hex')));
      expect(made.seed.toString('hex'), v.name).toBe(v.seed);
      expect(made.encryptedSecret.toString('hex'), v.name).toBe(`0044${v.point}`);
    }
  });
  it('a credential to a P-256 EK opens with its private key on the TPM side (ECDH, KDFe), with the L-2 parameters by default', () => {
    const ek = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const secret = randomBytes(32);
    const c = makeCredential(ek.publicKey, akName, secret);
    expect(c.encryptedSecret.length).toBe(2 + 2 + 32 + 2 + 32);
    const point = c.encryptedSecret.subarray(2);
    const ephemeral = createPublicKey({
      key: { kty: 'EC', crv: 'P-256', x: point.subarray(2, 34).toString('base64url'), y: point.subarray(36).toString('base64url') },
      format: 'jwk',
    });
    const z = diffieHellman({ privateKey: ek.privateKey, publicKey: ephemeral });
    const ekX = Buffer.from(ek.publicKey.export({ format: 'jwk' }).x as string, 'base64url');
    const seed = kdfe('sha256', z, 'IDENTITY', point.subarray(2, 34), ekX, 256);
    expect(credentialBlobFromSeed(seed, akName, secret)).toEqual(c.credentialBlob);
    // A P-384 EK takes the high-range parameters: a sha384 HMAC, a 48-byte secret.
    const c384 = makeCredential(generateKeyPairSync('ec', { namedCurve: 'P-384' }).publicKey, akName, randomBytes(48));
    expect(c384.credentialBlob.readUInt16BE(2)).toBe(48);
    expect(c384.encryptedSecret.length).toBe(2 + 2 + 48 + 2 + 48);
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
    expect(field(() => makeCredential(generateKeyPairSync('ec', { namedCurve: 'secp256k1' }).publicKey, akName, Buffer.alloc(32)))).toBe(
      'ekPublicKey',
    );
    expect(field(() => makeCredential(generateKeyPairSync('ed25519').publicKey, akName, Buffer.alloc(32)))).toBe('ekPublicKey');
    expect(field(() => eccCredentialSeed(rsa2048.publicKey))).toBe('ekPublicKey');
    const p256 = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const p384 = generateKeyPairSync('ec', { namedCurve: 'P-384' });
    expect(field(() => eccCredentialSeed(p256.publicKey, undefined, p384.privateKey))).toBe('ephemeralPrivateKey');
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
