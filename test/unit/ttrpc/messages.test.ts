import { Buffer } from 'node:buffer';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeRequest, decodeResponse, encodeRequest, encodeResponse } from '../../../src/ttrpc/messages.js';
import { thrown } from '../../helpers/kata-error.js';

/** A protobuf length-delimited field (wire type 2), short lengths only. */
function lenField(fieldNumber: number, bytes: Buffer | string): Buffer {
  const body = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
  return Buffer.concat([Buffer.from([(fieldNumber << 3) | 2, body.length]), body]);
}

describe('ttrpc Request', () => {
  it('encodes service 1, method 2, payload 3, timeout_nano 4 (varint), metadata 5 (key 1, value 2)', () => {
    const bytes = encodeRequest({
      service: 'svc',
      method: 'M',
      payload: Buffer.from([0xaa, 0xbb]),
      timeoutNs: 300,
      metadata: [{ key: 'k', value: 'v' }],
    });
    const expected = Buffer.concat([
      lenField(1, 'svc'),
      lenField(2, 'M'),
      lenField(3, Buffer.from([0xaa, 0xbb])),
      Buffer.from([(4 << 3) | 0, 0xac, 0x02]), // 300 as a varint
      lenField(5, Buffer.concat([lenField(1, 'k'), lenField(2, 'v')])),
    ]);
    expect(bytes.toString('hex')).toBe(expected.toString('hex'));
  });

  it('decodes hand-built bytes, absent fields as their defaults', () => {
    const bytes = Buffer.concat([lenField(1, 'containerd.services.events.ttrpc.v1.Events'), lenField(2, 'Forward')]);
    expect(decodeRequest(bytes)).toEqual({
      service: 'containerd.services.events.ttrpc.v1.Events',
      method: 'Forward',
      payload: Buffer.alloc(0),
      timeoutNs: 0,
      metadata: [],
    });
  });

  it('decodes a negative timeout_nano (a deadline already passed) as negative', () => {
    const bytes = encodeRequest({ service: 's', method: 'm', payload: Buffer.alloc(0), timeoutNs: -5, metadata: [] });
    expect(decodeRequest(bytes).timeoutNs).toBe(-5);
  });

  it('refuses bytes that are no Request as INVALID_ARGUMENT', () => {
    const err = thrown(() => decodeRequest(Buffer.from([0x1a, 0x05, 0x01])));
    expect([err.kind, err.reason]).toEqual(['invalid', 'TTRPC_BAD_REQUEST']);
  });

  it('round-trips any request (property)', () => {
    fc.assert(
      fc.property(
        fc.string(),
        fc.string(),
        fc.uint8Array({ maxLength: 200 }),
        fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
        fc.array(fc.record({ key: fc.string(), value: fc.string() }), { maxLength: 4 }),
        (service, method, payload, timeoutNs, metadata) => {
          const request = { service, method, payload: Buffer.from(payload), timeoutNs, metadata };
          expect(decodeRequest(encodeRequest(request))).toEqual(request);
        },
      ),
    );
  });
});

describe('ttrpc Response', () => {
  it('encodes status 1 (google.rpc.Status: code 1, message 2) and payload 2', () => {
    const bytes = encodeResponse({ status: { code: 12, message: 'no' }, payload: Buffer.from('p') });
    const status = Buffer.concat([Buffer.from([(1 << 3) | 0, 12]), lenField(2, 'no')]);
    expect(bytes.toString('hex')).toBe(Buffer.concat([lenField(1, status), lenField(2, 'p')]).toString('hex'));
  });

  it('reads a response without a status as OK, as containerd does', () => {
    expect(decodeResponse(lenField(2, 'x'))).toEqual({ status: { code: 0, message: '' }, payload: Buffer.from('x') });
  });

  it('skips status details it does not use', () => {
    const any = lenField(3, Buffer.concat([lenField(1, 'type.googleapis.com/x'), lenField(2, 'y')]));
    const status = Buffer.concat([Buffer.from([0x08, 5]), lenField(2, 'gone'), any]);
    expect(decodeResponse(lenField(1, status)).status).toEqual({ code: 5, message: 'gone' });
  });

  it('refuses bytes that are no Response as INVALID_ARGUMENT', () => {
    const err = thrown(() => decodeResponse(Buffer.from([0x0a, 0x05, 0x08])));
    expect([err.kind, err.reason]).toEqual(['invalid', 'TTRPC_BAD_RESPONSE']);
  });

  it('round-trips any response (property)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 16 }), fc.string(), fc.uint8Array({ maxLength: 200 }), (code, message, payload) => {
        const response = { status: { code, message }, payload: Buffer.from(payload) };
        expect(decodeResponse(encodeResponse(response))).toEqual(response);
      }),
    );
  });
});
