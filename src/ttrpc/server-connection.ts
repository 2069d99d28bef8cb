/**
 * One accepted ttrpc connection on the server side: reads frames, runs each request's handler
 * concurrently, and answers every request on its own stream id as soon as it is done, in
 * whatever order handlers finish.
 */
import type { Duplex } from 'node:stream';
import { cancelled, timedOut } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { RpcCode, rpcCodeName } from '../common/status-codes.js';
import { encodeFrame, Flag, FrameReader, MAX_DATA_BYTES, MessageType, type ReaderEvent } from './frames.js';
import type { TtrpcCall, TtrpcMethod } from './handlers.js';
import { decodeRequest, encodeResponse, type TtrpcRequest, type TtrpcStatus } from './messages.js';
import { OK_STATUS, statusOf } from './status.js';

/** The longest delay setTimeout honours (2^31-1 ms, about 24.8 days); a longer deadline arms no timer. */
const MAX_TIMER_MS = 0x7fffffff;

/** Resolves a request to its handler, or to the status that refuses it. */
export type Dispatch = (request: TtrpcRequest) => TtrpcMethod | TtrpcStatus;

export interface ConnectionOptions {
  dispatch: Dispatch;
  logger: Logger;
  /** Handlers running at once on this connection before reading pauses (see README.md). */
  maxInFlight: number;
  /** Whether new requests are refused (the server is closing). */
  refusing: () => boolean;
}

export class ServerConnection {
  private readonly reader = new FrameReader();
  private lastStreamId = 0;
  private readonly inFlight = new Map<number, AbortController>();
  private ending = false;
  private gone = false;
  /** Settles once the socket has closed. */
  readonly closed: Promise<void>;

  constructor(
    private readonly socket: Duplex,
    private readonly options: ConnectionOptions,
  ) {
    this.closed = new Promise((resolve) => socket.once('close', resolve));
    socket.on('data', (chunk: Buffer) => {
      for (const event of this.reader.push(chunk)) this.onEvent(event);
    });
    socket.on('drain', () => this.resumeIfIdle());
    socket.on('error', (err) => options.logger.debug({ err }, 'ttrpc connection error'));
    socket.once('close', () => this.onGone());
  }

  /** Requests whose answer is not written yet. */
  get inFlightCount(): number {
    return this.inFlight.size;
  }

  /** Ends the connection once nothing is in flight; until then its requests still get answers. */
  shutdown(): void {
    this.ending = true;
    this.endIfIdle();
  }

  /** Aborts every handler and drops the connection now. */
  destroy(): void {
    this.socket.destroy();
  }

  private onEvent(event: ReaderEvent): void {
    if (event.kind === 'oversize') {
      const { streamId, dataBytes } = event.header;
      this.answer(streamId, refusal(RpcCode.RESOURCE_EXHAUSTED, `a frame of ${dataBytes} bytes exceeds the ${MAX_DATA_BYTES}-byte limit.`));
      return;
    }
    const { streamId, type, flags, data } = event.frame;
    if (streamId % 2 !== 1) {
      this.answer(streamId, refusal(RpcCode.INVALID_ARGUMENT, `stream id ${streamId} is even: client streams use odd ids.`));
      return;
    }
    if (type === MessageType.DATA) {
      this.answer(streamId, refusal(RpcCode.INVALID_ARGUMENT, `stream ${streamId} takes no data: this server serves unary calls only.`));
      return;
    }
    // Message types added by later protocol versions are skipped, as containerd's server does.
    if (type !== MessageType.REQUEST) return;
    if (streamId <= this.lastStreamId) {
      this.answer(
        streamId,
        refusal(RpcCode.INVALID_ARGUMENT, `stream id ${streamId} is not above the last one used (${this.lastStreamId}).`),
      );
      return;
    }
    this.lastStreamId = streamId;
    if (this.ending || this.options.refusing()) {
      this.answer(streamId, refusal(RpcCode.UNAVAILABLE, 'the server is closing.'));
      return;
    }
    let request: TtrpcRequest;
    try {
      request = decodeRequest(data);
    } catch (err) {
      this.answer(streamId, statusOf(err));
      return;
    }
    const target = this.options.dispatch(request);
    if (typeof target !== 'function') {
      this.answer(streamId, target);
      return;
    }
    if ((flags & (Flag.REMOTE_OPEN | Flag.REMOTE_CLOSED)) !== 0) {
      const name = `${request.service}/${request.method}`;
      this.answer(streamId, refusal(RpcCode.UNIMPLEMENTED, `${name} was called as a stream: this server serves unary calls only.`));
      return;
    }
    this.run(streamId, request, target);
  }

  private run(streamId: number, request: TtrpcRequest, method: TtrpcMethod): void {
    const name = `${request.service}/${request.method}`;
    if (request.timeoutNs < 0) {
      this.answer(streamId, refusal(RpcCode.DEADLINE_EXCEEDED, `the deadline of ${name} had passed when it arrived.`));
      return;
    }
    const controller = new AbortController();
    this.inFlight.set(streamId, controller);
    this.pauseIfBusy();
    const timeoutMs = request.timeoutNs > 0 ? request.timeoutNs / 1e6 : undefined;
    let timer: NodeJS.Timeout | undefined;
    let settled = false;
    const settle = (status: TtrpcStatus, payload?: Uint8Array): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      this.inFlight.delete(streamId);
      this.answer(streamId, status, payload);
      this.resumeIfIdle();
      this.endIfIdle();
    };
    if (timeoutMs !== undefined && timeoutMs <= MAX_TIMER_MS) {
      // The answer goes out at the deadline whether or not the handler heeds its signal: the
      // caller stops waiting then, and a late answer would be dropped anyway.
      timer = setTimeout(() => {
        const message = `${name} did not finish within its deadline of ${timeoutMs} ms.`;
        controller.abort(timedOut('TTRPC_DEADLINE', message));
        settle(refusal(RpcCode.DEADLINE_EXCEEDED, message));
      }, Math.ceil(timeoutMs));
    }
    const call: TtrpcCall = {
      service: request.service,
      method: request.method,
      signal: controller.signal,
      metadata: metadataMap(request),
      timeoutMs,
    };
    Promise.resolve()
      .then(() => method(request.payload, call))
      .then(
        (response) => {
          if (response instanceof Uint8Array) settle(OK_STATUS, response);
          else settle(refusal(RpcCode.INTERNAL, `the handler of ${name} returned no bytes.`));
        },
        (err: unknown) => {
          const status = statusOf(err);
          if (status.code === RpcCode.INTERNAL) this.options.logger.error({ err, call: name }, 'ttrpc handler failed');
          settle(status);
        },
      );
  }

  private answer(streamId: number, status: TtrpcStatus, payload: Uint8Array = Buffer.alloc(0)): void {
    if (this.gone) return;
    let data = encodeResponse({ status, payload: Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength) });
    if (data.length > MAX_DATA_BYTES) {
      const message = `the response of ${data.length} bytes exceeds the ${MAX_DATA_BYTES}-byte limit.`;
      data = encodeResponse({ status: refusal(RpcCode.RESOURCE_EXHAUSTED, message), payload: Buffer.alloc(0) });
    }
    if (status.code !== RpcCode.OK) {
      this.options.logger.debug({ streamId, code: rpcCodeName(status.code), message: status.message }, 'ttrpc refusal');
    }
    this.socket.write(encodeFrame(streamId, MessageType.RESPONSE, 0, data));
    this.pauseIfBusy();
  }

  /**
   * Reading pauses while too many handlers run or the peer is not reading our answers, so a
   * client that floods requests is slowed by its socket instead of growing our memory.
   */
  private pauseIfBusy(): void {
    if (this.inFlight.size >= this.options.maxInFlight || this.socket.writableNeedDrain) this.socket.pause();
  }

  private resumeIfIdle(): void {
    if (this.gone || !this.socket.isPaused()) return;
    if (this.inFlight.size < this.options.maxInFlight && !this.socket.writableNeedDrain) this.socket.resume();
  }

  private endIfIdle(): void {
    if (this.ending && this.inFlight.size === 0 && !this.gone) this.socket.end();
  }

  private onGone(): void {
    this.gone = true;
    for (const controller of this.inFlight.values()) {
      controller.abort(cancelled('TTRPC_CONNECTION_LOST', 'the client connection closed.'));
    }
    this.inFlight.clear();
  }
}

function refusal(code: number, message: string): TtrpcStatus {
  return { code, message };
}

function metadataMap(request: TtrpcRequest): ReadonlyMap<string, readonly string[]> {
  const map = new Map<string, string[]>();
  for (const { key, value } of request.metadata) {
    const values = map.get(key);
    if (values === undefined) map.set(key, [value]);
    else values.push(value);
  }
  return map;
}
