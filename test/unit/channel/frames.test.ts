import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { encodeFrame, encodeHello, FrameDecoder, FrameType, MAX_FRAME_PAYLOAD_BYTES } from '../../../src/channel/frames.js';

const hello = encodeHello(FrameType.HELLO, { version: 1, initialWindowBytes: 1024, maxStreams: 4, nonce: Buffer.alloc(16, 7) });

describe('FrameDecoder', () => {
  it('discards garbage before the marker and reads frames split at every byte', () => {
    const wire = Buffer.concat([Buffer.from('stale tail of an old session'), hello, encodeFrame(FrameType.DATA, 3, Buffer.from('abc'))]);
    const d = new FrameDecoder();
    const events = [...wire].flatMap((byte) => d.push(Buffer.from([byte])));
    expect(events.map((e) => e.kind)).toEqual(['sync', 'frame', 'frame']);
    const data = events[2];
    expect(data?.kind === 'frame' && data.frame.payload.toString()).toBe('abc');
    expect(d.discardedBytes).toBe(28);
  });

  it('goes back to hunting on a header that is not a frame and recovers at the next marker', () => {
    const d = new FrameDecoder();
    const bad = Buffer.alloc(9);
    bad.writeUInt8(FrameType.DATA, 0);
    bad.writeUInt32BE(MAX_FRAME_PAYLOAD_BYTES + 1, 5);
    const events = d.push(Buffer.concat([hello, bad, Buffer.from([0x42, 0x00]), hello]));
    expect(events.map((e) => e.kind)).toEqual(['sync', 'frame', 'desync', 'sync', 'frame']);
  });

  it('treats a marker at a frame boundary as a new session', () => {
    const d = new FrameDecoder();
    const events = d.push(Buffer.concat([hello, encodeFrame(FrameType.END, 1), hello]));
    expect(events.map((e) => e.kind)).toEqual(['sync', 'frame', 'frame', 'sync', 'frame']);
  });

  it('refuses to build an oversized frame', () => {
    expect(() => encodeFrame(FrameType.DATA, 1, Buffer.alloc(MAX_FRAME_PAYLOAD_BYTES + 1))).toThrow(RangeError);
  });
});
