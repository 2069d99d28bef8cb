import { Buffer } from 'node:buffer';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  decodeHeader,
  encodeFrame,
  encodeHeader,
  type Frame,
  FrameReader,
  HEADER_BYTES,
  MAX_DATA_BYTES,
  MessageType,
  type ReaderEvent,
} from '../../../src/ttrpc/frames.js';

/** Frames out of events, failing on anything else. */
function framesOf(events: ReaderEvent[]): Frame[] {
  return events.map((e) => {
    if (e.kind !== 'frame') throw new Error(`expected a frame, got ${e.kind}`);
    return e.frame;
  });
}

describe('ttrpc frame header', () => {
  it('is 10 bytes: length and stream id big endian, then type and flags', () => {
    const bytes = encodeHeader({ dataBytes: 0x01020304, streamId: 0x0a0b0c0d, type: 0x02, flags: 0x05 });
    expect([...bytes]).toEqual([0x01, 0x02, 0x03, 0x04, 0x0a, 0x0b, 0x0c, 0x0d, 0x02, 0x05]);
    expect(HEADER_BYTES).toBe(10);
  });

  it('decodes hand-built bytes field by field', () => {
    const bytes = Buffer.from([0x00, 0x00, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0x03, 0x05]);
    expect(decodeHeader(bytes)).toEqual({ dataBytes: 256, streamId: 0xffffffff, type: MessageType.DATA, flags: 0x05 });
  });

  it('a frame is its header followed by its data', () => {
    const frame = encodeFrame(7, MessageType.REQUEST, 0, Buffer.from('abc'));
    expect([...frame]).toEqual([0, 0, 0, 3, 0, 0, 0, 7, 1, 0, 0x61, 0x62, 0x63]);
    expect([...encodeFrame(1, MessageType.RESPONSE, 0)]).toEqual([0, 0, 0, 0, 0, 0, 0, 1, 2, 0]);
  });

  it('refuses to encode data over 4 MiB, and takes exactly 4 MiB', () => {
    expect(MAX_DATA_BYTES).toBe(4 * 1024 * 1024);
    expect(() => encodeFrame(1, MessageType.REQUEST, 0, Buffer.alloc(MAX_DATA_BYTES + 1))).toThrow(RangeError);
    expect(encodeFrame(1, MessageType.REQUEST, 0, Buffer.alloc(MAX_DATA_BYTES)).length).toBe(MAX_DATA_BYTES + HEADER_BYTES);
  });
});

describe('FrameReader', () => {
  it('reads a frame split across many chunks, one byte at a time', () => {
    const bytes = encodeFrame(9, MessageType.RESPONSE, 0, Buffer.from('hello, ttrpc'));
    const reader = new FrameReader();
    const events: ReaderEvent[] = [];
    for (const byte of bytes) events.push(...reader.push(Buffer.from([byte])));
    expect(framesOf(events)).toEqual([{ streamId: 9, type: MessageType.RESPONSE, flags: 0, data: Buffer.from('hello, ttrpc') }]);
    expect(reader.bufferedBytes).toBe(0);
  });

  it('reads many frames from one chunk, empty ones included, and keeps a trailing partial one', () => {
    const chunk = Buffer.concat([
      encodeFrame(1, MessageType.REQUEST, 0, Buffer.from('a')),
      encodeFrame(3, MessageType.REQUEST, 0),
      encodeFrame(5, MessageType.DATA, 0x5, Buffer.from('ccc')),
      encodeFrame(7, MessageType.REQUEST, 0, Buffer.from('dddd')).subarray(0, 12),
    ]);
    const reader = new FrameReader();
    const frames = framesOf(reader.push(chunk));
    expect(frames.map((f) => [f.streamId, f.type, f.flags, f.data.toString()])).toEqual([
      [1, 1, 0, 'a'],
      [3, 1, 0, ''],
      [5, 3, 5, 'ccc'],
    ]);
    expect(reader.bufferedBytes).toBe(12);
    expect(framesOf(reader.push(Buffer.from('dd'))).map((f) => [f.streamId, f.data.toString()])).toEqual([[7, 'dddd']]);
  });

  it('accepts a frame of exactly 4 MiB', () => {
    const data = Buffer.alloc(MAX_DATA_BYTES, 0x5a);
    const frames = framesOf(new FrameReader().push(encodeFrame(11, MessageType.REQUEST, 0, data)));
    expect(frames).toHaveLength(1);
    expect(frames[0]!.data.equals(data)).toBe(true);
  });

  it('refuses a frame one byte over 4 MiB without holding it, then reads the next frame', () => {
    const reader = new FrameReader();
    const header = encodeHeader({ dataBytes: MAX_DATA_BYTES + 1, streamId: 13, type: MessageType.REQUEST, flags: 0 });
    expect(reader.push(header)).toEqual([]);
    // The oversized data arrives in slices; none of it is buffered.
    const slice = Buffer.alloc(1024 * 1024);
    for (let i = 0; i < 4; i++) {
      expect(reader.push(slice)).toEqual([]);
      expect(reader.bufferedBytes).toBe(HEADER_BYTES);
    }
    const events = reader.push(Buffer.concat([Buffer.alloc(1), encodeFrame(15, MessageType.REQUEST, 0, Buffer.from('next'))]));
    expect(events).toEqual([
      { kind: 'oversize', header: { dataBytes: MAX_DATA_BYTES + 1, streamId: 13, type: MessageType.REQUEST, flags: 0 } },
      { kind: 'frame', frame: { streamId: 15, type: MessageType.REQUEST, flags: 0, data: Buffer.from('next') } },
    ]);
  });

  it('round-trips any frames, however the bytes are cut into chunks (property)', () => {
    const frameArb = fc.record({
      streamId: fc.integer({ min: 0, max: 0xffffffff }),
      type: fc.integer({ min: 0, max: 255 }),
      flags: fc.integer({ min: 0, max: 255 }),
      data: fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)),
    });
    fc.assert(
      fc.property(fc.array(frameArb, { maxLength: 8 }), fc.array(fc.integer({ min: 1, max: 64 }), { minLength: 1 }), (frames, cuts) => {
        const bytes = Buffer.concat(frames.map((f) => encodeFrame(f.streamId, f.type, f.flags, f.data)));
        const reader = new FrameReader();
        const events: ReaderEvent[] = [];
        let at = 0;
        for (let i = 0; at < bytes.length; i++) {
          const size = cuts[i % cuts.length]!;
          events.push(...reader.push(bytes.subarray(at, at + size)));
          at += size;
        }
        expect(framesOf(events)).toEqual(frames);
        expect(reader.bufferedBytes).toBe(0);
      }),
    );
  });
});
