import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { encodeFrame, FrameType } from '../../../src/channel/frames.js';
import {
  ChannelServer,
  type ChannelStream,
  connectSession,
  RpcClient,
  type ServerHandlers,
  type Session,
  serveDuplex,
  serveRpc,
} from '../../../src/channel/index.js';
import { duplexPair, jsonCodec, TEST_TABLE, type TestMethods } from './helpers.js';

const WINDOW = 32 * 1024;
const limits = { initialWindowBytes: WINDOW, maxStreams: 8 };
const tick = () => new Promise((r) => setTimeout(r, 20));
/** How long a state the test waits for may take to appear on a busy machine (never a timing claim). */
const SETTLE = { timeout: 30_000, interval: 5 };

describe('flow control', () => {
  it('a reader that stops reading stops the writer: bytes in flight stay within the window', async () => {
    const [host, guestEnd] = duplexPair();
    let guestStream: ChannelStream | undefined;
    serveDuplex(
      guestEnd,
      (s) =>
        s.onStream((stream) => {
          guestStream = stream;
        }),
      limits,
    );
    const session = await connectSession(host, { timeoutMs: 2000, limits });
    const stream = session.open('Raw');
    const payload = Buffer.alloc(4 * 1024 * 1024);
    for (let i = 0; i < payload.length; i++) payload[i] = (i * 7) & 0xff;
    const chunk = 16 * 1024;
    let accepted = 0;
    let offset = 0;
    const writer = (async () => {
      while (offset < payload.length) {
        const piece = payload.subarray(offset, offset + chunk);
        offset += piece.length;
        await new Promise<void>((resolve, reject) => stream.write(piece, (err) => (err ? reject(err) : resolve())));
        accepted += piece.length;
      }
      stream.end();
    })();
    // Waited for by state, not by time (a loaded machine may take long to get this far): the
    // writer has spent the credit the guest gave it.
    await expect.poll(() => accepted > 0 && guestStream?.peerCreditBytes === 0, SETTLE).toBe(true);
    // Nobody reads on the guest: the writer got at most the window (plus the chunk being framed).
    expect(guestStream).toBeDefined();
    expect(accepted).toBeLessThanOrEqual(WINDOW + chunk);
    expect(accepted).toBeGreaterThan(0);
    expect(guestStream!.peerCreditBytes).toBe(0);
    const stalledAt = accepted;
    await tick();
    expect(accepted).toBe(stalledAt);
    // Now read everything: the writer completes and the bytes arrive intact.
    const hash = createHash('sha256');
    let got = 0;
    for await (const data of guestStream!) {
      hash.update(data as Buffer);
      got += (data as Buffer).length;
    }
    await writer;
    expect(got).toBe(payload.length);
    expect(hash.digest('hex')).toBe(createHash('sha256').update(payload).digest('hex'));
  });

  it('streams beyond the peer limit wait for a slot instead of failing', async () => {
    const [host, guestEnd] = duplexPair();
    const held: ChannelStream[] = [];
    serveDuplex(guestEnd, (s) => s.onStream((stream) => held.push(stream)), limits);
    const session = await connectSession(host, { timeoutMs: 2000, limits });
    const streams = Array.from({ length: 12 }, () => session.open('Raw'));
    await expect.poll(() => held.length, SETTLE).toBe(8);
    await tick();
    expect(held.length).toBe(8);
    for (const s of held.splice(0, 4)) s.destroy();
    // The four that waited get the freed slots, and no more than those.
    await expect.poll(() => held.length, SETTLE).toBe(8);
    await tick();
    expect(held.length).toBe(8);
    for (const s of streams) s.destroy();
  });
});

/** A guest port that outlives host connections, like the virtio-serial device. */
function guestPort(onSession: (s: Session) => void) {
  let current: Duplex | undefined;
  const server = new ChannelServer(
    {
      send: async (bytes) => {
        current?.write(bytes);
      },
    },
    onSession,
    limits,
  );
  return {
    server,
    /** A host connects: a new pair whose guest end feeds the same ChannelServer. */
    plug(): Duplex {
      const [host, guest] = duplexPair();
      current = guest;
      guest.on('data', (chunk: Buffer) => server.feed(chunk));
      return host;
    },
    write(bytes: Buffer) {
      current?.write(bytes);
    },
  };
}

describe('reconnect over a port that outlives the host', () => {
  const aborted: string[] = [];
  const handlers: ServerHandlers<TestMethods> = {
    Echo: async (r) => ({ text: r.text }),
    Hang: (r, ctx) =>
      new Promise((_resolve, reject) =>
        ctx.signal.addEventListener('abort', () => {
          aborted.push(r.note);
          reject(ctx.signal.reason);
        }),
      ),
    Count: async function* () {},
    Sum: async () => ({ total: 0 }),
    Upper: async function* () {},
    Fail: async (r) => r,
  };

  it('a new host after EOF gets a fresh session through stale bytes; old calls fail, the guest keeps serving', async () => {
    const port = guestPort((s) => serveRpc(s, TEST_TABLE, handlers, jsonCodec));
    const host1 = port.plug();
    const s1 = await connectSession(host1, { timeoutMs: 2000, limits });
    const c1 = new RpcClient(() => s1, TEST_TABLE, jsonCodec);
    expect((await c1.unary('Echo', { text: 'one' }, { timeoutMs: 2000 })).text).toBe('one');
    const hanging = c1.unary('Hang', { note: 'old' }, { timeoutMs: 10_000 });
    await tick();

    // The daemon dies: the guest reads EOF. Half a frame and garbage were left in the port.
    host1.destroy();
    port.server.linkLost();
    await expect(hanging).rejects.toMatchObject({ kind: 'unavailable' });
    await expect.poll(() => aborted).toContain('old');
    port.server.feed(Buffer.concat([Buffer.from('garbage'), encodeFrame(FrameType.DATA, 1, Buffer.alloc(100)).subarray(0, 40)]));

    // The new daemon connects; the guest first flushes a write it had blocked in (old bytes).
    const host2 = port.plug();
    port.write(encodeFrame(FrameType.DATA, 7, Buffer.from('stale output of the old session')).subarray(0, 20));
    const s2 = await connectSession(host2, { timeoutMs: 2000, limits, helloIntervalMs: 50 });
    const c2 = new RpcClient(() => s2, TEST_TABLE, jsonCodec);
    expect((await c2.unary('Echo', { text: 'two' }, { timeoutMs: 2000 })).text).toBe('two');
    host2.destroy();
  });

  it('a new HELLO without an EOF in between replaces the session (the guest missed the disconnect)', async () => {
    const sessions: Session[] = [];
    const port = guestPort((s) => {
      sessions.push(s);
      serveRpc(s, TEST_TABLE, handlers, jsonCodec);
    });
    const host1 = port.plug();
    const s1 = await connectSession(host1, { timeoutMs: 2000, limits });
    const c1 = new RpcClient(() => s1, TEST_TABLE, jsonCodec);
    void c1.unary('Hang', { note: 'replaced' }, { timeoutMs: 10_000 }).catch(() => {});
    await tick();
    // Half a frame of host 1 reaches the guest, then host 2's HELLO on the same port.
    port.server.feed(encodeFrame(FrameType.DATA, 1, Buffer.alloc(64)).subarray(0, 30));
    const host2 = port.plug();
    const s2 = await connectSession(host2, { timeoutMs: 3000, limits, helloIntervalMs: 50 });
    const c2 = new RpcClient(() => s2, TEST_TABLE, jsonCodec);
    expect((await c2.unary('Echo', { text: 'fresh' }, { timeoutMs: 2000 })).text).toBe('fresh');
    expect(sessions[0]!.closed).toBe(true);
    await expect.poll(() => aborted).toContain('replaced');
    host1.destroy();
    host2.destroy();
  });

  it('a repeated HELLO of the current session is answered without dropping it', async () => {
    const sessions: Session[] = [];
    const port = guestPort((s) => {
      sessions.push(s);
      serveRpc(s, TEST_TABLE, handlers, jsonCodec);
    });
    const host = port.plug();
    // A short HELLO interval makes the host repeat HELLO while the first answer is on its way.
    const s = await connectSession(host, { timeoutMs: 2000, limits, helloIntervalMs: 1 });
    await tick();
    const c = new RpcClient(() => s, TEST_TABLE, jsonCodec);
    expect((await c.unary('Echo', { text: 'same' }, { timeoutMs: 2000 })).text).toBe('same');
    expect(sessions.length).toBe(1);
    expect(sessions[0]!.closed).toBe(false);
    host.destroy();
  });
});
