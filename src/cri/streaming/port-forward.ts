/**
 * PortForward through the guest agent (a TCP connection the agent makes to the port on the
 * guest's loopback, inside the pod), over SPDY (`portforward.k8s.io`: per connection a pair of
 * streams, `streamType` error and data with the same `requestID` and `port`) or WebSocket channels
 * (`v4.channel.k8s.io` framing: per port a data channel 2i and an error channel 2i+1, each opened
 * by a message holding the port as 2 bytes little endian). Bytes flow both ways with backpressure;
 * a reset or closed client stream cancels the agent's connection.
 */
import { Buffer } from 'node:buffer';
import type { Duplex, Writable } from 'node:stream';
import type { WebSocket } from 'ws';
import type { PortForwardStream } from '../../agent-client/client.js';
import type { Logger } from '../../common/logger.js';
import { SpdySession, type SpdyStream } from '../../spdy/session.js';
import { sendOn } from './ws-command.js';

/** Opens an agent connection to a port of the pod (throws when the sandbox has no agent). */
export type PortDialer = (port: number) => PortForwardStream;

export interface PortForwardOptions {
  sandboxId: string;
  /** Ports the CRI request named; empty: any. */
  ports: readonly number[];
  dial: PortDialer;
  logger: Logger;
}

function portAllowed(options: PortForwardOptions, port: number): boolean {
  return Number.isInteger(port) && port > 0 && port < 65536 && (options.ports.length === 0 || options.ports.includes(port));
}

/** Copy agent -> client with backpressure; resolves at the agent's end of data. */
async function agentToClient(conn: PortForwardStream, out: Writable): Promise<void> {
  for await (const data of conn.data) {
    if (out.destroyed) return;
    if (!out.write(data)) await new Promise<void>((resolve) => out.once('drain', resolve).once('close', resolve));
  }
}

/** Serve port-forward over SPDY on an upgraded socket (or a WebSocket tunnel's byte stream). */
export function serveSpdyPortForward(socket: Duplex, options: PortForwardOptions): SpdySession {
  const pairs = new Map<string, { data?: SpdyStream; error?: SpdyStream }>();
  const session = new SpdySession(socket, {
    maxStreams: 256,
    onStream: (stream) => {
      const type = stream.header('streamtype');
      const requestId = stream.header('requestid') ?? stream.header('port') ?? '';
      if (type !== 'data' && type !== 'error') return false;
      const pair = pairs.get(requestId) ?? {};
      if (pair[type] !== undefined) return false;
      pair[type] = stream;
      pairs.set(requestId, pair);
      stream.on('error', () => {});
      // A half pair whose stream goes before its partner arrives is forgotten.
      stream.once('close', () => {
        if (pairs.get(requestId) === pair) pairs.delete(requestId);
      });
      if (pair.data !== undefined && pair.error !== undefined) {
        pairs.delete(requestId);
        void forwardPair(pair.data, pair.error, options);
      }
      return true;
    },
  });
  return session;
}

async function forwardPair(data: SpdyStream, error: SpdyStream, options: PortForwardOptions): Promise<void> {
  const port = Number(data.header('port'));
  error.resume();
  const fail = (message: string) => {
    if (!error.destroyed) error.end(message);
    data.destroy();
  };
  if (!portAllowed(options, port)) {
    fail(`port ${data.header('port')} is not forwarded for pod sandbox ${options.sandboxId}`);
    return;
  }
  let conn: PortForwardStream;
  try {
    conn = options.dial(port);
  } catch (err) {
    fail(`error forwarding port ${port} to pod ${options.sandboxId}: ${String(err instanceof Error ? err.message : err)}`);
    return;
  }
  data.once('close', () => conn.cancel());
  const upstream = (async () => {
    for await (const chunk of data) await conn.write(chunk as Buffer);
    conn.end();
  })();
  upstream.catch(() => conn.cancel());
  try {
    await agentToClient(conn, data);
    if (!data.destroyed) data.end();
    if (!error.destroyed) error.end();
  } catch (err) {
    options.logger.info({ sandboxId: options.sandboxId, port, err: String(err) }, 'port-forward connection failed');
    fail(`error forwarding port ${port} to pod ${options.sandboxId}: ${String(err instanceof Error ? err.message : err)}`);
  }
}

/** Serve port-forward over a WebSocket with channel framing; `ports` from the URL's `port` parameters. */
export function serveWsPortForward(ws: WebSocket, ports: number[], options: PortForwardOptions): void {
  const conns: (PortForwardStream | undefined)[] = [];
  ws.on('error', () => {});
  ws.on('close', () => {
    for (const c of conns) c?.cancel();
  });
  const portBytes = (p: number) => {
    const b = Buffer.alloc(2);
    b.writeUInt16LE(p);
    return b;
  };
  ports.forEach((port, i) => {
    let conn: PortForwardStream | undefined;
    let dialError = '';
    if (!portAllowed(options, port)) dialError = `port ${port} is not forwarded for pod sandbox ${options.sandboxId}`;
    else {
      try {
        conn = options.dial(port);
        conns[i] = conn;
      } catch (err) {
        dialError = `error forwarding port ${port} to pod ${options.sandboxId}: ${err instanceof Error ? err.message : String(err)}`;
      }
    }
    void (async () => {
      await sendOn(ws, 2 * i, portBytes(port)).catch(() => undefined);
      await sendOn(ws, 2 * i + 1, portBytes(port)).catch(() => undefined);
      if (conn === undefined) {
        await sendOn(ws, 2 * i + 1, Buffer.from(dialError)).catch(() => undefined);
        return;
      }
      try {
        for await (const data of conn.data) await sendOn(ws, 2 * i, Buffer.from(data));
      } catch (err) {
        const message = `error forwarding port ${port} to pod ${options.sandboxId}: ${err instanceof Error ? err.message : String(err)}`;
        await sendOn(ws, 2 * i + 1, Buffer.from(message)).catch(() => undefined);
      }
    })();
  });
  // Client data is not prefixed (only our first message per channel carries the port).
  ws.on('message', (raw: Buffer) => {
    if (raw.length === 0) return;
    const channel = raw[0]!;
    if (channel % 2 !== 0) return;
    const i = channel / 2;
    const payload = raw.subarray(1);
    const conn = conns[i];
    if (conn === undefined || payload.length === 0) return;
    ws.pause();
    conn.write(payload).then(
      () => ws.resume(),
      () => ws.resume(),
    );
  });
}
