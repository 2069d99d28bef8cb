/**
 * Settle as `promise` does, or reject as soon as `signal` fires with the error `reasonOf(signal)`
 * gives. The promise keeps running: the caller decides what to roll back.
 * The one race-against-abort helper: each layer passes its own `reasonOf` (images: `abortReason`,
 * sandbox requests: `requestAbortReason`) instead of wrapping this under another name.
 */
export function raceAbort<T>(promise: Promise<T>, signal: AbortSignal, reasonOf: (signal: AbortSignal) => Error): Promise<T> {
  if (signal.aborted) return Promise.reject(reasonOf(signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(reasonOf(signal));
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}
