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
    return { code: KIND_TO_STATUS[err.kind], details: err.message, metadata };
  }
  const message = err instanceof Error ? err.message : String(err);
  metadata.set(REASON_METADATA_KEY, 'INTERNAL');
  return { code: GrpcStatus.INTERNAL, details: `internal error: ${message}`, metadata };
}

/** The gRPC status name (`NOT_FOUND`) for metrics labels and logs. */
export function statusName(code: GrpcStatus): string {
  return GrpcStatus[code] ?? String(code);
}
