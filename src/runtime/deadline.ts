import { cancelled, isKataError, timedOut } from '../common/errors.js';
import type { RequestContext } from './context.js';

/**
 * How long an operation may wait: its configured timeout, cut to what is left of the caller's
 * gRPC deadline minus `reserveMs` (kept for rolling back cleanly), and never below 1 ms.
 */
export function boundedTimeoutMs(configuredMs: number, ctx: Pick<RequestContext, 'deadlineMs'>, reserveMs = 3000): number {
  if (ctx.deadlineMs === undefined) return configuredMs;
  return Math.max(1, Math.min(configuredMs, ctx.deadlineMs - Date.now() - reserveMs));
}

/**
 * Why a request's `signal` aborted, as the error to answer with: its KataError when it carries
 * one, DEADLINE_PASSED for a timeout, CANCELLED when the client went away. The `reasonOf` that
 * request code hands to `raceAbort` (src/common/abort.ts).
 */
export function requestAbortReason(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  if (isKataError(reason)) return reason;
  if (reason instanceof Error && reason.name === 'TimeoutError') return timedOut('DEADLINE_PASSED', 'the request deadline passed');
  return cancelled('CALL_CANCELLED', 'the request was cancelled');
}
