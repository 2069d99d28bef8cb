import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { encodeFrame, FrameType, PROTOCOL_VERSION } from '../../../src/channel/frames.js';
import { CONTROL_QUEUE_MAX_BYTES, Session } from '../../../src/channel/session.js';

const hello = { version: PROTOCOL_VERSION, initialWindowBytes: 65536, maxStreams: 8, nonce: randomBytes(16) };

describe('channel session: a peer that floods control frames and never reads', () => {
  it('ends the session with CHANNEL_CONTROL_FLOOD once the queued answers pass CONTROL_QUEUE_MAX_BYTES', async () => {
    // A link that never takes anything: the peer does not read.
    const session = new Session({ role: 'client', local: hello, remote: hello, link: { send: () => new Promise(() => {}) } });
    let closedWith = '';
    session.onClose((err) => (closedWith = (err as { reason?: string }).reason ?? ''));
    const ping = (): void => session.onFrame(decode(encodeFrame(FrameType.PING, 0, randomBytes(8))));
    // Each PONG is a 17-byte frame: enough PINGs to pass the bound several times over.
    const pings = Math.ceil((CONTROL_QUEUE_MAX_BYTES / 17) * 3);
    for (let i = 0; i < pings && !session.closed; i++) ping();
    expect(session.closed).toBe(true);
    expect(closedWith).toBe('CHANNEL_CONTROL_FLOOD');
  });

  it('an honest peer answered as it goes never reaches the bound', async () => {
    const sent: Buffer[] = [];
    const session = new Session({ role: 'client', local: hello, remote: hello, link: { send: async (b) => void sent.push(b) } });
    for (let round = 0; round < 50; round++) {
      for (let i = 0; i < 100; i++) session.onFrame(decode(encodeFrame(FrameType.PING, 0, randomBytes(8))));
      await new Promise((r) => setImmediate(r));
      await new Promise((r) => setImmediate(r));
    }
    expect(session.closed).toBe(false);
    expect(sent.length).toBeGreaterThan(0);
  });
});

function decode(bytes: Buffer): { type: typeof FrameType.PING; streamId: number; payload: Buffer } {
  return { type: FrameType.PING, streamId: bytes.readUInt32BE(1), payload: bytes.subarray(9) };
}
