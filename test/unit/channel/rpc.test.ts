import { Buffer } from 'node:buffer';
import { afterEach, describe, expect, it } from 'vitest';
import { connectSession, RpcClient, type ServerHandlers, type Session, serveDuplex, serveRpc } from '../../../src/channel/index.js';
import { KataError, notFound } from '../../../src/common/errors.js';
import { duplexPair, jsonCodec, TEST_TABLE, type TestMethods } from './helpers.js';

const aborted: string[] = [];

const handlers: ServerHandlers<TestMethods> = {
  Echo: async (req) => {
    if (req.delayMs) await new Promise((r) => setTimeout(r, req.delayMs));
    return { text: req.text };
  },
  Hang: (req, ctx) =>
    new Promise((_resolve, reject) => {
      ctx.signal.addEventListener('abort', () => {
        aborted.push(req.note);
        reject(ctx.signal.reason);
      });
    }),
  Count: async function* (req) {
    for (let i = 0; i < req.n; i++) yield { i, blob: 'x'.repeat(req.size) };
  },
  Sum: async (reqs) => {
    let total = 0;
    for await (const r of reqs) total += r.v;
    return { total };
  },
  Upper: async function* (reqs) {
    for await (const r of reqs) yield { text: r.text.toUpperCase() };
  },
  Fail: async (req) => {
    throw notFound('EXEC_NOT_FOUND', `thing ${req.note} does not exist.`);
  },
};

async function pair(): Promise<{ client: RpcClient<TestMethods>; session: Session; guest: Session }> {
  const [host, guestEnd] = duplexPair();
  let guest: Session | undefined;
  serveDuplex(guestEnd, (s) => {
    guest = s;
    serveRpc(s, TEST_TABLE, handlers, jsonCodec);
  });
  const session = await connectSession(host, { timeoutMs: 2000 });
  cleanups.push(() => host.destroy());
  return { client: new RpcClient(() => session, TEST_TABLE, jsonCodec), session, guest: guest! };
}

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
  aborted.length = 0;
});

describe('RPC over the channel', () => {
  it('runs many concurrent unary calls and each gets its own answer', async () => {
    const { client } = await pair();
    const texts = Array.from({ length: 300 }, (_, i) => `call-${i}`);
    const answers = await Promise.all(texts.map((text, i) => client.unary('Echo', { text, delayMs: i % 7 }, { timeoutMs: 5000 })));
    expect(answers.map((a) => a.text)).toEqual(texts);
  });

  it('carries a server-side KataError across with kind and reason', async () => {
    const { client } = await pair();
    const err = await client.unary('Fail', { note: 'n1' }, { timeoutMs: 2000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KataError);
    expect((err as KataError).kind).toBe('not_found');
    expect((err as KataError).reason).toBe('EXEC_NOT_FOUND');
  });

  it('times a call out, resets the stream, and the server sees its signal fire', async () => {
    const { client, session } = await pair();
    const err = await client.unary('Hang', { note: 'h1' }, { timeoutMs: 50 }).catch((e: unknown) => e);
    expect((err as KataError).kind).toBe('timeout');
    expect((err as KataError).reason).toBe('CHANNEL_CALL_TIMEOUT');
    await expect.poll(() => aborted).toEqual(['h1']);
    await expect.poll(() => session.openStreams).toBe(0);
  });

  it('cancels through an AbortSignal', async () => {
    const { client } = await pair();
    const controller = new AbortController();
    const call = client.unary('Hang', { note: 'h2' }, { timeoutMs: 10_000, signal: controller.signal });
    setTimeout(() => controller.abort(), 20);
    await expect(call).rejects.toMatchObject({ kind: 'cancelled' });
    await expect.poll(() => aborted).toEqual(['h2']);
  });

  it('streams large responses split into frames, intact and in order', async () => {
    const { client } = await pair();
    const got: number[] = [];
    for await (const m of client.serverStream('Count', { n: 12, size: 300_000 })) {
      expect(m.blob.length).toBe(300_000);
      got.push(m.i);
    }
    expect(got).toEqual([...Array(12).keys()]);
  });

  it('client streaming and bidi streaming', async () => {
    const { client } = await pair();
    const sum = client.clientStream('Sum');
    for (let v = 1; v <= 100; v++) await sum.send({ v });
    sum.end();
    expect((await sum.response).total).toBe(5050);

    const upper = client.bidi('Upper');
    await upper.send({ text: 'a' });
    const first = await upper.responses.next();
    expect(first.value).toEqual({ text: 'A' });
    await upper.send({ text: 'b' });
    upper.end();
    const rest: string[] = [];
    for await (const r of upper.responses) rest.push(r.text);
    expect(rest).toEqual(['B']);
  });

  it('answers an unknown method with unimplemented', async () => {
    const { session } = await pair();
    const client = new RpcClient<{ Nope: { kind: 'unary'; request: object; response: object } }>(
      () => session,
      { Nope: { kind: 'unary', request: 'x', response: 'x' } },
      jsonCodec,
    );
    await expect(client.unary('Nope', {}, { timeoutMs: 2000 })).rejects.toMatchObject({ kind: 'unimplemented' });
  });

  it('fails open calls cleanly when the link goes, with the session closed error', async () => {
    const [host, guestEnd] = duplexPair();
    serveDuplex(guestEnd, (s) => serveRpc(s, TEST_TABLE, handlers, jsonCodec));
    const session = await connectSession(host, { timeoutMs: 2000 });
    const client = new RpcClient(() => session, TEST_TABLE, jsonCodec);
    const hanging = client.unary('Hang', { note: 'h3' }, { timeoutMs: 10_000 });
    await client.unary('Echo', { text: 'up' }, { timeoutMs: 2000 });
    host.destroy();
    await expect(hanging).rejects.toMatchObject({ kind: 'unavailable' });
    await expect.poll(() => aborted).toEqual(['h3']);
  });

  it('pings', async () => {
    const { session } = await pair();
    expect(await session.ping(2000)).toBeGreaterThanOrEqual(0);
  });

  it('a JSON codec payload larger than a frame still round-trips through unary', async () => {
    const { client } = await pair();
    const text = Buffer.alloc(1_000_000, 'k').toString();
    expect((await client.unary('Echo', { text }, { timeoutMs: 5000 })).text).toBe(text);
  });
});

describe('the dispatch table type', () => {
  it('refuses a table that leaves a method out (checked by tsc)', () => {
    const { Fail: _left, ...partial } = handlers;
    // @ts-expect-error Fail is missing, so this is not a complete ServerHandlers<TestMethods>.
    const incomplete: ServerHandlers<TestMethods> = partial;
    expect(Object.keys(incomplete)).not.toContain('Fail');
  });
});
