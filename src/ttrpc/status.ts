/**
 * The ttrpc face's one mapping between errors and wire statuses, in both directions. The
 * kind -> code decision itself is the shared table of src/common/status-codes.ts, the same one
 * the CRI face's gRPC mapping uses.
 */
import { errorMessage, isKataError, KataError, type KataErrorOptions } from '../common/errors.js';
import { kindOfRpcCode, RpcCode, rpcCodeName, rpcCodeOfKind } from '../common/status-codes.js';
import type { TtrpcStatus } from './messages.js';
import './reasons.js';

/**
 * A call answered with a status other than OK, on the client side; or, thrown by a handler, a
 * status to answer with exactly (to relay one received from elsewhere). `code` is the wire's
 * google.rpc code; `kind` is the KataError kind that code stands for, so callers branch on
 * either.
 */
export class TtrpcStatusError extends KataError {
  constructor(
    readonly code: number,
    message: string,
    options: KataErrorOptions = {},
  ) {
    super(kindOfRpcCode(code), 'TTRPC_STATUS', message, {
      ...options,
      details: { code, codeName: rpcCodeName(code), ...options.details },
    });
  }
}

/** The most a status message may take (UTF-8 bytes): a status is one sentence, not a dump. */
export const MAX_STATUS_MESSAGE_BYTES = 4096;

function bounded(text: string): string {
  if (Buffer.byteLength(text) <= MAX_STATUS_MESSAGE_BYTES) return text;
  let cut = text.slice(0, MAX_STATUS_MESSAGE_BYTES);
  while (Buffer.byteLength(cut) > MAX_STATUS_MESSAGE_BYTES - 16) cut = cut.slice(0, Math.floor(cut.length * 0.9));
  return `${cut} (truncated)`;
}

/**
 * The status a handler's failure is answered with: a TtrpcStatusError keeps its code, any other
 * KataError maps by kind and keeps its sentence, and anything else is a bug: INTERNAL, with its
 * message.
 */
export function statusOf(err: unknown): TtrpcStatus {
  if (err instanceof TtrpcStatusError) return { code: err.code, message: bounded(err.message) };
  if (isKataError(err)) return { code: rpcCodeOfKind(err.kind), message: bounded(err.message) };
  return { code: RpcCode.INTERNAL, message: bounded(`internal error: ${errorMessage(err)}`) };
}

export const OK_STATUS: TtrpcStatus = { code: RpcCode.OK, message: '' };
