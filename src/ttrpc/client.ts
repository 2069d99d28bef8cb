/**
 * A ttrpc client over any connected Duplex: unary calls, many at once, each on its own odd
 * stream id (1, 3, 5, ...), answered in whatever order the server finishes them.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { cancelled, exhausted, internal, type KataError, timedOut, unavailable } from '../common/errors.js';
import { type Logger, silentLogger } from '../common/logger.js';
import { RpcCode } from '../common/status-codes.js';
import { encodeFrame, FrameReader, MAX_DATA_BYTES, MessageType, type ReaderEvent } from './frames.js';
import { decodeResponse, encodeRequest, type TtrpcMetadataEntry } from './messages.js';
import './reasons.js';
import { TtrpcStatusError } from './status.js';

/** The last stream id a u32 holds; a connection that used it up takes no more calls. */
const MAX_STREAM_ID = 0xffffffff;

export interface TtrpcCallOptions {
  /**
   * How long to wait for the answer. It travels as the request's timeout_nano, so the server
   * gives up at the same time; without it the call has no deadline on either side.
   */
  timeoutMs?: number;
  /** Aborting it fails the call at once (the server is not told: ttrpc has no cancel frame). */
  signal?: AbortSignal;
  /** Request metadata; containerd reads the namespace from `containerd-namespace-ttrpc`. */
  metadata?: Readonly<Record<string, string | readonly string[]>>;
}

interface Pending {
  name: string;
  resolve: (payload: Buffer) => void;
  reject: (err: KataError) => void;
}

export class TtrpcClient {
  private readonly reader = new FrameReader();
  private readonly pending = new Map<number, Pending>();
  private nextStreamId = 1;
  /** Why calls fail now that the connection is gone (set once). */
  private ended: (() => KataError) | undefined;
  private readonly logger: Logger;
  /** Settles once the underlying stream has closed. */
  readonly closed: Promise<void>;

  constructor(
    private readonly socket: Duplex,
    options: { logger?: Logger } = {},
  ) {
    this.logger = options.logger ?? silentLogger();
    this.closed = new Promise((resolve) => socket.once('close', resolve));
    socket.on('data', (chunk: Buffer) => {
      for (const event of this.reader.push(chunk)) this.onEvent(event);
    });
    socket.on('error', (err) => this.logger.debug({ err }, 'ttrpc client connection error'));
    const lost = (): void => this.fail(() => unavailable('TTRPC_CONNECTION_LOST', 'the ttrpc connection closed.'));
    socket.once('end', lost);
    socket.once('close', lost);
  }

  /** Calls waiting for their answer. */
  get pendingCalls(): number {
    return this.pending.size;
  }

  /**
   * Calls `service`/`method` with the encoded request message `payload`; resolves to the encoded
   * response message. A status other than OK rejects with a TtrpcStatusError carrying its code.
   */
  call(service: string, method: string, payload: Uint8Array, options: TtrpcCallOptions = {}): Promise<Buffer> {
    const name = `${service}/${method}`;
    if (this.ended !== undefined) return Promise.reject(this.ended());
    const { timeoutMs, signal } = options;
    if (signal?.aborted) return Promise.reject(cancelled('TTRPC_CALL_CANCELLED', `${name} was cancelled before it was sent.`));
    if (timeoutMs !== undefined && !(timeoutMs > 0)) {
      return Promise.reject(timedOut('TTRPC_CALL_TIMEOUT', `${name} was given no time (${timeoutMs} ms).`));
    }
    if (this.nextStreamId > MAX_STREAM_ID) {
      return Promise.reject(exhausted('TTRPC_STREAM_IDS_EXHAUSTED', 'this ttrpc connection has used every stream id.'));
    }
    const data = encodeRequest({
      service,
      method,
      payload: Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength),
      timeoutNs: timeoutMs === undefined ? 0 : Math.ceil(timeoutMs * 1e6),
      metadata: metadataEntries(options.metadata),
    });
    if (data.length > MAX_DATA_BYTES) {
      return Promise.reject(
        exhausted('TTRPC_MESSAGE_TOO_LARGE', `the request of ${name} takes ${data.length} bytes, over the ${MAX_DATA_BYTES}-byte limit.`),
      );
    }
    const streamId = this.nextStreamId;
    this.nextStreamId += 2;
    return new Promise<Buffer>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.pending.delete(streamId);
      };
      const onAbort = (): void => {
        done();
        reject(cancelled('TTRPC_CALL_CANCELLED', `${name} was cancelled by its caller.`));
      };
      this.pending.set(streamId, {
        name,
        resolve: (p) => {
          done();
          resolve(p);
        },
        reject: (e) => {
          done();
          reject(e);
        },
      });
      signal?.addEventListener('abort', onAbort, { once: true });
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          done();
          reject(timedOut('TTRPC_CALL_TIMEOUT', `${name} got no answer within ${timeoutMs} ms.`));
        }, timeoutMs);
      }
      this.socket.write(encodeFrame(streamId, MessageType.REQUEST, 0, data));
    });
  }

  /** Ends the connection; calls still waiting fail as cancelled. */
  async close(): Promise<void> {
    this.fail(() => cancelled('TTRPC_CLIENT_CLOSED', 'the ttrpc client was closed.'));
    // Nothing of ours is left to flush: every call still waiting has just failed.
    this.socket.destroy();
    await this.closed;
  }

  private onEvent(event: ReaderEvent): void {
    if (event.kind === 'oversize') {
      const call = this.pending.get(event.header.streamId);
      call?.reject(
        exhausted(
          'TTRPC_MESSAGE_TOO_LARGE',
          `the answer to ${call.name} took ${event.header.dataBytes} bytes, over the ${MAX_DATA_BYTES}-byte limit.`,
        ),
      );
      return;
    }
    const { streamId, type, data } = event.frame;
    const call = this.pending.get(streamId);
    if (call === undefined) {
      // An answer that came after its call timed out or was cancelled.
      this.logger.debug({ streamId, type }, 'ttrpc frame for no waiting call');
      return;
    }
    if (type !== MessageType.RESPONSE) {
      call.reject(internal('TTRPC_PROTOCOL', `the answer to ${call.name} came as a frame of type ${type}, not a response.`));
      return;
    }
    try {
      const response = decodeResponse(data);
      if (response.status.code === RpcCode.OK) call.resolve(response.payload);
      else call.reject(new TtrpcStatusError(response.status.code, response.status.message));
    } catch (err) {
      call.reject(err as KataError);
    }
  }

  private fail(reason: () => KataError): void {
    if (this.ended !== undefined) return;
    this.ended = reason;
    for (const call of [...this.pending.values()]) call.reject(reason());
  }
}

/** Connects to the ttrpc server listening on the unix socket `socketPath`. */
export async function connectTtrpc(socketPath: string, options: { logger?: Logger; timeoutMs?: number } = {}): Promise<TtrpcClient> {
  const socket = net.connect(socketPath);
  await new Promise<void>((resolve, reject) => {
    const timer =
      options.timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            socket.destroy();
            reject(timedOut('TTRPC_CONNECT_TIMEOUT', `connecting to ${socketPath} took over ${options.timeoutMs} ms.`));
          }, options.timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      resolve();
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      reject(unavailable('TTRPC_CONNECTION_LOST', `cannot connect to the ttrpc socket ${socketPath}.`, { cause: err }));
    });
  });
  return new TtrpcClient(socket, { logger: options.logger });
}

function metadataEntries(metadata: TtrpcCallOptions['metadata']): TtrpcMetadataEntry[] {
  if (metadata === undefined) return [];
  return Object.entries(metadata).flatMap(([key, value]) =>
    typeof value === 'string' ? [{ key, value }] : (value as readonly string[]).map((v) => ({ key, value: v })),
  );
}
