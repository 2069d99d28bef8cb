import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { generateTeeKeyPair } from '../../../src/attest/jwe.js';
import {
  ACCEPTED_REQUEST_VERSIONS,
  decodeAttestation,
  decodeAttestationToken,
  decodeChallenge,
  decodeErrorInformation,
  decodeRequest,
  errorInformation,
  isAcceptedVersion,
  KBS_ERROR_TYPES,
  KBS_PROTOCOL_VERSION,
  type KbsRuntimeData,
  runtimeDataBytes,
} from '../../../src/attest/kbs-protocol.js';
import { isReason } from '../../../src/common/errors.js';

/** The message of the coded error `fn` throws (ATTEST_MESSAGE_INVALID), or a failure. */
function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(isReason(err, 'ATTEST_MESSAGE_INVALID')).toBe(true);
    return (err as Error).message;
  }
  throw new Error('expected a refusal');
}

const EC = await generateTeeKeyPair('EC-P256');
const EC384 = await generateTeeKeyPair('EC-P384');
const RSA = await generateTeeKeyPair('RSA');

function attestation(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    'runtime-data': { nonce: 'bm9uY2U=', 'tee-pubkey': EC.publicJwk },
    'tee-evidence': { primary_evidence: { quote: 'x' }, additional_evidence: '' },
    ...over,
  };
}

describe('KBS protocol version', () => {
  it('is 0.4.0 and only that is accepted (trustee requires =0.4.0)', () => {
    expect(KBS_PROTOCOL_VERSION).toBe('0.4.0');
    expect(ACCEPTED_REQUEST_VERSIONS).toEqual(['0.4.0']);
    expect(isAcceptedVersion('0.4.0')).toBe(true);
    for (const v of ['0.3.0', '0.1.1', '0.4.1', '1.0.0', '0.4', '']) expect(isAcceptedVersion(v)).toBe(false);
  });
});

describe('Request', () => {
  it('decodes a tpm request with object extra-params and an snp one with "" (as trustee attesters send)', () => {
    expect(decodeRequest({ version: '0.4.0', tee: 'tpm', 'extra-params': { ek_cert: 'x' } }).tee).toBe('tpm');
    expect(decodeRequest({ version: '0.4.0', tee: 'snp', 'extra-params': '' })['extra-params']).toBe('');
  });
  it.each([
    [{ tee: 'tpm', 'extra-params': {} }, "must have required property 'version'"],
    [{ version: 4, tee: 'tpm', 'extra-params': {} }, '/version must be string'],
    [{ version: '', tee: 'tpm', 'extra-params': {} }, '/version must NOT have fewer than 1 characters'],
    [{ version: 'x'.repeat(65), tee: 'tpm', 'extra-params': {} }, '/version must NOT have more than 64 characters'],
    [{ version: '0.4.0', 'extra-params': {} }, "must have required property 'tee'"],
    [{ version: '0.4.0', tee: 'tpm2', 'extra-params': {} }, '/tee must be one of'],
    [{ version: '0.4.0', tee: 7, 'extra-params': {} }, '/tee must be one of'],
    [{ version: '0.4.0', tee: 'tpm' }, "must have required property 'extra-params'"],
    [{ version: '0.4.0', tee: 'tpm', 'extra-params': {}, extra: 1 }, '/extra is not a known key'],
    [[], '/ must be object'],
    [null, '/ must be object'],
  ])('refuses %j naming the field', (doc, message) => {
    const m = refusal(() => decodeRequest(doc));
    expect(m).toMatch(/^Request is invalid: /);
    expect(m).toContain(message);
  });
});

describe('Challenge', () => {
  it('decodes nonce and extra-params', () => {
    expect(decodeChallenge({ nonce: 'abc', 'extra-params': { credential_blob: 'x' } }).nonce).toBe('abc');
  });
  it.each([
    [{ 'extra-params': {} }, "must have required property 'nonce'"],
    [{ nonce: 1, 'extra-params': {} }, '/nonce must be string'],
    [{ nonce: '', 'extra-params': {} }, '/nonce must NOT have fewer than 1 characters'],
    [{ nonce: 'n'.repeat(513), 'extra-params': {} }, '/nonce must NOT have more than 512 characters'],
    [{ nonce: 'a' }, "must have required property 'extra-params'"],
  ])('refuses %j', (doc, message) => {
    expect(refusal(() => decodeChallenge(doc))).toContain(message);
  });
});

describe('Attestation', () => {
  it('decodes EC P-256, EC P-384 and RSA tee-pubkeys, with and without init-data', () => {
    expect(decodeAttestation(attestation())['init-data']).toBeUndefined();
    const withInit = decodeAttestation(attestation({ 'init-data': { format: 'toml', body: 'version = "0.1.0"' } }));
    expect(withInit['init-data']?.format).toBe('toml');
    for (const key of [EC384.publicJwk, RSA.publicJwk])
      expect(decodeAttestation(attestation({ 'runtime-data': { nonce: 'n', 'tee-pubkey': key } }))['runtime-data']['tee-pubkey']).toEqual(
        key,
      );
  });

  const ec = EC.publicJwk as unknown as Record<string, string>;
  const rsa = RSA.publicJwk as unknown as Record<string, string>;
  const withKey = (key: unknown) => attestation({ 'runtime-data': { nonce: 'n', 'tee-pubkey': key } });
  it.each([
    [
      'no runtime-data',
      { 'tee-evidence': { primary_evidence: {}, additional_evidence: '' } },
      "must have required property 'runtime-data'",
    ],
    ['no tee-evidence', { 'runtime-data': { nonce: 'n', 'tee-pubkey': ec } }, "must have required property 'tee-evidence'"],
    ['an unknown top-level key', { ...attestation(), 'tee-pubkey': ec }, '/tee-pubkey is not a known key'],
    [
      'init-data format yaml',
      attestation({ 'init-data': { format: 'yaml', body: '' } }),
      '/init-data/format must be one of "json", "toml"',
    ],
    ['init-data without body', attestation({ 'init-data': { format: 'json' } }), "/init-data must have required property 'body'"],
    ['init-data body a number', attestation({ 'init-data': { format: 'json', body: 1 } }), '/init-data/body must be string'],
    [
      'init-data body oversize',
      attestation({ 'init-data': { format: 'json', body: 'x'.repeat(256 * 1024 + 1) } }),
      '/init-data/body must NOT have more than',
    ],
    ['nonce missing', attestation({ 'runtime-data': { 'tee-pubkey': ec } }), "/runtime-data must have required property 'nonce'"],
    ['nonce a number', attestation({ 'runtime-data': { nonce: 5, 'tee-pubkey': ec } }), '/runtime-data/nonce must be string'],
    ['tee-pubkey missing', attestation({ 'runtime-data': { nonce: 'n' } }), "/runtime-data must have required property 'tee-pubkey'"],
    ['EC alg RSA1_5', withKey({ ...ec, alg: 'RSA1_5' }), '/runtime-data/tee-pubkey/alg must be equal to constant'],
    ['EC curve P-521', withKey({ ...ec, crv: 'P-521' }), '/runtime-data/tee-pubkey/crv must be one of "P-256", "P-384"'],
    [
      'EC without y',
      withKey({ kty: 'EC', crv: 'P-256', alg: 'ECDH-ES+A256KW', x: ec.x }),
      "/runtime-data/tee-pubkey must have required property 'y'",
    ],
    ['EC x not base64url', withKey({ ...ec, x: `${'+'.repeat(43)}` }), '/runtime-data/tee-pubkey/x must match pattern'],
    ['EC with a private d', withKey({ ...ec, d: ec.x }), '/runtime-data/tee-pubkey/d is not a known key'],
    ['RSA alg RSA-OAEP', withKey({ ...rsa, alg: 'RSA-OAEP' }), '/runtime-data/tee-pubkey/alg must be equal to constant'],
    ['RSA n too short', withKey({ ...rsa, n: 'AQAB' }), '/runtime-data/tee-pubkey/n must NOT have fewer than 342 characters'],
    ['RSA without e', withKey({ kty: 'RSA', alg: 'RSA-OAEP-256', n: rsa.n }), "/runtime-data/tee-pubkey must have required property 'e'"],
    ['kty oct', withKey({ kty: 'oct', k: 'abc' }), '/runtime-data/tee-pubkey'],
    [
      'primary_evidence missing',
      attestation({ 'tee-evidence': { additional_evidence: '' } }),
      "/tee-evidence must have required property 'primary_evidence'",
    ],
    [
      'primary_evidence a number',
      attestation({ 'tee-evidence': { primary_evidence: 3, additional_evidence: '' } }),
      '/tee-evidence/primary_evidence must be object,string,array',
    ],
    [
      'additional_evidence an object',
      attestation({ 'tee-evidence': { primary_evidence: {}, additional_evidence: {} } }),
      '/tee-evidence/additional_evidence must be string',
    ],
    [
      'additional_evidence missing',
      attestation({ 'tee-evidence': { primary_evidence: {} } }),
      "/tee-evidence must have required property 'additional_evidence'",
    ],
  ])('refuses %s naming the field', (_what, doc, message) => {
    const m = refusal(() => decodeAttestation(doc));
    expect(m).toMatch(/^Attestation is invalid: /);
    expect(m).toContain(message);
  });

  it('keeps only the complaints of the key kind the kty names (no RSA noise about an EC key)', () => {
    const m = refusal(() => decodeAttestation(withKey({ ...ec, crv: 'P-521' })));
    expect(m).not.toContain('/n ');
    expect(m).not.toContain('must match exactly one schema');
  });

  it('refuses an EC point that is not on its curve, and an RSA modulus below 2048 bits', () => {
    // x and y swapped: well-formed base64url of the right length, not a point of P-256.
    const off = { ...ec, x: ec.y, y: ec.x };
    expect(refusal(() => decodeAttestation(withKey(off)))).toContain('/runtime-data/tee-pubkey is not a usable EC public key');
    const x384 = (EC384.publicJwk as unknown as Record<string, string>).x;
    expect(refusal(() => decodeAttestation(withKey({ ...ec, x: x384 })))).toContain('is not a usable EC public key');
  });
});

describe('AttestationToken and ErrorInformation', () => {
  it('decode, and refuse naming the field', () => {
    expect(decodeAttestationToken({ token: 'a.b.c' }).token).toBe('a.b.c');
    expect(refusal(() => decodeAttestationToken({ token: '' }))).toContain('/token must NOT have fewer than 1 characters');
    expect(refusal(() => decodeAttestationToken({}))).toContain("must have required property 'token'");
    expect(decodeErrorInformation({ type: KBS_ERROR_TYPES.policyDeny, detail: 'no' }).detail).toBe('no');
    expect(refusal(() => decodeErrorInformation({ type: 'x' }))).toContain("must have required property 'detail'");
    expect(refusal(() => decodeErrorInformation({ type: 1, detail: '' }))).toContain('/type must be string');
  });
  it("uses trustee's type URIs and cuts an overlong detail", () => {
    expect(KBS_ERROR_TYPES.attestation).toBe('https://github.com/confidential-containers/kbs/errors/AttestationError');
    expect(KBS_ERROR_TYPES.policyDeny).toBe('https://github.com/confidential-containers/kbs/errors/PolicyDeny');
    expect(KBS_ERROR_TYPES.invalidRequestPath).toBe('https://github.com/confidential-containers/kbs/errors/InvalidRequestPath');
    const info = errorInformation('internal', 'x'.repeat(10_000));
    expect(info.detail.length).toBe(4096);
    expect(decodeErrorInformation(info)).toEqual(info);
  });
});

describe('runtimeDataBytes', () => {
  const ecKey = { kty: 'EC', crv: 'P-256', alg: 'ECDH-ES+A256KW', x: 'X'.repeat(43), y: 'Y'.repeat(43) } as const;
  const rsaKey = { kty: 'RSA', alg: 'RSA-OAEP-256', n: 'N'.repeat(342), e: 'AQAB' } as const;

  it('is compact JSON with the contract key order for EC: nonce, tee-pubkey {kty, crv, alg, x, y}', () => {
    expect(runtimeDataBytes({ nonce: 'abc', 'tee-pubkey': ecKey }).toString()).toBe(
      `{"nonce":"abc","tee-pubkey":{"kty":"EC","crv":"P-256","alg":"ECDH-ES+A256KW","x":"${'X'.repeat(43)}","y":"${'Y'.repeat(43)}"}}`,
    );
  });
  it('and for RSA: {kty, n, alg, e}', () => {
    expect(runtimeDataBytes({ nonce: 'abc', 'tee-pubkey': rsaKey }).toString()).toBe(
      `{"nonce":"abc","tee-pubkey":{"kty":"RSA","n":"${'N'.repeat(342)}","alg":"RSA-OAEP-256","e":"AQAB"}}`,
    );
  });
  it('does not depend on the order the object was built or parsed in', () => {
    const shuffled = JSON.parse(
      `{"tee-pubkey":{"y":"${'Y'.repeat(43)}","x":"${'X'.repeat(43)}","alg":"ECDH-ES+A256KW","crv":"P-256","kty":"EC"},"nonce":"abc"}`,
    ) as KbsRuntimeData;
    expect(runtimeDataBytes(shuffled)).toEqual(runtimeDataBytes({ nonce: 'abc', 'tee-pubkey': ecKey }));
  });
  it('has a fixed digest (a change of format breaks every guest: this test says so)', () => {
    const digest = createHash('sha256')
      .update(runtimeDataBytes({ nonce: 'abc', 'tee-pubkey': ecKey }))
      .digest('hex');
    // Computed once from the documented byte string; the guest and the verifier both hash these bytes.
    expect(digest).toBe('2ec51fbafd647860fd9f86b9d496d3df47f7ae0374e74c33100074b17fd41715');
  });
  it('moves with the nonce and with every key member', () => {
    const base = runtimeDataBytes({ nonce: 'abc', 'tee-pubkey': ecKey });
    expect(runtimeDataBytes({ nonce: 'abd', 'tee-pubkey': ecKey })).not.toEqual(base);
    for (const k of ['x', 'y', 'crv'] as const)
      expect(runtimeDataBytes({ nonce: 'abc', 'tee-pubkey': { ...ecKey, [k]: k === 'crv' ? 'P-384' : 'Z'.repeat(43) } })).not.toEqual(base);
  });
});
