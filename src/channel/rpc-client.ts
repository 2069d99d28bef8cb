import { cancelled, isReason, KataError, timedOut, unavailable } from '../common/errors.js';
import type { MessageCodec } from './codec.js';
import { decodeErrorRecord, encodeRecord, RecordKind, readRecords } from './records.js';
import type { CallOptions, Init, MethodShape, MethodsOfKind, MethodTable, StreamCallOptions } from './rpc-types.js';
import type { Session } from './session.js';
import type { ChannelStream } from './stream.js';

type Req<T extends Shapes<T>, K extends keyof T> = T[K]['request'];
type Res<T extends Shapes<T>, K extends keyof T> = T[K]['response'];
type Shapes<T> = { [K in keyof T]: MethodShape };

/** The sending half of a client- or bidi-streaming call. */
export interface CallWriter<R> {
  /** Resolves once the channel took the message (credits): awaiting it is the backpressure. */
  send(request: Init<R>): Promise<void>;
  /** No more requests (END). */
  end(): void;
  /** Abandon the call (RESET). */
  cancel(): void;
}

/**
 * Typed calls over a session (or whatever session is current: `sessionOf` is asked per call,
 * so a client that reconnected keeps working). Every call opens one stream; errors arrive as
 * KataErrors: the server's own (kind and reason preserved), a timeout (CHANNEL_CALL_TIMEOUT,
 * the stream reset so the server stops too), or CHANNEL_SESSION_CLOSED when the link went away.
 */
export class RpcClient<T extends Shapes<T>> {
  constructor(
    private readonly sessionOf: () => Session,
    private readonly table: MethodTable<T>,
    private readonly codec: MessageCodec,
  ) {}

  async unary<K extends MethodsOfKind<T, 'unary'>>(method: K, request: Init<Req<T, K>>, options: CallOptions): Promise<Res<T, K>> {
    const call = this.start(method, options);
    try {
      call.stream.end(this.message(method, 'request', request));
      return (await this.single(call.stream, method)) as Res<T, K>;
    } catch (err) {
      throw call.translate(err);
    } finally {
      call.done();
    }
  }

  async *serverStream<K extends MethodsOfKind<T, 'serverStream'>>(
    method: K,
    request: Init<Req<T, K>>,
    options: StreamCallOptions = {},
  ): AsyncGenerator<Res<T, K>> {
    const call = this.start(method, options);
    try {
      call.stream.end(this.message(method, 'request', request));
      for await (const value of this.responses(call.stream, method)) yield value as Res<T, K>;
    } catch (err) {
      throw call.translate(err);
    } finally {
      call.done();
    }
  }

  clientStream<K extends MethodsOfKind<T, 'clientStream'>>(
    method: K,
    options: StreamCallOptions = {},
  ): CallWriter<Req<T, K>> & { response: Promise<Res<T, K>> } {
    const call = this.start(method, options);
    const response = this.single(call.stream, method).then(
      (v) => v as Res<T, K>,
      (err: unknown) => {
        throw call.translate(err);
      },
    );
    response.then(call.done, call.done);
    return { ...this.writer(call.stream, method), response };
  }

  bidi<K extends MethodsOfKind<T, 'bidi'>>(
    method: K,
    options: StreamCallOptions = {},
  ): CallWriter<Req<T, K>> & { responses: AsyncGenerator<Res<T, K>> } {
    const call = this.start(method, options);
    const self = this;
    async function* responses(): AsyncGenerator<Res<T, K>> {
      try {
        for await (const value of self.responses(call.stream, method)) yield value as Res<T, K>;
      } catch (err) {
        throw call.translate(err);
      } finally {
        call.done();
      }
    }
    return { ...this.writer(call.stream, method), responses: responses() };
  }

  private writer(stream: ChannelStream, method: keyof T & string): CallWriter<never> {
    return {
      send: (request) =>
        new Promise<void>((resolve, reject) => {
          if (stream.destroyed || stream.writableEnded)
            return reject(cancelled('CHANNEL_CALL_CLOSED', `${method} no longer takes requests.`));
          stream.write(this.message(method, 'request', request), (err) => (err ? reject(err) : resolve()));
        }),
      end: () => {
        if (!stream.destroyed) stream.end();
      },
      cancel: () => stream.destroy(cancelled('CHANNEL_CALL_CANCELLED', `${method} was cancelled by the caller.`)),
    };
  }

  private message(method: keyof T & string, side: 'request' | 'response', value: unknown): Buffer {
    return encodeRecord(RecordKind.MESSAGE, this.codec.encode(this.table[method][side], value));
  }

  private async single(stream: ChannelStream, method: keyof T & string): Promise<unknown> {
    let result: unknown;
    let seen = false;
    for await (const value of this.responses(stream, method)) {
      result = value;
      seen = true;
    }
    if (!seen) throw new KataError('internal', 'CHANNEL_MISSING_RESPONSE', `${method} ended without a response.`);
    return result;
  }

  private async *responses(stream: ChannelStream, method: keyof T & string): AsyncGenerator<unknown> {
    for await (const rec of readRecords(stream)) {
      if (rec.kind === RecordKind.ERROR) throw decodeErrorRecord(rec.body);
      yield this.codec.decode(this.table[method].response, rec.body);
    }
  }

  private start(method: keyof T & string, options: StreamCallOptions) {
    const session = this.sessionOf();
    const timeoutMs = options.timeoutMs ?? 0;
    const stream = session.open(method, timeoutMs);
    // Errors surface through reads and writes; an unheard 'error' event would end the process.
    stream.on('error', () => {});
    let why: KataError | undefined;
    const abort = (err: KataError): void => {
      why ??= err;
      stream.destroy(err);
    };
    const timer =
      timeoutMs > 0
        ? setTimeout(() => abort(timedOut('CHANNEL_CALL_TIMEOUT', `${method} did not finish within ${timeoutMs} ms.`)), timeoutMs)
        : undefined;
    const onAbort = (): void => abort(cancelled('CHANNEL_CALL_CANCELLED', `${method} was cancelled by the caller.`));
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener('abort', onAbort, { once: true });
    return {
      stream,
      /** Our own timeout or cancel wins over the stream error it caused. */
      translate: (err: unknown): unknown => {
        if (why !== undefined) return why;
        if (session.closed && !(err instanceof KataError && !isReason(err, 'CHANNEL_STREAM_CANCELLED')))
          return unavailable('CHANNEL_SESSION_CLOSED', `${method} failed: the channel session closed.`, { cause: err });
        return err;
      },
      done: (): void => {
        if (timer !== undefined) clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        if (!stream.destroyed && stream.writableEnded && stream.readableEnded) return;
        if (!stream.destroyed && !stream.readableEnded) stream.destroy();
      },
    };
  }
}
