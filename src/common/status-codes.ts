/**
 * The google.rpc status codes, and the one table from an error's kind to its code.
 *
 * gRPC (the CRI face, src/cri/status.ts) and ttrpc (the shim face's transport, src/ttrpc) carry
 * the very same numbers in their statuses, so the decision "which code does a `not_found` get"
 * is made here once, face-neutrally; each face only adds what its wire needs (metadata,
 * truncation, the disk-full special case of the CRI face).
 */
import type { ErrorKind } from './errors.js';

/** google.rpc.Code, by name (the numbers are fixed by google/rpc/code.proto). */
export const RpcCode = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;
export type RpcCodeValue = (typeof RpcCode)[keyof typeof RpcCode];

const KIND_TO_CODE: Readonly<Record<ErrorKind, RpcCodeValue>> = {
  invalid: RpcCode.INVALID_ARGUMENT,
  not_found: RpcCode.NOT_FOUND,
  exists: RpcCode.ALREADY_EXISTS,
  precondition: RpcCode.FAILED_PRECONDITION,
  exhausted: RpcCode.RESOURCE_EXHAUSTED,
  unimplemented: RpcCode.UNIMPLEMENTED,
  unavailable: RpcCode.UNAVAILABLE,
  timeout: RpcCode.DEADLINE_EXCEEDED,
  cancelled: RpcCode.CANCELLED,
  unauthenticated: RpcCode.UNAUTHENTICATED,
  internal: RpcCode.INTERNAL,
};

/** The status code every face answers an error of `kind` with. */
export function rpcCodeOfKind(kind: ErrorKind): RpcCodeValue {
  return KIND_TO_CODE[kind];
}

const CODE_TO_KIND = new Map<number, ErrorKind>(Object.entries(KIND_TO_CODE).map(([kind, code]) => [code, kind as ErrorKind]));

/**
 * The kind of error a status code received from a peer stands for: the inverse of
 * `rpcCodeOfKind`. Codes no kind answers with (UNKNOWN, PERMISSION_DENIED, ABORTED,
 * OUT_OF_RANGE, DATA_LOSS, or a number outside the table) count as `internal`: something
 * failed that this runtime has no better word for.
 */
export function kindOfRpcCode(code: number): ErrorKind {
  return CODE_TO_KIND.get(code) ?? 'internal';
}

const NAMES = new Map<number, string>(Object.entries(RpcCode).map(([name, code]) => [code, name]));

/** `NOT_FOUND` for 5, for logs and messages; the number itself when it has no name. */
export function rpcCodeName(code: number): string {
  return NAMES.get(code) ?? String(code);
}
