/**
 * A client of the streaming server speaking the protocols the way k8s client-go does: SPDY/3.1
 * as spdystream (upgrade with `X-Stream-Protocol-Version` offers, odd stream ids, the error stream
 * first, then stdin, stdout, stderr, resize; stdin closed with FIN; no WINDOW_UPDATE unless
 * `flowControl` asks for SPDY/3.1 windows), and WebSocket with channel-prefixed messages. Built on
 * the framer in src/spdy (the server side of the same frames).
 */
import { Buffer } from 'node:buffer';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { createWebSocketStream, WebSocket } from 'ws';
import { encodeFrame, FrameReader } from '../../src/spdy/frames.js';
import { HeaderCompressor, HeaderDecompressor } from '../../src/spdy/headers.js';

interface ClientStream {
  id: number;
  chunks: Buffer[];
  fin: boolean;
  reset: boolean;
  replied: boolean;
  onData?: () => void;
}

export class SpdyClient {
  private readonly reader = new FrameReader(16 * 1024 * 1024);
  private readonly compressor = new HeaderCompressor();
  private readonly decompressor = new HeaderDecompressor();
  private nextId = 1;
  private chain: Promise<void> = Promise.resolve();
  readonly streams = new Map<number, ClientStream>();
  closed = false;
  /** WINDOW_UPDATEs sent (flow control on). */
  windowUpdatesSent = 0;

  private constructor(
    readonly socket: Socket,
    readonly protocol: string,
    private readonly flowControl: boolean,
  ) {
    socket.on('data', (chunk: Buffer) => {
      for (const frame of this.reader.push(chunk)) {
        this.chain = this.chain.then(async () => {
          if (frame.type === 'syn_reply') {
            await this.decompressor.decompress(frame.headerBlock);
            const s = this.streams.get(frame.streamId);
            if (s) s.replied = true;
          } else if (frame.type === 'data') {
            const s = this.streams.get(frame.streamId);
            if (!s) return;
            if (frame.data.length > 0) s.chunks.push(frame.data);
            if (frame.fin) s.fin = true;
            if (this.flowControl && frame.data.length > 0) {
              this.windowUpdatesSent++;
              socket.write(encodeFrame({ type: 'window_update', streamId: frame.streamId, delta: frame.data.length }));
              socket.write(encodeFrame({ type: 'window_update', streamId: 0, delta: frame.data.length }));
            }
            s.onData?.();
          } else if (frame.type === 'rst_stream') {
            const s = this.streams.get(frame.streamId);
            if (s) s.reset = true;
            s?.onData?.();
          } else if (frame.type === 'ping') socket.write(encodeFrame(frame));
        });
      }
    });
    socket.on('close', () => {
      this.closed = true;
      for (const s of this.streams.values()) s.onData?.();
    });
    socket.on('error', () => {});
  }

  /** SPDY over an established byte stream (a WebSocket tunnel's, for instance). */
  static over(stream: Duplex, protocol: string): SpdyClient {
    return new SpdyClient(stream as Socket, protocol, false);
  }

  /** Upgrade `url` to SPDY/3.1 offering `protocols`; rejects with the status and body on refusal. */
  static connect(url: string, protocols: string[], options: { flowControl?: boolean; method?: string } = {}): Promise<SpdyClient> {
    return new Promise((resolve, reject) => {
      const req = http.request(url, {
        method: options.method ?? 'POST',
        headers: { Connection: 'Upgrade', Upgrade: 'SPDY/3.1', 'X-Stream-Protocol-Version': protocols },
      });
      req.on('upgrade', (res, socket, head) => {
        const client = new SpdyClient(
          socket as Socket,
          String(res.headers['x-stream-protocol-version'] ?? ''),
          options.flowControl === true,
        );
        if (head.length > 0) socket.unshift(head);
        resolve(client);
      });
      req.on('response', (res) => {
        let body = '';
        res.on('data', (d: Buffer) => {
          body += d.toString();
        });
        res.on('end', () => reject(Object.assign(new Error(`HTTP ${res.statusCode}: ${body}`), { statusCode: res.statusCode })));
      });
      req.on('error', reject);
      req.end();
    });
  }

  /** SYN_STREAM with `headers`. */
  async open(headers: Record<string, string>): Promise<ClientStream> {
    const id = this.nextId;
    this.nextId += 2;
    const stream: ClientStream = { id, chunks: [], fin: false, reset: false, replied: false };
    this.streams.set(id, stream);
    const headerBlock = await this.compressor.compress(Object.entries(headers));
    this.socket.write(
      encodeFrame({ type: 'syn_stream', streamId: id, associatedId: 0, priority: 0, fin: false, unidirectional: false, headerBlock }),
    );
    return stream;
  }

  write(stream: ClientStream, data: Buffer, fin = false): boolean {
    return this.socket.write(encodeFrame({ type: 'data', streamId: stream.id, fin, data }));
  }

  reset(stream: ClientStream): void {
    this.socket.write(encodeFrame({ type: 'rst_stream', streamId: stream.id, status: 5 }));
  }

  /** Resolves once the stream has FIN (or reset, or the connection closed). */
  async ended(stream: ClientStream, timeoutMs = 60_000): Promise<Buffer> {
    const end = Date.now() + timeoutMs;
    while (!stream.fin && !stream.reset && !this.closed) {
      if (Date.now() > end) throw new Error(`stream ${stream.id} did not end`);
      await new Promise<void>((resolve) => {
        stream.onData = resolve;
        setTimeout(resolve, 200);
      });
    }
    await this.chain;
    return Buffer.concat(stream.chunks);
  }

  close(): void {
    this.compressor.close();
    this.decompressor.close();
    this.socket.destroy();
  }
}

export interface CommandOptions {
  stdin?: Buffer;
  tty?: boolean;
  stdout?: boolean;
  stderr?: boolean;
  resize?: { Width: number; Height: number };
  protocols?: string[];
  flowControl?: boolean;
  /** Pause reading the socket for this long once the first output arrived (a slow reader). */
  pauseAfterFirstOutputMs?: number;
  /** Called while paused. */
  whilePaused?: () => Promise<void>;
  /** Wait this long before sending stdin (lets a resize land first). */
  stdinDelayMs?: number;
}

export interface CommandResult {
  protocol: string;
  stdout: Buffer;
  stderr: Buffer;
  /** The error stream's text (a JSON Status from v4 on). */
  status: string;
}

/** Exec or attach over SPDY as client-go's remotecommand executor does. */
export async function spdyCommand(url: string, options: CommandOptions = {}): Promise<CommandResult> {
  const client = await SpdyClient.connect(
    url,
    options.protocols ?? ['v5.channel.k8s.io', 'v4.channel.k8s.io', 'v3.channel.k8s.io', 'v2.channel.k8s.io', 'channel.k8s.io'],
    { flowControl: options.flowControl },
  );
  try {
    const errorStream = await client.open({ streamType: 'error' });
    const stdin = options.stdin !== undefined ? await client.open({ streamType: 'stdin' }) : undefined;
    const stdout = options.stdout !== false ? await client.open({ streamType: 'stdout' }) : undefined;
    const stderr = options.stderr !== false && !options.tty ? await client.open({ streamType: 'stderr' }) : undefined;
    const resize = options.tty ? await client.open({ streamType: 'resize' }) : undefined;
    if (resize && options.resize) client.write(resize, Buffer.from(`${JSON.stringify(options.resize)}\n`));
    if (options.pauseAfterFirstOutputMs !== undefined && stdout) {
      await new Promise<void>((resolve) => {
        stdout.onData = resolve;
      });
      client.socket.pause();
      await options.whilePaused?.();
      await new Promise((r) => setTimeout(r, options.pauseAfterFirstOutputMs));
      client.socket.resume();
    }
    if (stdin && options.stdin !== undefined) {
      if (options.stdinDelayMs !== undefined) await new Promise((r) => setTimeout(r, options.stdinDelayMs));
      if (options.stdin.length > 0) client.write(stdin, options.stdin);
      client.write(stdin, Buffer.alloc(0), true);
    }
    const [out, err, status] = await Promise.all([
      stdout ? client.ended(stdout) : Buffer.alloc(0),
      stderr ? client.ended(stderr) : Buffer.alloc(0),
      client.ended(errorStream),
    ]);
    return { protocol: client.protocol, stdout: out, stderr: err, status: status.toString() };
  } finally {
    client.close();
  }
}

/** Exec or attach over WebSocket (v5/v4.channel.k8s.io) as client-go's websocket executor does. */
export function wsCommand(url: string, options: CommandOptions = {}): Promise<CommandResult> {
  const wsUrl = url.replace(/^http/, 'ws');
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl, options.protocols ?? ['v5.channel.k8s.io', 'v4.channel.k8s.io']);
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let status = '';
    ws.on('open', () => {
      if (options.resize) ws.send(Buffer.concat([Buffer.from([4]), Buffer.from(JSON.stringify(options.resize))]));
      if (options.stdin !== undefined) {
        if (options.stdin.length > 0) ws.send(Buffer.concat([Buffer.from([0]), options.stdin]));
        if (ws.protocol === 'v5.channel.k8s.io') ws.send(Buffer.from([255, 0]));
      }
    });
    ws.on('message', (data: Buffer) => {
      if (data.length === 0) return;
      const payload = data.subarray(1);
      if (data[0] === 1) out.push(payload);
      else if (data[0] === 2) err.push(payload);
      else if (data[0] === 3) status += payload.toString();
    });
    ws.on('close', () => resolve({ protocol: ws.protocol, stdout: Buffer.concat(out), stderr: Buffer.concat(err), status }));
    ws.on('error', reject);
  });
}

/** Exit code a client would report from a v4+ Status ('' or Success: 0). */
export function exitCodeOf(status: string): number {
  if (status === '') return 0;
  const s = JSON.parse(status) as { status: string; reason?: string; details?: { causes?: { reason: string; message: string }[] } };
  if (s.status === 'Success') return 0;
  const cause = s.details?.causes?.find((c) => c.reason === 'ExitCode');
  if (s.reason === 'NonZeroExitCode' && cause) return Number(cause.message);
  throw new Error(`not an exit status: ${status}`);
}

/**
 * A WebSocket carrying SPDY (`SPDY/3.1+portforward.k8s.io`), as kubectl 1.30+ tunnels port-forward.
 * The handshake is written by hand: `ws`'s client refuses that subprotocol name ('/' and '+' are
 * not token characters), gorilla/websocket (kubectl) sends it anyway. The upgraded socket is then
 * framed by `ws` (its internal setSocket, client side: masked frames).
 */
export function tunnelledSpdy(url: string): Promise<SpdyClient> {
  const protocol = 'SPDY/3.1+portforward.k8s.io';
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      headers: {
        Connection: 'Upgrade',
        Upgrade: 'websocket',
        'Sec-WebSocket-Version': '13',
        'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
        'Sec-WebSocket-Protocol': protocol,
      },
    });
    req.on('upgrade', (res, socket, head) => {
      if (res.headers['sec-websocket-protocol'] !== protocol) return reject(new Error('the server chose another subprotocol'));
      const ws = new WebSocket(null as unknown as string, undefined, {}) as WebSocket & {
        _isServer: boolean;
        setSocket(socket: unknown, head: Buffer, options: { maxPayload: number }): void;
      };
      ws._isServer = false;
      ws.setSocket(socket, head, { maxPayload: 64 * 1024 * 1024 });
      resolve(SpdyClient.over(createWebSocketStream(ws), protocol));
    });
    req.on('response', (res) => reject(new Error(`HTTP ${res.statusCode}`)));
    req.on('error', reject);
    req.end();
  });
}

/** One port-forward connection over SPDY (error + data stream pair), as kubectl opens one per local connection. */
export async function spdyPortForward(
  url: string,
  port: number,
  request: Buffer,
  options: { tunnel?: boolean } = {},
): Promise<{ data: Buffer; error: string }> {
  const client = options.tunnel ? await tunnelledSpdy(url) : await SpdyClient.connect(url, ['portforward.k8s.io']);
  try {
    const errorStream = await client.open({ streamType: 'error', port: String(port), requestID: '0' });
    const data = await client.open({ streamType: 'data', port: String(port), requestID: '0' });
    client.write(data, request);
    const [reply, error] = await Promise.all([client.ended(data), client.ended(errorStream)]);
    return { data: reply, error: error.toString() };
  } finally {
    client.close();
  }
}

/** Port-forward over WebSocket channels (v4.channel.k8s.io framing): sends `request`, collects until close or `untilBytes`. */
export function wsPortForward(url: string, port: number, request: Buffer, untilText: string): Promise<{ data: Buffer; error: string }> {
  const wsUrl = `${url.replace(/^http/, 'ws')}?port=${port}`;
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl, ['v4.channel.k8s.io']);
    const data: Buffer[] = [];
    let error = '';
    const seen = new Set<number>();
    ws.on('open', () => ws.send(Buffer.concat([Buffer.from([0]), request])));
    ws.on('message', (m: Buffer) => {
      const channel = m[0]!;
      let payload = m.subarray(1);
      if (!seen.has(channel)) {
        seen.add(channel);
        payload = payload.subarray(2);
      }
      if (channel === 0) data.push(payload);
      else error += payload.toString();
      if (Buffer.concat(data).toString().includes(untilText) || error !== '') ws.close();
    });
    ws.on('close', () => resolve({ data: Buffer.concat(data), error }));
    ws.on('error', reject);
  });
}
