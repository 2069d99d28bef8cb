/**
 * A ttrpc server: services registered by full name, served on unix sockets (or on any Duplex a
 * caller hands in), many connections at once and many calls in flight on each.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { alreadyExists, errnoCode, invalid, unavailable } from '../common/errors.js';
import { type Logger, silentLogger } from '../common/logger.js';
import { RpcCode } from '../common/status-codes.js';
import type { TtrpcMethod, TtrpcService } from './handlers.js';
import type { TtrpcRequest, TtrpcStatus } from './messages.js';
import './reasons.js';
import { ServerConnection } from './server-connection.js';

export interface TtrpcServerOptions {
  logger?: Logger;
  /**
   * Handlers running at once on one connection before the server stops reading from it until
   * one finishes (default 128). Bounds what one client can make us hold: each waiting request
   * is at most 4 MiB.
   */
  maxInFlightPerConnection?: number;
}

export class TtrpcServer {
  private readonly services = new Map<string, TtrpcService>();
  private readonly connections = new Set<ServerConnection>();
  private readonly listeners = new Set<net.Server>();
  private readonly logger: Logger;
  private readonly maxInFlight: number;
  private closing = false;

  constructor(options: TtrpcServerOptions = {}) {
    this.logger = options.logger ?? silentLogger();
    this.maxInFlight = options.maxInFlightPerConnection ?? 128;
  }

  /** Serves `methods` under the full service name `name`; a name is registered once. */
  register(name: string, methods: TtrpcService): void {
    if (name === '') throw invalid('TTRPC_SERVICE_NAME', 'a ttrpc service needs a name.');
    if (this.services.has(name)) throw alreadyExists('TTRPC_SERVICE_EXISTS', `ttrpc service ${name} is registered already.`);
    this.services.set(name, { ...methods });
  }

  /** Connections open now. */
  get connectionCount(): number {
    return this.connections.size;
  }

  /** Serves one already-connected byte stream (an accepted socket, or a test's in-memory pair). */
  serveConnection(socket: Duplex): void {
    if (this.closing) {
      socket.destroy();
      return;
    }
    const connection = new ServerConnection(socket, {
      dispatch: (request) => this.dispatch(request),
      logger: this.logger,
      maxInFlight: this.maxInFlight,
      refusing: () => this.closing,
    });
    this.connections.add(connection);
    void connection.closed.then(() => this.connections.delete(connection));
  }

  /**
   * Listens on the unix socket `socketPath`. An existing file there is not removed (it may be
   * another server's live socket): that is the caller's decision, refused here as in use.
   */
  async listen(socketPath: string): Promise<void> {
    const listener = net.createServer((socket) => this.serveConnection(socket));
    await new Promise<void>((resolve, reject) => {
      listener.once('error', (err) => {
        if (errnoCode(err) === 'EADDRINUSE') {
          reject(unavailable('TTRPC_SOCKET_IN_USE', `the ttrpc socket path ${socketPath} is in use.`, { cause: err }));
        } else reject(err);
      });
      listener.listen(socketPath, () => resolve());
    });
    listener.on('error', (err) => this.logger.error({ err, socketPath }, 'ttrpc listener failed'));
    this.listeners.add(listener);
  }

  /**
   * Stops accepting connections and new requests; every connection ends once the requests it
   * already has are answered. Settles when all listeners and connections are gone. A handler
   * that never finishes keeps its connection open: follow with destroy() after a grace period.
   */
  async close(): Promise<void> {
    this.closing = true;
    const listenersClosed = [...this.listeners].map((l) => new Promise<void>((resolve) => l.close(() => resolve())));
    this.listeners.clear();
    const connectionsClosed = [...this.connections].map((c) => {
      c.shutdown();
      return c.closed;
    });
    await Promise.all([...listenersClosed, ...connectionsClosed]);
  }

  /** Drops every connection now, aborting the signals of the handlers still running. */
  destroy(): void {
    this.closing = true;
    for (const listener of this.listeners) listener.close();
    this.listeners.clear();
    for (const connection of this.connections) connection.destroy();
  }

  private dispatch(request: TtrpcRequest): TtrpcMethod | TtrpcStatus {
    const service = this.services.get(request.service);
    if (service === undefined) {
      return { code: RpcCode.UNIMPLEMENTED, message: `service ${request.service} is not served here.` };
    }
    const method = Object.hasOwn(service, request.method) ? service[request.method] : undefined;
    if (method === undefined) {
      return { code: RpcCode.UNIMPLEMENTED, message: `method ${request.method} of service ${request.service} is not served here.` };
    }
    return method;
  }
}
