import { status as GrpcStatus, Metadata, type ServiceError } from '@grpc/grpc-js';
import { errnoCode, errorMessage, isKataError } from '../common/errors.js';
import { rpcCodeOfKind } from '../common/status-codes.js';

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

/** The disk-full system error (ENOSPC, EDQUOT) in `err` or its chain of causes, if any. */
function diskFullCause(err: unknown): (Error & { path?: string; syscall?: string }) | undefined {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = errnoCode(e);
    if (code === 'ENOSPC' || code === 'EDQUOT') return e;
  }
  return undefined;
}

/**
 * The one place where errors become gRPC statuses. A KataError maps by kind and keeps its
 * sentence. A full disk met where no layer expected it (a record, a work dir, a position file:
 * a raw ENOSPC or EDQUOT, or one an INTERNAL error carries as its cause) is RESOURCE_EXHAUSTED,
 * STATE_DISK_FULL, naming the path: the request was refused for want of space, not by a bug.
 * Anything else is a bug or an unexpected host failure: INTERNAL, with its message.
 */
export function toServiceError(err: unknown): Partial<ServiceError> & { code: GrpcStatus } {
  const metadata = new Metadata();
  const full = isKataError(err) && err.kind !== 'internal' ? undefined : diskFullCause(err);
  if (full !== undefined) {
    metadata.set(REASON_METADATA_KEY, 'STATE_DISK_FULL');
    const where = full.path === undefined ? 'the state disk' : `the disk holding ${full.path}`;
    const doing = isKataError(err) ? `: ${err.message}` : full.syscall === undefined ? '' : ` (${full.syscall})`;
    return { code: GrpcStatus.RESOURCE_EXHAUSTED, details: boundedDetails(`no space left on ${where}${doing}`), metadata };
  }
  if (isKataError(err)) {
    metadata.set(REASON_METADATA_KEY, err.reason);
    // grpc-js's status enum holds the google.rpc numbers the shared table gives.
    return { code: rpcCodeOfKind(err.kind) as GrpcStatus, details: boundedDetails(err.message), metadata };
  }
  metadata.set(REASON_METADATA_KEY, 'INTERNAL');
  return { code: GrpcStatus.INTERNAL, details: boundedDetails(`internal error: ${errorMessage(err)}`), metadata };
}

/** The gRPC status name (`NOT_FOUND`) for metrics labels and logs. */
export function statusName(code: GrpcStatus): string {
  return GrpcStatus[code] ?? String(code);
}
