import { status as GrpcStatus, Metadata, type ServiceError } from '@grpc/grpc-js';
import { type ErrorKind, isKataError } from '../../common/errors.js';

const KIND_TO_STATUS: Record<ErrorKind, GrpcStatus> = {
  invalid: GrpcStatus.INVALID_ARGUMENT,
  not_found: GrpcStatus.NOT_FOUND,
  exists: GrpcStatus.ALREADY_EXISTS,
  precondition: GrpcStatus.FAILED_PRECONDITION,
  exhausted: GrpcStatus.RESOURCE_EXHAUSTED,
  unimplemented: GrpcStatus.UNIMPLEMENTED,
  unavailable: GrpcStatus.UNAVAILABLE,
  timeout: GrpcStatus.DEADLINE_EXCEEDED,
  cancelled: GrpcStatus.CANCELLED,
  unauthenticated: GrpcStatus.UNAUTHENTICATED,
  internal: GrpcStatus.INTERNAL,
};

/**
 * The most a status sentence may take (UTF-8 bytes). It travels percent-encoded in an HTTP/2
 * trailer (up to 3x bigger), and a client's metadata limit is 8 KiB by default in grpc-go and
 * grpc-js: an error quoting a 200 KB id would otherwise never reach the client at all.
 */
export const MAX_DETAILS_BYTES = 1536;

/** `text` cut to MAX_DETAILS_BYTES, saying so. */
export function boundedDetails(text: string): string {
  if (Buffer.byteLength(text) <= MAX_DETAILS_BYTES) return text;
  let cut = text.slice(0, MAX_DETAILS_BYTES);
  while (Buffer.byteLength(cut) > MAX_DETAILS_BYTES - 16) cut = cut.slice(0, Math.floor(cut.length * 0.9));
  return `${cut} (truncated)`;
}

/** Metadata key carrying the stable reason code of a KataError, for clients and tests. */
export const REASON_METADATA_KEY = 'kata-ts-reason';

/**
 * The one place where errors become gRPC statuses. A KataError maps by kind and keeps its
 * sentence; anything else is a bug or an unexpected host failure: INTERNAL, with its message.
 */
export function toServiceError(err: unknown): Partial<ServiceError> & { code: GrpcStatus } {
  const metadata = new Metadata();
  if (isKataError(err)) {
    metadata.set(REASON_METADATA_KEY, err.reason);
    return { code: KIND_TO_STATUS[err.kind], details: boundedDetails(err.message), metadata };
  }
  const message = err instanceof Error ? err.message : String(err);
  metadata.set(REASON_METADATA_KEY, 'INTERNAL');
  return { code: GrpcStatus.INTERNAL, details: boundedDetails(`internal error: ${message}`), metadata };
}

/** The gRPC status name (`NOT_FOUND`) for metrics labels and logs. */
export function statusName(code: GrpcStatus): string {
  return GrpcStatus[code] ?? String(code);
}
