/**
 * How RPC messages ride on a channel stream: records of `[u8 kind][u32 length][body]`. A
 * MESSAGE record holds one encoded protobuf message; an ERROR record (the server's last word
 * on a failed call) holds a KataError as JSON, so kind and reason cross the channel intact.
 */
import { Buffer } from 'node:buffer';
import type { Readable } from 'node:stream';
import { ERROR_KINDS, type ErrorKind, exhausted, KataError, type Reason } from '../common/errors.js';

export const RecordKind = { MESSAGE: 1, ERROR: 2 } as const;
/** The largest single message (an OCI config.json is far smaller). */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

export function encodeRecord(kind: number, body: Uint8Array): Buffer {
  const head = Buffer.allocUnsafe(5);
  head.writeUInt8(kind, 0);
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

export function encodeErrorRecord(err: unknown): Buffer {
  const k = err instanceof KataError ? err : new KataError('internal', 'AGENT_INTERNAL', err instanceof Error ? err.message : String(err));
  const body = JSON.stringify({ kind: k.kind, reason: k.reason, message: k.message, details: k.details });
  return encodeRecord(RecordKind.ERROR, Buffer.from(body, 'utf8'));
}

const KINDS: ReadonlySet<string> = new Set(ERROR_KINDS);

export function decodeErrorRecord(body: Buffer): KataError {
  try {
    const o = JSON.parse(body.toString('utf8')) as { kind?: string; reason?: string; message?: string; details?: Record<string, unknown> };
    const kind = (typeof o.kind === 'string' && KINDS.has(o.kind) ? o.kind : 'internal') as ErrorKind;
    // The peer's reason is taken as sent: it names a code of the other side's union (the agent and
    // the host are built from one tree), and no code here branches on one it does not declare.
    return new KataError(kind, String(o.reason ?? 'AGENT_ERROR') as Reason, String(o.message ?? 'the agent reported an error.'), {
      details: o.details,
    });
  } catch {
    return new KataError('internal', 'AGENT_ERROR', 'the agent reported an unreadable error.');
  }
}

/** Records from a readable stream, pulled one at a time (so an idle consumer stops the peer). */
export async function* readRecords(stream: Readable): AsyncGenerator<{ kind: number; body: Buffer }> {
  let buf: Buffer = Buffer.alloc(0);
  for await (const chunk of readChunks(stream)) {
    buf = buf.length === 0 ? (chunk as Buffer) : Buffer.concat([buf, chunk as Buffer]);
    while (buf.length >= 5) {
      const length = buf.readUInt32BE(1);
      if (length > MAX_MESSAGE_BYTES) throw exhausted('CHANNEL_MESSAGE_TOO_LARGE', `a message of ${length} bytes exceeds the limit.`);
      if (buf.length < 5 + length) break;
      const kind = buf.readUInt8(0);
      const body = buf.subarray(5, 5 + length);
      buf = buf.subarray(5 + length);
      yield { kind, body };
    }
  }
  if (buf.length > 0) throw new KataError('internal', 'CHANNEL_TRUNCATED_MESSAGE', 'the stream ended inside a message.');
}

/**
 * The readable side's chunks. Not `for await (... of stream)`: node's iterator destroys the
 * whole Duplex when it finishes, which would reset a call whose response is still being written.
 */
export async function* readChunks(stream: Readable): AsyncGenerator<Buffer> {
  for (;;) {
    const chunk = stream.read() as Buffer | null;
    if (chunk !== null) {
      yield chunk;
      continue;
    }
    if (stream.readableEnded) return;
    if (stream.destroyed) throw stream.errored ?? new KataError('cancelled', 'CHANNEL_STREAM_CLOSED', 'the stream closed before it ended.');
    await new Promise<void>((resolve) => {
      const done = (): void => {
        stream.off('readable', done);
        stream.off('end', done);
        stream.off('close', done);
        resolve();
      };
      stream.on('readable', done);
      stream.on('end', done);
      stream.on('close', done);
    });
  }
}
