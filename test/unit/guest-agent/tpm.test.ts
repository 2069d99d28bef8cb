/**
 * The guest's TPM 2.0 marshalling, byte for byte against the layouts of the TPM 2.0 Library
 * (Part 3 commands, Part 2 structures), and its parsing of short or failing responses. The same
 * code runs against a real swtpm in test/integration/measure/tpm-quote.test.ts.
 */
import { describe, expect, it } from 'vitest';
import {
  akTemplate,
  createPrimaryCommand,
  flushContextCommand,
  parseResponseHeader,
  pcrExtendCommand,
  pcrReadCommand,
  quoteCommand,
  TpmClient,
  type TpmTransport,
} from '../../../guest/agent/tpm.js';
import { thrown } from '../../helpers/kata-error.js';

const PW_SESSION = '00000009' + '40000009' + '0000' + '01' + '0000';

describe('TPM2 commands', () => {
  it('PCR_Extend: sessions tag, size, code 0x182, the PCR handle, a password session, one sha256 digest', () => {
    const d = Buffer.alloc(32, 0xab);
    expect(pcrExtendCommand(8, d).toString('hex')).toBe(
      `8002${(10 + 4 + 13 + 4 + 2 + 32).toString(16).padStart(8, '0')}00000182` +
        `00000008${PW_SESSION}` +
        `00000001000b${'ab'.repeat(32)}`,
    );
  });
  it('PCR_Read: no sessions, one sha256 selection bitmap of three bytes', () => {
    expect(pcrReadCommand([0, 8, 9, 23]).toString('hex')).toBe('8001' + '00000014' + '0000017e' + '00000001000b03' + '010380');
  });
  it('CreatePrimary: the endorsement hierarchy, an empty sensitive area, the AK template', () => {
    const t = akTemplate().toString('hex');
    // ECC, sha256, attributes 0x00050472, no policy, no symmetric, ECDSA sha256, P-256, no kdf, empty point.
    expect(t).toBe('0023000b00050472' + '0000' + '0010' + '0018000b' + '0003' + '0010' + '0000' + '0000');
    const cmd = createPrimaryCommand(0x4000000b).toString('hex');
    expect(cmd.slice(0, 20)).toBe(`8002${(cmd.length / 2).toString(16).padStart(8, '0')}00000131`);
    expect(cmd.slice(20)).toBe(`4000000b${PW_SESSION}000400000000${(t.length / 2).toString(16).padStart(4, '0')}${t}000000000000`);
  });
  it('Quote: the key handle, the nonce, the key scheme (NULL), the selection', () => {
    const cmd = quoteCommand(0x80000000, Buffer.from('nonce'), [8]).toString('hex');
    expect(cmd.slice(20)).toBe(`80000000${PW_SESSION}0005${Buffer.from('nonce').toString('hex')}001000000001000b03000100`);
  });
  it('FlushContext: the handle as its only parameter', () => {
    expect(flushContextCommand(0x80000001).toString('hex')).toBe('80010000000e0000016580000001');
  });
  it('refuses bad input before anything is sent', () => {
    expect(thrown(() => pcrExtendCommand(8, Buffer.alloc(20))).reason).toBe('TPM_REQUEST_INVALID');
    expect(thrown(() => pcrExtendCommand(24, Buffer.alloc(32))).reason).toBe('TPM_REQUEST_INVALID');
    expect(thrown(() => quoteCommand(0x80000000, Buffer.alloc(65), [8])).reason).toBe('TPM_REQUEST_INVALID');
    expect(thrown(() => pcrReadCommand([-1])).reason).toBe('TPM_REQUEST_INVALID');
  });
});

describe('TPM2 responses', () => {
  const answering = (response: Buffer): TpmTransport => ({ send: async () => response, close: async () => {} });
  it('a size that disagrees with the bytes is malformed', () => {
    expect(thrown(() => parseResponseHeader(Buffer.from('80010000000f00000000', 'hex'), 'x')).reason).toBe('TPM_RESPONSE_MALFORMED');
  });
  it('an error code is a coded failure carrying the code', async () => {
    const c = new TpmClient(answering(Buffer.from('80010000000a00000922', 'hex')));
    const err = await c.pcrExtend(8, Buffer.alloc(32)).then(
      () => null,
      (e: unknown) => e as { reason: string; message: string },
    );
    expect(err?.reason).toBe('TPM_COMMAND_FAILED');
    expect(err?.message).toMatch(/answered 0x922/);
  });
  it('a PCR_Read answer cut short is malformed, not read past its end', async () => {
    const c = new TpmClient(answering(Buffer.from('8001000000120000000000000001000000', 'hex')));
    const err = await c.pcrRead([8]).then(
      () => null,
      (e: unknown) => e as { reason: string },
    );
    expect(err?.reason).toBe('TPM_RESPONSE_MALFORMED');
  });
});
