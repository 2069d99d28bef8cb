/**
 * The streaming server the CRI's Exec, Attach and PortForward answer with: plain HTTP or TLS on
 * the configured address, routes `/exec/{token}`, `/attach/{token}`, `/portforward/{token}` (GET
 * or POST), each upgraded to SPDY/3.1 (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version`
 * negotiation) or WebSocket (subprotocols). A token is consumed by the first connection that
 * names it. `close()` ends every open stream with an error status and stops listening.
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { createWebSocketStream, type WebSocket, WebSocketServer } from 'ws';
import type { AgentClient } from '../../agent-client/index.js';
import { invalid } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { StreamingConfig } from '../../config/types.js';
import type { CommandChannels } from '../../runtime/container/command-channels.js';
import { runAttach, runExec } from '../../runtime/container/commands.js';
import type { ContainerRecord } from '../../runtime/container/record.js';
import { COMMAND_PROTOCOLS, PORT_FORWARD_PROTOCOL } from './channels.js';
import { serveSpdyPortForward, serveWsPortForward } from './port-forward.js';
import type { StreamRequest } from './requests.js';
import { serveSpdyCommand } from './spdy-command.js';
import { TokenStore } from './tokens.js';
import { wsCommandChannels } from './ws-command.js';

/** Where streams go: resolved when a client connects (the container may have stopped since). */
export interface StreamingTargets {
  /** A running container and its sandbox's agent; throws NOT_FOUND or FAILED_PRECONDITION. */
  container(id: string): { agent: AgentClient; record: ContainerRecord };
  /** The agent of a ready sandbox; throws NOT_FOUND or FAILED_PRECONDITION. */
  sandboxAgent(id: string): AgentClient;
}

/**
 * The `streaming` section of the config file as it is (one definition of each knob, documented
 * there), plus what only the daemon can supply: where streams go, and the logger.
 */
export type StreamingServerOptions = StreamingConfig & {
  targets: StreamingTargets;
  logger: Logger;
};

const ROUTE = /^\/(exec|attach|portforward)\/([A-Za-z0-9_-]{1,64})$/;
const WS_COMMAND_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
/** kubectl 1.30+ tunnels the SPDY port-forward protocol through a WebSocket with this subprotocol. */
const WS_SPDY_TUNNEL = `SPDY/3.1+${PORT_FORWARD_PROTOCOL}`;
/**
 * `/` and `+` are not token characters (RFC 6455 / 7230), so `ws` refuses that name in the
 * handshake: it is swapped for this token on the way in and swapped back in our 101 response.
 */
const WS_SPDY_TUNNEL_TOKEN = 'kata-ts.spdy-tunnel.portforward.k8s.io';
const WS_PORT_FORWARD_PROTOCOLS = [WS_SPDY_TUNNEL_TOKEN, 'v4.channel.k8s.io', PORT_FORWARD_PROTOCOL];

/** `host:port` -> parts; IPv6 hosts in brackets. */
export function parseListenAddress(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(':');
  const host = address.slice(0, at).replace(/^\[(.*)\]$/, '$1');
  const port = Number(address.slice(at + 1));
  if (at <= 0 || host === '' || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw invalid('STREAM_SERVER_ADDRESS_INVALID', `streaming.address ${JSON.stringify(address)} is not host:port.`);
  }
  return { host, port };
}

/** The client's protocol list from a header that may repeat (node joins repeats with ", "). */
function clientProtocols(header: string | string[] | undefined): string[] {
  const joined = Array.isArray(header) ? header.join(',') : (header ?? '');
  return joined
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p !== '');
}

export class StreamingServer {
  private readonly tokens: TokenStore<StreamRequest>;
  private readonly wss = new WebSocketServer({
    noServer: true,
    perMessageDeflate: false,
    handleProtocols: (p, req) => this.pickWs(p, req),
  });
  private readonly active = new Set<(reason: string) => void>();
  /** Exec and attach runs under way, so close() can let them clean up (kill, delete) first. */
  private readonly runs = new Set<Promise<void>>();

  private constructor(
    private readonly options: StreamingServerOptions,
    private readonly server: http.Server | https.Server,
    /** Scheme, host and port the URLs carry. */
    readonly baseUrl: string,
  ) {
    this.tokens = new TokenStore({ ttlMs: options.tokenTtlMs, maxInFlight: options.maxTokensInFlight });
    server.on('request', (req, res) => {
      const known = ROUTE.test(new URL(req.url ?? '/', 'http://x').pathname);
      res.writeHead(known ? 400 : 404, { 'content-type': 'text/plain' });
      res.end(known ? 'this endpoint needs an Upgrade to SPDY/3.1 or websocket\n' : 'not found\n');
    });
    server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => this.onUpgrade(req, socket, head));
    this.wss.on('headers', (headers: string[]) => {
      const at = headers.indexOf(`Sec-WebSocket-Protocol: ${WS_SPDY_TUNNEL_TOKEN}`);
      if (at >= 0) headers[at] = `Sec-WebSocket-Protocol: ${WS_SPDY_TUNNEL}`;
    });
  }

  /** Listen on the configured address (TLS when a certificate and key are configured). */
  static async start(options: StreamingServerOptions): Promise<StreamingServer> {
    const { host, port } = parseListenAddress(options.address);
    let server: http.Server | https.Server;
    if (options.tlsCertPath !== null || options.tlsKeyPath !== null) {
      if (options.tlsCertPath === null || options.tlsKeyPath === null) {
        throw invalid('STREAM_TLS_FILES', 'streaming.tlsCertPath and streaming.tlsKeyPath must be set together.');
      }
      server = https.createServer({ cert: readFileSync(options.tlsCertPath), key: readFileSync(options.tlsKeyPath) });
    } else server = http.createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const bound = (server.address() as AddressInfo).port;
    const urlHost = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host.includes(':') ? `[${host}]` : host;
    const scheme = server instanceof https.Server ? 'https' : 'http';
    return new StreamingServer(options, server, `${scheme}://${urlHost}:${bound}`);
  }

  /** A URL for a validated request (the token is single-use and expires). */
  urlFor(request: StreamRequest): string {
    return `${this.baseUrl}/${request.kind}/${this.tokens.issue(request)}`;
  }

  /** Outstanding tokens (for tests). */
  get tokensInFlight(): number {
    return this.tokens.size;
  }

  /** Connections open now. */
  get openStreams(): number {
    return this.active.size;
  }

  /** End every open stream with an error, let their processes be killed (bounded), stop listening. */
  async close(timeoutMs = 5000): Promise<void> {
    for (const end of [...this.active]) end('kata-ts is shutting down: the stream was ended');
    const settled = Promise.allSettled([...this.runs]);
    await Promise.race([settled, new Promise((resolve) => setTimeout(resolve, timeoutMs).unref())]);
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections?.();
    });
    this.wss.close();
  }

  private pickWs(offered: Set<string>, req: http.IncomingMessage): string | false {
    const kind = ROUTE.exec(new URL(req.url ?? '/', 'http://x').pathname)?.[1];
    const ours = kind === 'portforward' ? WS_PORT_FORWARD_PROTOCOLS : WS_COMMAND_PROTOCOLS;
    return ours.find((p) => offered.has(p)) ?? false;
  }

  private onUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on('error', () => {});
    const url = new URL(req.url ?? '/', 'http://x');
    const match = ROUTE.exec(url.pathname);
    const refuse = (code: number, text: string, extra = ''): undefined => {
      socket.end(`HTTP/1.1 ${code} ${http.STATUS_CODES[code]}\r\nContent-Type: text/plain\r\nConnection: close\r\n${extra}\r\n${text}\n`);
    };
    if (match === null) return void refuse(404, 'not found');
    if (req.method !== 'GET' && req.method !== 'POST') return void refuse(405, 'only GET and POST');
    const request = this.tokens.consume(match[2]!);
    if (request === undefined || request.kind !== match[1]) return void refuse(404, 'unknown or expired token');
    const upgrade = (req.headers.upgrade ?? '').toLowerCase();
    this.closeWhenIdle(socket, match[1]!);
    if (upgrade === 'websocket') {
      const offered = req.headers['sec-websocket-protocol'];
      if (typeof offered === 'string' && offered.includes(WS_SPDY_TUNNEL)) {
        req.headers['sec-websocket-protocol'] = offered.replaceAll(WS_SPDY_TUNNEL, WS_SPDY_TUNNEL_TOKEN);
      }
      this.wss.handleUpgrade(req, socket, head, (ws) => this.serveWs(ws, request, url));
      return;
    }
    if (upgrade !== 'spdy/3.1') return void refuse(400, `unsupported upgrade ${JSON.stringify(req.headers.upgrade ?? '')}`);
    const supported = request.kind === 'portforward' ? [PORT_FORWARD_PROTOCOL] : COMMAND_PROTOCOLS;
    const offered = clientProtocols(req.headers['x-stream-protocol-version']);
    const protocol = offered.length === 0 ? supported[supported.length - 1]! : offered.find((p) => supported.includes(p));
    if (protocol === undefined) {
      return void refuse(
        403,
        `unable to upgrade: unable to negotiate protocol: client supports ${JSON.stringify(offered)}, server supports ${JSON.stringify(supported)}`,
        `X-Accepted-Stream-Protocol-Versions: ${supported.join(', ')}\r\n`,
      );
    }
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${protocol}\r\n\r\n`,
    );
    (socket as { setNoDelay?: (on: boolean) => void }).setNoDelay?.(true);
    if (head.length > 0) socket.unshift(head);
    this.serveSpdy(socket, request, protocol);
  }

  /**
   * No byte either way for streamIdleTimeoutMs: the connection is destroyed, which every session
   * treats as a client that left (an exec is killed, a port-forward's connections closed).
   * Any frame counts, pings included: a client that pings is never idle. 4 hours by default, as
   * containerd's stream_idle_timeout.
   */
  private closeWhenIdle(socket: Duplex, kind: string): void {
    const timed = socket as Duplex & { setTimeout?: (ms: number, cb: () => void) => void };
    timed.setTimeout?.(this.options.streamIdleTimeoutMs, () => {
      this.options.logger.info({ kind, idleMs: this.options.streamIdleTimeoutMs }, 'stream connection idle: closed');
      socket.destroy();
    });
  }

  private serveSpdy(socket: Duplex, request: StreamRequest, protocol: string): void {
    const { logger } = this.options;
    if (request.kind === 'portforward') {
      const session = this.portForwardSession(socket, request);
      if (session === undefined) return;
      const end = () => session.close();
      this.active.add(end);
      session.once('close', () => this.active.delete(end));
      return;
    }
    let channelsRef: CommandChannels | undefined;
    const { session, done } = serveSpdyCommand({
      socket,
      protocol,
      request,
      streamCreationTimeoutMs: this.options.streamCreationTimeoutMs,
      logger,
      run: (channels) => {
        channelsRef = channels;
        return this.runCommand(request, channels);
      },
    });
    const end = (reason: string) => {
      if (channelsRef !== undefined) void channelsRef.finish({ error: reason });
      else session.close();
    };
    this.active.add(end);
    void done.finally(() => this.active.delete(end));
  }

  private serveWs(ws: WebSocket, request: StreamRequest, url: URL): void {
    if (request.kind === 'portforward') {
      if (ws.protocol === WS_SPDY_TUNNEL_TOKEN) {
        const tunnel = createWebSocketStream(ws);
        tunnel.on('error', () => {});
        const session = this.portForwardSession(tunnel, request);
        if (session === undefined) return;
        const end = () => session.close();
        this.active.add(end);
        session.once('close', () => this.active.delete(end));
        return;
      }
      const ports = url.searchParams.getAll('port').map(Number);
      try {
        const agent = this.options.targets.sandboxAgent(request.sandboxId);
        serveWsPortForward(ws, ports, { ...request, dial: (p) => agent.portForward(p), logger: this.options.logger });
      } catch (err) {
        ws.close(1011, (err instanceof Error ? err.message : String(err)).slice(0, 120));
        return;
      }
      const end = () => ws.close(1001, 'kata-ts is shutting down');
      this.active.add(end);
      ws.once('close', () => this.active.delete(end));
      return;
    }
    const channels = wsCommandChannels(ws, ws.protocol, request);
    const end = (reason: string) => void channels.finish({ error: reason });
    this.active.add(end);
    ws.once('close', () => this.active.delete(end));
    this.runCommand(request, channels).catch((err: unknown) =>
      channels.finish({ error: err instanceof Error ? err.message : String(err) }),
    );
  }

  private portForwardSession(socket: Duplex, request: StreamRequest & { kind: 'portforward' }) {
    let agent: AgentClient;
    try {
      agent = this.options.targets.sandboxAgent(request.sandboxId);
    } catch (err) {
      this.options.logger.info({ sandboxId: request.sandboxId, err: String(err) }, 'port-forward to a sandbox without an agent');
      socket.destroy();
      return undefined;
    }
    return serveSpdyPortForward(socket, { ...request, dial: (p) => agent.portForward(p), logger: this.options.logger });
  }

  private runCommand(request: StreamRequest, channels: CommandChannels): Promise<void> {
    const run = (async () => {
      if (request.kind === 'portforward') return;
      const { agent, record } = this.options.targets.container(request.containerId);
      if (request.kind === 'exec') await runExec(agent, record, request.cmd, request.tty, channels, this.options.logger);
      else await runAttach(agent, record, channels, this.options.logger);
    })();
    const tracked = run.catch(() => undefined);
    this.runs.add(tracked);
    void tracked.finally(() => this.runs.delete(tracked));
    return run;
  }
}
