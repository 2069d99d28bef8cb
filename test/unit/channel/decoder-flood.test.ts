import { Buffer } from 'node:buffer';
import { randomFillSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { FrameDecoder, FrameType, HEADER_BYTES, MAGIC, MAX_FRAME_PAYLOAD_BYTES } from '../../../src/channel/frames.js';

/** What the decoder holds now (private: the bound is what this test is about). */
function held(decoder: FrameDecoder): number {
  return (decoder as unknown as { buf: Buffer }).buf.length;
}

function header(type: number, length: number): Buffer {
  const h = Buffer.alloc(HEADER_BYTES);
  h.writeUInt8(type, 0);
  h.writeUInt32BE(1, 1);
  h.writeUInt32BE(length, 5);
  return h;
}

describe("the frame decoder under a guest's flood (what test/fixtures/guest-agent-flooder.ts sends)", () => {
  it('a header announcing 4 GiB is a desync at once, not a wait for the payload', () => {
    const decoder = new FrameDecoder();
    const events = decoder.push(Buffer.concat([MAGIC, header(FrameType.DATA, 0xffffffff)]));
    expect(events).toEqual([{ kind: 'sync' }, { kind: 'desync', reason: 'frame length 4294967295 exceeds the maximum' }]);
    expect(held(decoder)).toBeLessThan(MAGIC.length);
  });

  it('64 MiB of junk, huge headers and largest frames in 64 KiB reads: never more than one frame and one read held', () => {
    const decoder = new FrameDecoder();
    const round = Buffer.concat([
      randomFillSync(Buffer.alloc(512 * 1024)),
      MAGIC,
      header(FrameType.DATA, 0xffffffff),
      randomFillSync(Buffer.alloc(64 * 1024)),
      MAGIC,
      header(FrameType.HELLO_ACK, MAX_FRAME_PAYLOAD_BYTES),
      Buffer.alloc(MAX_FRAME_PAYLOAD_BYTES, 0x42),
      Buffer.alloc(512 * 1024, 0x42),
    ]);
    const readBytes = 64 * 1024;
    let maxHeld = 0;
    let fed = 0;
    let frames = 0;
    while (fed < 64 * 1024 * 1024) {
      for (let at = 0; at < round.length; at += readBytes) {
        const chunk = round.subarray(at, Math.min(round.length, at + readBytes));
        for (const e of decoder.push(chunk)) if (e.kind === 'frame') frames += 1;
        maxHeld = Math.max(maxHeld, held(decoder));
        fed += chunk.length;
      }
    }
    expect(maxHeld).toBeLessThanOrEqual(HEADER_BYTES + MAX_FRAME_PAYLOAD_BYTES + readBytes);
    // The largest frame was read whole each round, held in part until then: the bound was
    // approached, not avoided.
    expect(frames).toBeGreaterThan(0);
    expect(maxHeld).toBeGreaterThan(MAX_FRAME_PAYLOAD_BYTES / 2);
  });
});
