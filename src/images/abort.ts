import { cancelled, isKataError, type KataError, timedOut } from '../common/errors.js';
import type { CallOptions } from './cri-types.js';

/** One signal for an operation: the caller's cancellation and its deadline folded together. */
export interface OperationScope {
  signal: AbortSignal;
  /** Clear the deadline timer; call when the operation ends, whichever way. */
  dispose(): void;
}

/**
 * Fold `opts.signal` and `opts.deadlineMs` into one AbortSignal whose reason is always a
 * KataError (CANCELLED or DEADLINE_EXCEEDED naming `what`), so every layer below can just
 * rethrow `signal.reason`.
 */
export function operationScope(opts: CallOptions, what: string): OperationScope {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const onAbort = (): void => controller.abort(asKataAbort(opts.signal?.reason, what));
  if (opts.signal !== undefined) {
    if (opts.signal.aborted) onAbort();
    else opts.signal.addEventListener('abort', onAbort, { once: true });
  }
  const deadline = opts.deadlineMs;
  if (deadline !== undefined && Number.isFinite(deadline) && !controller.signal.aborted) {
    const fire = (): void => controller.abort(timedOut('IMAGE_DEADLINE_EXCEEDED', `${what} did not finish before the call's deadline`));
    const remainingMs = deadline - Date.now();
    if (remainingMs <= 0) fire();
    // setTimeout's ceiling is 2^31-1 ms; a later deadline is as good as none for one call.
    else if (remainingMs < 2 ** 31 - 1) timer = setTimeout(fire, remainingMs);
  }
  return {
    signal: controller.signal,
    dispose: () => {
      if (timer !== undefined) clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
    },
  };
}

function asKataAbort(reason: unknown, what: string): KataError {
  if (isKataError(reason)) return reason;
  return cancelled('IMAGE_CANCELLED', `${what} was cancelled`, { cause: reason });
}

/** The KataError explaining why `signal` aborted. */
export function abortReason(signal: AbortSignal, what = 'the image operation'): KataError {
  return asKataAbort(signal.reason, what);
}

/** Throw the abort reason when `signal` has fired. */
export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted === true) throw abortReason(signal);
}
