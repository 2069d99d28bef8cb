import { Buffer } from 'node:buffer';
import { cancelled, errorMessage, invalid, isKataError, timedOut, unimplemented } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { MessageCodec } from './codec.js';
import { encodeErrorRecord, encodeRecord, RecordKind, readRecords } from './records.js';
import type { CallContext, MethodTable, ServerHandlers } from './rpc-types.js';
import type { Session } from './session.js';
import type { ChannelStream } from './stream.js';

/** Write and wait until the stream took it (its credits): how a slow reader slows the handler. */
function writeRecord(stream: ChannelStream, record: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    if (stream.destroyed) return reject(stream.errored ?? cancelled('CHANNEL_STREAM_CANCELLED', 'the stream is gone.'));
    stream.write(record, (err) => (err ? reject(err) : resolve()));
  });
}

async function* decodeRequests(stream: ChannelStream, codec: MessageCodec, typeName: string): AsyncGenerator<unknown> {
  for await (const rec of readRecords(stream)) {
    if (rec.kind !== RecordKind.MESSAGE) throw invalid('CHANNEL_BAD_RECORD', 'a request stream carried a non-message record.');
    yield codec.decode(typeName, rec.body);
  }
}

/**
 * Serve the method table's calls on every stream a session's peer opens. Each stream is one
 * call: the handler gets decoded requests and a context whose signal fires on the caller's
 * deadline (carried in OPEN), a reset, or the session's end; what it returns or yields is
 * encoded back; what it throws goes back as an ERROR record with the KataError's kind and reason.
 */
export function serveRpc<T>(
  session: Session,
  table: MethodTable<T>,
  handlers: ServerHandlers<T>,
  codec: MessageCodec,
  logger?: Logger,
): void {
  session.onStream((stream, method, timeoutMs) => {
    void runCall(stream, method, timeoutMs);
  });

  async function runCall(stream: ChannelStream, method: string, timeoutMs: number): Promise<void> {
    const controller = new AbortController();
    stream.on('error', () => {});
    const timer =
      timeoutMs > 0
        ? setTimeout(() => controller.abort(timedOut('CHANNEL_CALL_TIMEOUT', `${method} passed its deadline.`)), timeoutMs)
        : undefined;
    stream.once('close', () => controller.abort(cancelled('CHANNEL_CALL_CANCELLED', `${method} was cancelled.`)));
    const ctx: CallContext = { method, signal: controller.signal };
    try {
      const spec = Object.hasOwn(table, method) ? table[method as keyof T] : undefined;
      if (spec === undefined) throw unimplemented('AGENT_UNKNOWN_METHOD', `the agent has no method ${method}.`);
      const handler = handlers[method as keyof T] as unknown as (input: unknown, ctx: CallContext) => unknown;
      const requests = decodeRequests(stream, codec, spec.request);
      let input: unknown = requests;
      if (spec.kind === 'unary' || spec.kind === 'serverStream') {
        const first = await requests.next();
        if (first.done) throw invalid('CHANNEL_MISSING_REQUEST', `${method} was called without a request.`);
        input = first.value;
      }
      const out = handler(input, ctx);
      if (spec.kind === 'unary' || spec.kind === 'clientStream') {
        const response = await (out as Promise<unknown>);
        await writeRecord(stream, encodeRecord(RecordKind.MESSAGE, codec.encode(spec.response, response)));
      } else {
        for await (const response of out as AsyncIterable<unknown>) {
          await writeRecord(stream, encodeRecord(RecordKind.MESSAGE, codec.encode(spec.response, response)));
        }
      }
      stream.end();
    } catch (err) {
      if (stream.destroyed) return;
      if (!isKataError(err)) logger?.error({ method, err: errorMessage(err) }, 'agent call failed unexpectedly');
      try {
        await writeRecord(stream, encodeErrorRecord(err));
        stream.end();
      } catch {
        stream.destroy();
      }
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
  }
}

export const EMPTY_BUFFER = Buffer.alloc(0);
