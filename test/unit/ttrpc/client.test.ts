import { Buffer } from 'node:buffer';
import net from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { RpcCode } from '../../../src/common/status-codes.js';
import { encodeFrame, encodeHeader, type Frame, FrameReader, MAX_DATA_BYTES, MessageType } from '../../../src/ttrpc/frames.js';
import { connectTtrpc, type TtrpcClient, TtrpcStatusError } from '../../../src/ttrpc/index.js';
import { decodeRequest, encodeResponse, type TtrpcRequest } from '../../../src/ttrpc/messages.js';
import { rejection } from '../../helpers/kata-error.js';
import { socketDir, utf8 } from './helpers.js';

/** A scripted server: hands each request frame (decoded) to the test, which answers as it likes. */
class FakeServer {
  readonly requests: { frame: Frame; request: TtrpcRequest; socket: net.Socket }[] = [];
  private waiters: (() => void)[] = [];
  readonly sockets: net.Socket[] = [];
  readonly listener = net.createServer((socket) => {
    this.sockets.push(socket);
    const reader = new FrameReader();
    socket.on('data', (chunk: Buffer) => {
      for (const event of reader.push(chunk)) {
        if (event.kind === 'frame') this.requests.push({ frame: event.frame, request: decodeRequest(event.frame.data), socket });
      }
      for (const w of this.waiters.splice(0)) w();
    });
    socket.on('error', () => {});
  });

  async received(count: number): Promise<FakeServer['requests']> {
    while (this.requests.length < count) await new Promise<void>((resolve) => this.waiters.push(resolve));
    return this.requests.slice(0, count);
  }

  static answer(socket: net.Socket, streamId: number, payload: string, status = { code: 0, message: '' }): void {
    socket.write(encodeFrame(streamId, MessageType.RESPONSE, 0, encodeResponse({ status, payload: utf8(payload) })));
  }
}

describe('TtrpcClient', () => {
  let dir: ReturnType<typeof socketDir>;
  let fake: FakeServer;
  let socketPath: string;
  let client: TtrpcClient;

  beforeEach(async () => {
    dir = socketDir();
    socketPath = dir.socket('fake.sock');
    fake = new FakeServer();
    await new Promise<void>((resolve) => fake.listener.listen(socketPath, resolve));
    client = await connectTtrpc(socketPath);
  });

  afterEach(async () => {
    await client.close();
    for (const s of fake.sockets) s.destroy();
    await new Promise<void>((resolve) => fake.listener.close(() => resolve()));
    dir.remove();
  });

  it('sends unary requests on odd, increasing stream ids with flags 0 and the call in the Request', async () => {
    const calls = [
      client.call('svc.A', 'One', utf8('1')),
      client.call('svc.A', 'Two', utf8('2')),
      client.call('svc.B', 'Three', utf8('3')),
    ];
    const got = await fake.received(3);
    expect(
      got.map(({ frame, request }) => [
        frame.streamId,
        frame.type,
        frame.flags,
        request.service,
        request.method,
        request.payload.toString(),
      ]),
    ).toEqual([
      [1, MessageType.REQUEST, 0, 'svc.A', 'One', '1'],
      [3, MessageType.REQUEST, 0, 'svc.A', 'Two', '2'],
      [5, MessageType.REQUEST, 0, 'svc.B', 'Three', '3'],
    ]);
    for (const { frame, socket } of got) FakeServer.answer(socket, frame.streamId, `ok ${frame.streamId}`);
    expect((await Promise.all(calls)).map((b) => b.toString())).toEqual(['ok 1', 'ok 3', 'ok 5']);
  });

  it('matches answers that come out of order to their calls by stream id', async () => {
    const calls = [1, 2, 3].map((i) => client.call('svc', 'M', utf8(String(i))));
    const got = await fake.received(3);
    for (const { frame, request, socket } of [...got].reverse()) FakeServer.answer(socket, frame.streamId, `re ${request.payload}`);
    expect((await Promise.all(calls)).map((b) => b.toString())).toEqual(['re 1', 're 2', 're 3']);
    expect(client.pendingCalls).toBe(0);
  });

  it('sends its timeout as timeout_nano, and metadata as key/value pairs', async () => {
    const call = client.call('svc', 'M', utf8(''), { timeoutMs: 1500, metadata: { ns: 'k8s.io', two: ['a', 'b'] } });
    const [{ frame, request, socket }] = (await fake.received(1)) as [FakeServer['requests'][number]];
    expect(request.timeoutNs).toBe(1_500_000_000);
    expect(request.metadata).toEqual([
      { key: 'ns', value: 'k8s.io' },
      { key: 'two', value: 'a' },
      { key: 'two', value: 'b' },
    ]);
    FakeServer.answer(socket, frame.streamId, '');
    await call;
  });

  it('rejects a status other than OK with a TtrpcStatusError carrying the code and message', async () => {
    const call = client.call('svc', 'M', utf8(''));
    const [{ frame, socket }] = (await fake.received(1)) as [FakeServer['requests'][number]];
    FakeServer.answer(socket, frame.streamId, '', { code: RpcCode.NOT_FOUND, message: 'no such task' });
    const err = await rejection(call);
    expect(err).toBeInstanceOf(TtrpcStatusError);
    expect([(err as TtrpcStatusError).code, err.kind, err.reason, err.message]).toEqual([
      RpcCode.NOT_FOUND,
      'not_found',
      'TTRPC_STATUS',
      'no such task',
    ]);
  });

  it('times out on its own when no answer comes, and ignores the late answer', async () => {
    const call = client.call('svc', 'Slow', utf8(''), { timeoutMs: 20 });
    const [{ frame, socket }] = (await fake.received(1)) as [FakeServer['requests'][number]];
    expect([(await rejection(call)).reason, client.pendingCalls]).toEqual(['TTRPC_CALL_TIMEOUT', 0]);
    FakeServer.answer(socket, frame.streamId, 'late');
    const next = client.call('svc', 'Next', utf8(''));
    const [, second] = (await fake.received(2)) as [unknown, FakeServer['requests'][number]];
    FakeServer.answer(socket, second.frame.streamId, 'next');
    expect((await next).toString()).toBe('next');
  });

  it('fails a call whose signal aborts, and one whose timeout is not positive, before any answer', async () => {
    const controller = new AbortController();
    const call = client.call('svc', 'M', utf8(''), { signal: controller.signal });
    await fake.received(1);
    controller.abort();
    expect((await rejection(call)).reason).toBe('TTRPC_CALL_CANCELLED');
    expect((await rejection(client.call('svc', 'M', utf8(''), { timeoutMs: 0 }))).reason).toBe('TTRPC_CALL_TIMEOUT');
  });

  it('fails every waiting call when the connection is lost, and later calls at once', async () => {
    const failures = [rejection(client.call('svc', 'A', utf8(''))), rejection(client.call('svc', 'B', utf8('')))];
    await fake.received(2);
    for (const s of fake.sockets) s.destroy();
    for (const err of await Promise.all(failures)) expect([err.kind, err.reason]).toEqual(['unavailable', 'TTRPC_CONNECTION_LOST']);
    expect((await rejection(client.call('svc', 'C', utf8('')))).reason).toBe('TTRPC_CONNECTION_LOST');
  });

  it('fails waiting calls as cancelled when closed', async () => {
    const failed = rejection(client.call('svc', 'A', utf8('')));
    await fake.received(1);
    await client.close();
    expect((await failed).reason).toBe('TTRPC_CLIENT_CLOSED');
  });

  it('refuses to send a request over 4 MiB, and fails a call whose answer is over 4 MiB', async () => {
    const tooBig = await rejection(client.call('svc', 'M', Buffer.alloc(MAX_DATA_BYTES)));
    expect([tooBig.kind, tooBig.reason]).toEqual(['exhausted', 'TTRPC_MESSAGE_TOO_LARGE']);
    const call = client.call('svc', 'M', utf8(''));
    const [{ frame, socket }] = (await fake.received(1)) as [FakeServer['requests'][number]];
    socket.write(encodeHeader({ dataBytes: MAX_DATA_BYTES + 1, streamId: frame.streamId, type: MessageType.RESPONSE, flags: 0 }));
    socket.write(Buffer.alloc(MAX_DATA_BYTES + 1));
    const err = await rejection(call);
    expect([err.kind, err.reason]).toEqual(['exhausted', 'TTRPC_MESSAGE_TOO_LARGE']);
  });

  it('fails a unary call answered with a data frame as a protocol error', async () => {
    const call = client.call('svc', 'M', utf8(''));
    const [{ frame, socket }] = (await fake.received(1)) as [FakeServer['requests'][number]];
    socket.write(encodeFrame(frame.streamId, MessageType.DATA, 0, utf8('x')));
    expect((await rejection(call)).reason).toBe('TTRPC_PROTOCOL');
  });

  it('reports a socket nobody listens on as unavailable', async () => {
    const err = await rejection(connectTtrpc(dir.socket('nobody.sock')));
    expect([err.kind, err.reason]).toEqual(['unavailable', 'TTRPC_CONNECTION_LOST']);
  });
});
