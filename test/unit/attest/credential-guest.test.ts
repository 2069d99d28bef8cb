/**
 * The guest's side of credential activation (guest/agent/tpm.ts), without a TPM: the commands
 * byte for byte against Part 3's layouts and the TCG EK template, and the client against a
 * scripted TPM that answers each command code as the test says, to reach the paths a healthy
 * swtpm never takes (a key whose name does not match its public area, a short nonce, a TPM in
 * failure mode, NV answers shorter than asked) and to see that every object and session made is
 * flushed on each of them. The same client runs against a real swtpm in
 * test/integration/attest/credential.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  activateCredentialCommand,
  EK_RSA_CERT_NV_INDEX,
  ekTemplate,
  getPropertyCommand,
  nvReadCommand,
  nvReadPublicCommand,
  policySecretCommand,
  startPolicySessionCommand,
  TPM_CC_ACTIVATE_CREDENTIAL,
  TPM_CC_CREATE_PRIMARY,
  TPM_CC_FLUSH_CONTEXT,
  TPM_CC_GET_CAPABILITY,
  TPM_CC_NV_READ,
  TPM_CC_NV_READ_PUBLIC,
  TPM_CC_PCR_READ,
  TPM_CC_POLICY_SECRET,
  TPM_CC_START_AUTH_SESSION,
  TPM_RH_OWNER,
  TpmClient,
  type TpmTransport,
} from '../../../guest/agent/tpm.js';
import { objectName } from '../../../src/attest/credential.js';
import { rejection } from '../../helpers/kata-error.js';

const PW_SESSION = '00000009' + '40000009' + '0000' + '01' + '0000';
const EK_POLICY = '837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa';
const AK_PUBLIC = Buffer.from(
  JSON.parse(readFileSync(path.join(import.meta.dirname, '..', '..', 'fixtures', 'measure', 'tpm-quote-swtpm.json'), 'utf8'))
    .akPublic as string,
  'hex',
);
const AK_HANDLE = 0x80000000;
const EK_HANDLE = 0x80000001;
const SESSION_HANDLE = 0x03000000;

const hex = (b: Buffer) => b.toString('hex');
const u16 = (n: number) => Buffer.from([n >> 8, n & 0xff]);
const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
};
const sized = (b: Buffer) => Buffer.concat([u16(b.length), b]);

/** A response: tag, size, code, handles, then (sessions) parameterSize, parameters and one empty session. */
function response(o: { code?: number; handles?: number[]; params?: Buffer; sessions?: boolean }): Buffer {
  const params = o.params ?? Buffer.alloc(0);
  const body =
    o.code !== undefined && o.code !== 0
      ? Buffer.alloc(0)
      : Buffer.concat([
          ...(o.handles ?? []).map(u32),
          ...(o.sessions ? [u32(params.length), params, Buffer.from('0000010000', 'hex')] : [params]),
        ]);
  return Buffer.concat([u16(o.sessions ? 0x8002 : 0x8001), u32(10 + body.length), u32(o.code ?? 0), body]);
}

/** CreatePrimary's answer for `pub`: outPublic, empty creation data and hash, a ticket, and `name`. */
function created(handle: number, pub: Buffer, name = objectName(pub)): Buffer {
  const params = Buffer.concat([
    sized(pub),
    sized(Buffer.alloc(0)),
    sized(Buffer.alloc(0)),
    u16(0x8021),
    u32(0x4000000b),
    sized(Buffer.alloc(0)),
    sized(name),
  ]);
  return response({ handles: [handle], params, sessions: true });
}

/** An EK public area as the TPM returns it: the template with a modulus in `unique`. */
function ekPublicArea(): Buffer {
  const t = ekTemplate();
  return Buffer.concat([t.subarray(0, t.length - 258), sized(randomBytes(256))]);
}

type Answer = (cmd: Buffer) => Buffer;

/** A TPM that answers by command code; records what it was sent. */
function scripted(answers: Partial<Record<number, Answer>>) {
  const sent: Buffer[] = [];
  const transport: TpmTransport = {
    send: async (cmd) => {
      sent.push(cmd);
      const code = cmd.readUInt32BE(6);
      const a = answers[code];
      if (a === undefined) throw new Error(`the scripted TPM has no answer for command 0x${code.toString(16)}`);
      return a(cmd);
    },
    close: async () => {},
  };
  const codes = () => sent.map((c) => c.readUInt32BE(6));
  const flushed = () => sent.filter((c) => c.readUInt32BE(6) === TPM_CC_FLUSH_CONTEXT).map((c) => c.readUInt32BE(10));
  return { client: new TpmClient(transport), sent, codes, flushed };
}

/** A TPM that makes the AK then the EK (by hierarchy and template type), and answers the rest as `rest` says. */
function activationTpm(rest: Partial<Record<number, Answer>>, ek: Answer = () => created(EK_HANDLE, ekPublicArea())) {
  return scripted({
    [TPM_CC_CREATE_PRIMARY]: (cmd) => (cmd.readUInt16BE(10 + 4 + 4 + 9 + 2 + 4 + 2) === 0x0001 ? ek(cmd) : created(AK_HANDLE, AK_PUBLIC)),
    [TPM_CC_START_AUTH_SESSION]: () => response({ handles: [SESSION_HANDLE], params: sized(randomBytes(32)) }),
    [TPM_CC_POLICY_SECRET]: () =>
      response({ params: Buffer.concat([sized(Buffer.alloc(0)), u16(0x8025), u32(0x4000000b), sized(Buffer.alloc(0))]), sessions: true }),
    [TPM_CC_FLUSH_CONTEXT]: () => response({}),
    [TPM_CC_PCR_READ]: () =>
      response({ params: Buffer.concat([u32(1), u32(1), u16(0x000b), Buffer.from([3, 1, 0, 0]), u32(1), sized(Buffer.alloc(32))]) }),
    ...rest,
  });
}

const blob = Buffer.concat([u16(68), u16(32), randomBytes(32), randomBytes(34)]);
const secret = Buffer.concat([u16(256), randomBytes(256)]);

describe('credential activation commands', () => {
  it('the EK template is the TCG default RSA 2048 one (L-1)', () => {
    expect(hex(ekTemplate())).toBe(
      `0001000b000300b2` + `0020${EK_POLICY}` + '000600800043' + '0010' + '0800' + '00000000' + `0100${'00'.repeat(256)}`,
    );
  });
  it('StartAuthSession: no sessions, tpmKey and bind null, the caller nonce, no salt, a policy session, no symmetric, sha256', () => {
    const n = Buffer.alloc(32, 0x11);
    expect(hex(startPolicySessionCommand(n))).toBe(
      `8001${u32(10 + 8 + 34 + 2 + 1 + 2 + 2).toString('hex')}00000176` +
        '4000000740000007' +
        `0020${hex(n)}` +
        '0000' +
        '01' +
        '0010' +
        '000b',
    );
  });
  it('PolicySecret: the endorsement hierarchy with the password session, the policy session, four empty parameters', () => {
    expect(hex(policySecretCommand(SESSION_HANDLE)).slice(20)).toBe(
      `4000000b03000000${PW_SESSION}` + '0000' + '0000' + '0000' + '00000000',
    );
  });
  it('ActivateCredential: AK then EK, the password session then the policy session, the two TPM2Bs as given', () => {
    const cmd = activateCredentialCommand(AK_HANDLE, EK_HANDLE, SESSION_HANDLE, blob, secret);
    expect(cmd.readUInt16BE(0)).toBe(0x8002);
    expect(cmd.readUInt32BE(2)).toBe(cmd.length);
    expect(cmd.readUInt32BE(6)).toBe(TPM_CC_ACTIVATE_CREDENTIAL);
    const auth = `00000012${PW_SESSION.slice(8)}03000000` + '0000' + '01' + '0000';
    expect(hex(cmd).slice(20)).toBe(`8000000080000001${auth}${hex(blob)}${hex(secret)}`);
  });
  it('NV_ReadPublic, NV_Read (index authorizing itself) and GetCapability(TPM_PT_NV_BUFFER_MAX)', () => {
    expect(hex(nvReadPublicCommand(EK_RSA_CERT_NV_INDEX))).toBe('80010000000e0000016901c00002');
    expect(hex(nvReadCommand(EK_RSA_CERT_NV_INDEX, EK_RSA_CERT_NV_INDEX, 1024, 2048)).slice(20)).toBe(
      `01c0000201c00002${PW_SESSION}04000800`,
    );
    expect(hex(getPropertyCommand(0x12c))).toBe('8001000000160000017a' + '00000006' + '0000012c' + '00000001');
  });
});

describe('activateCredential against a scripted TPM', () => {
  it('returns the secret and flushes the session, the EK and the AK', async () => {
    const t = activationTpm({ [TPM_CC_ACTIVATE_CREDENTIAL]: () => response({ params: sized(Buffer.from('the secret')), sessions: true }) });
    expect((await t.client.activateCredential(blob, secret)).toString()).toBe('the secret');
    expect(t.codes()).toEqual([
      TPM_CC_CREATE_PRIMARY,
      TPM_CC_CREATE_PRIMARY,
      TPM_CC_START_AUTH_SESSION,
      TPM_CC_POLICY_SECRET,
      TPM_CC_ACTIVATE_CREDENTIAL,
      TPM_CC_FLUSH_CONTEXT,
      TPM_CC_FLUSH_CONTEXT,
      TPM_CC_FLUSH_CONTEXT,
    ]);
    expect(t.flushed()).toEqual([SESSION_HANDLE, EK_HANDLE, AK_HANDLE]);
    // The AK is made under the hierarchy asked for (the one the quote uses).
    const owner = activationTpm({ [TPM_CC_ACTIVATE_CREDENTIAL]: () => response({ params: sized(Buffer.from('x')), sessions: true }) });
    await owner.client.activateCredential(blob, secret, TPM_RH_OWNER);
    expect(owner.sent[0]?.readUInt32BE(10)).toBe(TPM_RH_OWNER);
    expect(owner.sent[1]?.readUInt32BE(10)).toBe(0x4000000b);
  });

  it('an integrity failure on the blob is TPM_CREDENTIAL_REFUSED, with everything flushed', async () => {
    const t = activationTpm({ [TPM_CC_ACTIVATE_CREDENTIAL]: () => response({ code: 0x1df }) });
    const err = await rejection(t.client.activateCredential(blob, secret));
    expect(err.reason).toBe('TPM_CREDENTIAL_REFUSED');
    expect(err.message).toMatch(/TPM_RC_INTEGRITY on the credential blob/);
    expect(t.flushed()).toEqual([SESSION_HANDLE, EK_HANDLE, AK_HANDLE]);
  });

  it('TPM_RC_FAILURE is a refused seed only while the TPM still answers; a TPM in failure mode is a failed command', async () => {
    const refused = activationTpm({ [TPM_CC_ACTIVATE_CREDENTIAL]: () => response({ code: 0x101 }) });
    expect((await rejection(refused.client.activateCredential(blob, secret))).reason).toBe('TPM_CREDENTIAL_REFUSED');
    const broken = activationTpm({
      [TPM_CC_ACTIVATE_CREDENTIAL]: () => response({ code: 0x101 }),
      [TPM_CC_PCR_READ]: () => response({ code: 0x101 }),
    });
    const err = await rejection(broken.client.activateCredential(blob, secret));
    expect(err.reason).toBe('TPM_COMMAND_FAILED');
    expect(broken.flushed()).toEqual([SESSION_HANDLE, EK_HANDLE, AK_HANDLE]);
  });

  it('an EK that cannot be made leaves the AK flushed and starts no session', async () => {
    const t = activationTpm({}, () => response({ code: 0x902 }));
    expect((await rejection(t.client.activateCredential(blob, secret))).reason).toBe('TPM_COMMAND_FAILED');
    expect(t.codes()).not.toContain(TPM_CC_START_AUTH_SESSION);
    expect(t.flushed()).toEqual([AK_HANDLE]);
  });

  it('a key whose returned name is not its public area is malformed; both keys are flushed', async () => {
    const t = activationTpm({}, () => created(EK_HANDLE, ekPublicArea(), objectName(AK_PUBLIC)));
    const err = await rejection(t.client.activateCredential(blob, secret));
    expect(err.reason).toBe('TPM_RESPONSE_MALFORMED');
    expect(err.message).toMatch(/name returned is not the hash/);
    expect(t.flushed()).toEqual([EK_HANDLE, AK_HANDLE]);
  });

  it('a session nonce of the wrong size is malformed; the session is flushed with the keys', async () => {
    const t = activationTpm({ [TPM_CC_START_AUTH_SESSION]: () => response({ handles: [SESSION_HANDLE], params: sized(randomBytes(8)) }) });
    expect((await rejection(t.client.activateCredential(blob, secret))).reason).toBe('TPM_RESPONSE_MALFORMED');
    expect(t.flushed()).toEqual([SESSION_HANDLE, EK_HANDLE, AK_HANDLE]);
  });

  it('a blob or secret that is not one TPM2B is refused before anything is sent', async () => {
    const t = activationTpm({});
    for (const [b, s, field] of [
      [blob.subarray(0, 10), secret, 'credentialBlob'],
      [Buffer.concat([u16(200), randomBytes(200)]), secret, 'credentialBlob'],
      [blob, Buffer.concat([secret, Buffer.alloc(1)]), 'encryptedSecret'],
      [blob, Buffer.alloc(0), 'encryptedSecret'],
    ] as const) {
      const err = await rejection(t.client.activateCredential(b, s));
      expect(err.reason).toBe('TPM_REQUEST_INVALID');
      expect(err.details?.field).toBe(field);
    }
    expect(t.sent).toEqual([]);
  });
});

describe('ekCertificate against a scripted TPM', () => {
  const der = Buffer.concat([Buffer.from([0x30, 0x82, 0x05, 0x00]), randomBytes(0x500)]);
  /** NV_ReadPublic's answer: TPMS_NV_PUBLIC for `index`, then its name. */
  const nvPublic = (index: number, attributes: number, dataSize: number) =>
    response({
      params: Buffer.concat([
        sized(Buffer.concat([u32(index), u16(0x000b), u32(attributes), sized(Buffer.alloc(0)), u16(dataSize)])),
        sized(randomBytes(34)),
      ]),
    });
  const bufferMax = (n: number) => response({ params: Buffer.concat([Buffer.from([0]), u32(6), u32(1), u32(0x12c), u32(n)]) });
  const AUTHREAD_WRITTEN = 0x00040000 | 0x20000000;
  const stored = Buffer.concat([der, Buffer.alloc(1500 - der.length, 0xff)]);
  const nvRead =
    (data: Buffer, cut = 0) =>
    (cmd: Buffer) => {
      const size = cmd.readUInt16BE(cmd.length - 4);
      const offset = cmd.readUInt16BE(cmd.length - 2);
      return response({ params: sized(data.subarray(offset, offset + size - cut)), sessions: true });
    };

  it('reads the index in chunks of the NV buffer (capped at 1 KiB) and drops the padding after the DER', async () => {
    const t = scripted({
      [TPM_CC_NV_READ_PUBLIC]: () => nvPublic(EK_RSA_CERT_NV_INDEX, AUTHREAD_WRITTEN, 1500),
      [TPM_CC_GET_CAPABILITY]: () => bufferMax(2048),
      [TPM_CC_NV_READ]: nvRead(stored),
    });
    expect(await t.client.ekCertificate()).toEqual(der);
    const reads = t.sent.filter((c) => c.readUInt32BE(6) === TPM_CC_NV_READ);
    expect(reads.map((c) => [c.readUInt32BE(10), c.readUInt16BE(c.length - 4), c.readUInt16BE(c.length - 2)])).toEqual([
      [EK_RSA_CERT_NV_INDEX, 1024, 0],
      [EK_RSA_CERT_NV_INDEX, 476, 1024],
    ]);
  });

  it("authorizes with the owner when only the owner may read, in the TPM's smaller chunks", async () => {
    const t = scripted({
      [TPM_CC_NV_READ_PUBLIC]: () => nvPublic(EK_RSA_CERT_NV_INDEX, 0x00020000 | 0x20000000, der.length),
      [TPM_CC_GET_CAPABILITY]: () => bufferMax(512),
      [TPM_CC_NV_READ]: nvRead(der),
    });
    expect(await t.client.ekCertificate()).toEqual(der);
    const reads = t.sent.filter((c) => c.readUInt32BE(6) === TPM_CC_NV_READ);
    expect(reads.length).toBe(Math.ceil(der.length / 512));
    expect(reads.every((c) => c.readUInt32BE(10) === TPM_RH_OWNER)).toBe(true);
  });

  it('refuses an index that is another one, unwritten, too large, short-read or not DER', async () => {
    const cases: Array<[Partial<Record<number, Answer>>, string, RegExp]> = [
      [
        { [TPM_CC_NV_READ_PUBLIC]: () => nvPublic(0x01c0000a, AUTHREAD_WRITTEN, 1500) },
        'TPM_RESPONSE_MALFORMED',
        /described index 0x1c0000a/,
      ],
      [{ [TPM_CC_NV_READ_PUBLIC]: () => nvPublic(EK_RSA_CERT_NV_INDEX, 0x00040000, 1500) }, 'TPM_UNAVAILABLE', /never written/],
      [
        { [TPM_CC_NV_READ_PUBLIC]: () => nvPublic(EK_RSA_CERT_NV_INDEX, AUTHREAD_WRITTEN, 20_000) },
        'TPM_RESPONSE_MALFORMED',
        /holds 20000 bytes/,
      ],
      [{ [TPM_CC_NV_READ]: nvRead(stored, 1) }, 'TPM_RESPONSE_MALFORMED', /asked for 1024 bytes at 0, got 1023/],
      [{ [TPM_CC_NV_READ]: nvRead(Buffer.alloc(1500, 0xff)) }, 'TPM_RESPONSE_MALFORMED', /does not hold a DER certificate/],
    ];
    for (const [answers, reason, message] of cases) {
      const t = scripted({
        [TPM_CC_NV_READ_PUBLIC]: () => nvPublic(EK_RSA_CERT_NV_INDEX, AUTHREAD_WRITTEN, 1500),
        [TPM_CC_GET_CAPABILITY]: () => bufferMax(2048),
        [TPM_CC_NV_READ]: nvRead(stored),
        ...answers,
      });
      const err = await rejection(t.client.ekCertificate());
      expect(err.reason, err.message).toBe(reason);
      expect(err.message).toMatch(message);
    }
  });
});
