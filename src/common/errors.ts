/**
 * The one error type kata-ts raises on purpose.
 *
 * Every error carries a `kind` (what class of failure it is, which decides the status code in
 * exactly one table, src/common/status-codes.ts, that both faces' wire mappings use) and a stable `reason` code that tests and
 * operators can match on without parsing prose. The message is one short sentence naming the
 * field or object concerned; it does not repeat the `cause`.
 */
/** Every kind of error; the kind alone decides the status code a face answers with. */
export const ERROR_KINDS = [
  'invalid', // the request itself is wrong: INVALID_ARGUMENT
  'not_found', // a named object does not exist: NOT_FOUND
  'exists', // an object with that identity already exists: ALREADY_EXISTS
  'precondition', // the request is well formed but the system is not in a state to accept it: FAILED_PRECONDITION
  'exhausted', // a size, count or budget is exceeded: RESOURCE_EXHAUSTED
  'unimplemented', // this runtime does not offer that operation (yet): UNIMPLEMENTED
  'unavailable', // a dependency (QEMU, systemd, a registry) could not be reached: UNAVAILABLE
  'timeout', // something did not happen in time: DEADLINE_EXCEEDED
  'cancelled', // the caller went away: CANCELLED
  'unauthenticated', // credentials missing or refused: UNAUTHENTICATED
  'internal', // a bug or an unexpected host failure: INTERNAL
] as const;
export type ErrorKind = (typeof ERROR_KINDS)[number];

/**
 * Every reason code, by area. Each area lists its codes as one union in its own `reasons.ts`
 * (`src/sizing/reasons.ts` holds `SizingReason`, ...) and adds it here by declaration merging:
 *
 *     declare module '../common/errors.js' {
 *       interface KataReasons { sizing: SizingReason }
 *     }
 *
 * so this layer imports nothing of ours while the compiler still sees the whole set: a reason
 * that no area declares (a typo) does not compile, wherever it is written.
 */
// biome-ignore lint/suspicious/noEmptyInterface: filled by declaration merging in every area's reasons.ts
export interface KataReasons {}

/** A reason code of any area: what `KataError.reason` holds and what the factories accept. */
export type Reason = KataReasons[keyof KataReasons];

export interface KataErrorOptions {
  /** The lower-level error this one explains. */
  cause?: unknown;
  /** Structured facts for logs and verbose output (numbers, paths, ids). */
  details?: Record<string, unknown>;
}

export class KataError extends Error {
  override readonly name = 'KataError';
  readonly details: Record<string, unknown> | undefined;

  constructor(
    readonly kind: ErrorKind,
    /** Stable, upper-snake code such as `SIZING_LIMIT_BELOW_REQUEST`. */
    readonly reason: Reason,
    message: string,
    options: KataErrorOptions = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.details = options.details;
  }
}

type Factory = (reason: Reason, message: string, options?: KataErrorOptions) => KataError;
const make =
  (kind: ErrorKind): Factory =>
  (reason, message, options) =>
    new KataError(kind, reason, message, options);

export const invalid = make('invalid');
export const notFound = make('not_found');
export const alreadyExists = make('exists');
export const precondition = make('precondition');
export const exhausted = make('exhausted');
export const unimplemented = make('unimplemented');
export const unavailable = make('unavailable');
export const timedOut = make('timeout');
export const cancelled = make('cancelled');
export const unauthenticated = make('unauthenticated');
export const internal = make('internal');

export function isKataError(err: unknown): err is KataError {
  return err instanceof KataError;
}

/**
 * Whether `err` is a KataError with one of `reasons`: the one way to branch on a reason, so the
 * compiler checks every name (`isReason(err, 'QMP_CLOSED')`); `err.reason` narrows to them.
 */
export function isReason<R extends Reason>(err: unknown, ...reasons: readonly R[]): err is KataError & { readonly reason: R } {
  return err instanceof KataError && (reasons as readonly Reason[]).includes(err.reason);
}

/** Best-effort message of anything thrown, for logs. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

/** The errno code of a Node system error (`ENOENT`, ...), or undefined. */
export function errnoCode(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err) {
    const code = (err as { code: unknown }).code;
    return typeof code === 'string' ? code : undefined;
  }
  return undefined;
}
