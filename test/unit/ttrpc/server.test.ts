import { Buffer } from 'node:buffer';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { invalid, notFound } from '../../../src/common/errors.js';
import { RpcCode } from '../../../src/common/status-codes.js';
import { encodeFrame, encodeHeader, Flag, MAX_DATA_BYTES, MessageType } from '../../../src/ttrpc/frames.js';
import { connectTtrpc, type TtrpcCall, type TtrpcClient, TtrpcServer, TtrpcStatusError } from '../../../src/ttrpc/index.js';
import { decodeResponse, encodeRequest, type TtrpcRequest } from '../../../src/ttrpc/messages.js';
import { rejection, thrown } from '../../helpers/kata-error.js';
import { deferred, RawPeer, socketDir, utf8 } from './helpers.js';

const SERVICE = 'kata.test.v1.Echo';

function request(fields: Partial<TtrpcRequest>): Buffer {
  return encodeRequest({ service: SERVICE, method: 'Echo', payload: Buffer.alloc(0), timeoutNs: 0, metadata: [], ...fields });
}

/** The status (and payload) a response frame carries. */
function answerOf(frame: { type: number; data: Buffer }): { code: number; message: string; payload: string } {
  expect(frame.type).toBe(MessageType.RESPONSE);
  const { status, payload } = decodeResponse(frame.data);
  return { ...status, payload: payload.toString() };
}

async function statusError(p: Promise<unknown>): Promise<TtrpcStatusError> {
  const err = await rejection(p);
  expect(err).toBeInstanceOf(TtrpcStatusError);
  return err as TtrpcStatusError;
}

describe('TtrpcServer', () => {
  let dir: ReturnType<typeof socketDir>;
  let server: TtrpcServer;
  let socketPath: string;
  const clients: TtrpcClient[] = [];
  const peers: RawPeer[] = [];

  beforeEach(async () => {
    dir = socketDir();
    socketPath = dir.socket('ttrpc.sock');
    server = new TtrpcServer();
    server.register(SERVICE, {
      Echo: (req) => req,
      Upper: (req) => utf8(req.toString().toUpperCase()),
    });
    await server.listen(socketPath);
  });

  afterEach(async () => {
    for (const c of clients.splice(0)) await c.close();
    for (const p of peers.splice(0)) p.close();
    server.destroy();
    dir.remove();
  });

  const client = async (): Promise<TtrpcClient> => {
    const c = await connectTtrpc(socketPath);
    clients.push(c);
    return c;
  };
  const raw = async (): Promise<RawPeer> => {
    const p = await RawPeer.connect(socketPath);
    peers.push(p);
    return p;
  };

  it('answers a unary call with the handler bytes and status OK on the same stream id', async () => {
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, request({ method: 'Upper', payload: utf8('abc') })));
    const [frame] = await peer.next();
    expect([frame!.streamId, frame!.flags]).toEqual([1, 0]);
    expect(answerOf(frame!)).toEqual({ code: RpcCode.OK, message: '', payload: 'ABC' });
  });

  it('answers an unknown service and an unknown method with UNIMPLEMENTED, naming them', async () => {
    const c = await client();
    const noService = await statusError(c.call('kata.test.v1.Nope', 'Echo', utf8('')));
    expect([noService.code, noService.kind]).toEqual([RpcCode.UNIMPLEMENTED, 'unimplemented']);
    expect(noService.message).toContain('kata.test.v1.Nope');
    const noMethod = await statusError(c.call(SERVICE, 'Shout', utf8('')));
    expect(noMethod.code).toBe(RpcCode.UNIMPLEMENTED);
    expect(noMethod.message).toContain('Shout');
    // An inherited property is no method either.
    expect((await statusError(c.call(SERVICE, 'toString', utf8('')))).code).toBe(RpcCode.UNIMPLEMENTED);
  });

  it('aborts the handler signal at the deadline from timeout_nano and answers DEADLINE_EXCEEDED', async () => {
    const seen = deferred<TtrpcCall>();
    server.register('kata.test.v1.Slow', {
      Wait: (_req, call) =>
        new Promise<Uint8Array>((_resolve, reject) => {
          seen.resolve(call);
          call.signal.addEventListener('abort', () => reject(call.signal.reason));
        }),
    });
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, request({ service: 'kata.test.v1.Slow', method: 'Wait', timeoutNs: 30e6 })));
    const call = await seen.promise;
    expect(call.timeoutMs).toBe(30);
    const [frame] = await peer.next();
    expect(answerOf(frame!).code).toBe(RpcCode.DEADLINE_EXCEEDED);
    expect(call.signal.aborted).toBe(true);
    expect([(call.signal.reason as { kind: string }).kind, (call.signal.reason as { reason: string }).reason]).toEqual([
      'timeout',
      'TTRPC_DEADLINE',
    ]);
    // The handler's own rejection after the deadline sends no second answer.
    peer.send(encodeFrame(3, MessageType.REQUEST, 0, request({ payload: utf8('after') })));
    const [next] = await peer.next();
    expect([next!.streamId, answerOf(next!).payload]).toEqual([3, 'after']);
  });

  it('answers a deadline that had already passed (negative timeout_nano) without running the handler', async () => {
    let ran = false;
    server.register('kata.test.v1.Late', {
      Run: () => {
        ran = true;
        return utf8('');
      },
    });
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, request({ service: 'kata.test.v1.Late', method: 'Run', timeoutNs: -1 })));
    expect(answerOf((await peer.next())[0]!).code).toBe(RpcCode.DEADLINE_EXCEEDED);
    expect(ran).toBe(false);
  });

  it('runs calls on one connection concurrently and answers each on its stream id as it finishes', async () => {
    const gates = new Map<string, ReturnType<typeof deferred<void>>>();
    const started = deferred();
    server.register('kata.test.v1.Gate', {
      Wait: async (req) => {
        const gate = deferred();
        gates.set(req.toString(), gate);
        if (gates.size === 3) started.resolve();
        await gate.promise;
        return req;
      },
    });
    const peer = await raw();
    for (const [id, name] of [
      [1, 'a'],
      [3, 'b'],
      [5, 'c'],
    ] as const) {
      peer.send(encodeFrame(id, MessageType.REQUEST, 0, request({ service: 'kata.test.v1.Gate', method: 'Wait', payload: utf8(name) })));
    }
    await started.promise;
    gates.get('c')!.resolve();
    const [first] = await peer.next();
    gates.get('a')!.resolve();
    const [second] = await peer.next();
    gates.get('b')!.resolve();
    const [third] = await peer.next();
    expect([first, second, third].map((f) => [f!.streamId, answerOf(f!).payload])).toEqual([
      [5, 'c'],
      [1, 'a'],
      [3, 'b'],
    ]);
  });

  it('serves many connections at once', async () => {
    const all = await Promise.all([client(), client(), client(), client()]);
    const answers = await Promise.all(all.map((c, i) => c.call(SERVICE, 'Echo', utf8(`conn ${i}`))));
    expect(answers.map((a) => a.toString())).toEqual(['conn 0', 'conn 1', 'conn 2', 'conn 3']);
    expect(server.connectionCount).toBe(4);
  });

  it('answers a handler that throws a non-KataError with INTERNAL and keeps serving', async () => {
    server.register('kata.test.v1.Broken', {
      Crash: () => {
        throw new TypeError('cannot read properties of undefined');
      },
      Reject: async () => Promise.reject(new Error('boom')),
      NoBytes: () => 'not bytes' as unknown as Uint8Array,
    });
    const c = await client();
    const crash = await statusError(c.call('kata.test.v1.Broken', 'Crash', utf8('')));
    expect([crash.code, crash.kind]).toEqual([RpcCode.INTERNAL, 'internal']);
    expect(crash.message).toContain('cannot read properties');
    expect((await statusError(c.call('kata.test.v1.Broken', 'Reject', utf8('')))).code).toBe(RpcCode.INTERNAL);
    expect((await statusError(c.call('kata.test.v1.Broken', 'NoBytes', utf8('')))).code).toBe(RpcCode.INTERNAL);
    expect((await c.call(SERVICE, 'Echo', utf8('still here'))).toString()).toBe('still here');
    expect((await (await client()).call(SERVICE, 'Echo', utf8('and here'))).toString()).toBe('and here');
  });

  it('answers a KataError with the code of its kind, and a TtrpcStatusError with its own code', async () => {
    server.register('kata.test.v1.Errors', {
      Missing: () => {
        throw notFound('SANDBOX_NOT_FOUND', 'sandbox x does not exist.');
      },
      Bad: () => {
        throw invalid('TTRPC_BAD_REQUEST', 'field y is wrong.');
      },
      Relay: () => {
        throw new TtrpcStatusError(RpcCode.PERMISSION_DENIED, 'relayed');
      },
    });
    const c = await client();
    const missing = await statusError(c.call('kata.test.v1.Errors', 'Missing', utf8('')));
    expect([missing.code, missing.kind, missing.message]).toEqual([RpcCode.NOT_FOUND, 'not_found', 'sandbox x does not exist.']);
    expect((await statusError(c.call('kata.test.v1.Errors', 'Bad', utf8('')))).code).toBe(RpcCode.INVALID_ARGUMENT);
    const relayed = await statusError(c.call('kata.test.v1.Errors', 'Relay', utf8('')));
    expect([relayed.code, relayed.kind]).toEqual([RpcCode.PERMISSION_DENIED, 'internal']);
  });

  it('passes metadata to the handler by key', async () => {
    const seen = deferred<TtrpcCall>();
    server.register('kata.test.v1.Meta', {
      Read: (_req, call) => {
        seen.resolve(call);
        return utf8('');
      },
    });
    const c = await client();
    await c.call('kata.test.v1.Meta', 'Read', utf8(''), { metadata: { 'containerd-namespace-ttrpc': 'k8s.io', multi: ['1', '2'] } });
    const call = await seen.promise;
    expect([...call.metadata.entries()]).toEqual([
      ['containerd-namespace-ttrpc', ['k8s.io']],
      ['multi', ['1', '2']],
    ]);
    expect(call.timeoutMs).toBeUndefined();
  });

  it('refuses a request frame over 4 MiB with RESOURCE_EXHAUSTED on its stream id, and the connection stays usable', async () => {
    const peer = await raw();
    peer.send(encodeHeader({ dataBytes: MAX_DATA_BYTES + 1, streamId: 1, type: MessageType.REQUEST, flags: 0 }));
    peer.send(Buffer.alloc(MAX_DATA_BYTES + 1));
    peer.send(encodeFrame(3, MessageType.REQUEST, 0, request({ payload: utf8('after') })));
    const [refused, after] = await peer.next(2);
    expect([refused!.streamId, answerOf(refused!).code]).toEqual([1, RpcCode.RESOURCE_EXHAUSTED]);
    expect([after!.streamId, answerOf(after!).payload]).toEqual([3, 'after']);
  });

  it('accepts a request frame of exactly 4 MiB', async () => {
    server.register('kata.test.v1.Size', { Len: (req) => utf8(String(req.length)) });
    // A payload that makes the encoded Request exactly 4 MiB (its length prefix grows with it).
    const sized = (n: number): Buffer => request({ service: 'kata.test.v1.Size', method: 'Len', payload: Buffer.alloc(n) });
    const payloadBytes = MAX_DATA_BYTES - (sized(MAX_DATA_BYTES / 2).length - MAX_DATA_BYTES / 2);
    const data = sized(payloadBytes);
    expect(data.length).toBe(MAX_DATA_BYTES);
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, data));
    expect(answerOf((await peer.next())[0]!)).toEqual({ code: RpcCode.OK, message: '', payload: String(payloadBytes) });
  });

  it('answers a response over 4 MiB with RESOURCE_EXHAUSTED instead', async () => {
    server.register('kata.test.v1.Big', { Give: () => Buffer.alloc(MAX_DATA_BYTES) });
    const c = await client();
    expect((await statusError(c.call('kata.test.v1.Big', 'Give', utf8('')))).code).toBe(RpcCode.RESOURCE_EXHAUSTED);
  });

  it('refuses even stream ids, reused or lower ids, data frames and stream requests; skips unknown types', async () => {
    const peer = await raw();
    peer.send(encodeFrame(2, MessageType.REQUEST, 0, request({})));
    peer.send(encodeFrame(5, MessageType.REQUEST, 0, request({ payload: utf8('five') })));
    peer.send(encodeFrame(5, MessageType.REQUEST, 0, request({})));
    peer.send(encodeFrame(3, MessageType.REQUEST, 0, request({})));
    peer.send(encodeFrame(5, MessageType.DATA, Flag.REMOTE_CLOSED, utf8('x')));
    peer.send(encodeFrame(7, MessageType.REQUEST, Flag.REMOTE_OPEN, request({})));
    peer.send(encodeFrame(9, 0x7f, 0, utf8('from the future')));
    peer.send(encodeFrame(11, MessageType.REQUEST, 0, request({ payload: utf8('eleven') })));
    // Refusals go out at once, a handler's answer when it finishes: compare without the order.
    const frames = await peer.next(7);
    const byStream = (a: (number | string)[], b: (number | string)[]): number => Number(a[0]) - Number(b[0]) || Number(a[1]) - Number(b[1]);
    expect(frames.map((f) => [f.streamId, answerOf(f).code, answerOf(f).payload]).sort(byStream)).toEqual([
      [2, RpcCode.INVALID_ARGUMENT, ''],
      [3, RpcCode.INVALID_ARGUMENT, ''],
      [5, RpcCode.OK, 'five'],
      [5, RpcCode.INVALID_ARGUMENT, ''],
      [5, RpcCode.INVALID_ARGUMENT, ''],
      [7, RpcCode.UNIMPLEMENTED, ''],
      [11, RpcCode.OK, 'eleven'],
    ]);
  });

  it('answers bytes that are no Request with INVALID_ARGUMENT', async () => {
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, Buffer.from([0x1a, 0x05, 0x01])));
    expect(answerOf((await peer.next())[0]!).code).toBe(RpcCode.INVALID_ARGUMENT);
  });

  it('aborts the signals of running handlers when their connection closes', async () => {
    const seen = deferred<TtrpcCall>();
    server.register('kata.test.v1.Hang', {
      Forever: (_req, call) => {
        seen.resolve(call);
        return new Promise<Uint8Array>(() => {});
      },
    });
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, request({ service: 'kata.test.v1.Hang', method: 'Forever' })));
    const call = await seen.promise;
    const aborted = new Promise<unknown>((resolve) => call.signal.addEventListener('abort', () => resolve(call.signal.reason)));
    peer.close();
    expect(await aborted).toMatchObject({ kind: 'cancelled', reason: 'TTRPC_CONNECTION_LOST' });
  });

  it('close() answers the calls in flight, refuses new ones, then ends the connections', async () => {
    const gate = deferred();
    const started = deferred();
    server.register('kata.test.v1.Drain', {
      Wait: async () => {
        started.resolve();
        await gate.promise;
        return utf8('done');
      },
    });
    const peer = await raw();
    peer.send(encodeFrame(1, MessageType.REQUEST, 0, request({ service: 'kata.test.v1.Drain', method: 'Wait' })));
    await started.promise;
    const closed = server.close();
    peer.send(encodeFrame(3, MessageType.REQUEST, 0, request({})));
    const [refused] = await peer.next();
    expect([refused!.streamId, answerOf(refused!).code]).toEqual([3, RpcCode.UNAVAILABLE]);
    gate.resolve();
    const [answered] = await peer.next();
    expect([answered!.streamId, answerOf(answered!).payload]).toEqual([1, 'done']);
    await peer.closedByPeer();
    await closed;
    expect(server.connectionCount).toBe(0);
    expect((await rejection(connectTtrpc(socketPath))).reason).toBe('TTRPC_CONNECTION_LOST');
  });

  it('refuses a second registration of one service name and a socket path in use', async () => {
    expect(thrown(() => server.register(SERVICE, {})).reason).toBe('TTRPC_SERVICE_EXISTS');
    const other = new TtrpcServer();
    expect((await rejection(other.listen(socketPath))).reason).toBe('TTRPC_SOCKET_IN_USE');
  });
});
