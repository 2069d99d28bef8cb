/** What a service served over ttrpc provides: its methods, each bytes in, bytes out. */

/** What a handler learns about its call besides the request bytes. */
export interface TtrpcCall {
  /** Full service name, `containerd.task.v2.Task`. */
  service: string;
  method: string;
  /**
   * Aborted when the caller's deadline passes (the reason a `timeout` KataError), when the
   * connection goes away, or when the server is destroyed: stop working and throw.
   */
  signal: AbortSignal;
  /** The request's metadata pairs by key (containerd puts the namespace here), in arrival order. */
  metadata: ReadonlyMap<string, readonly string[]>;
  /** The caller's deadline as it arrived (timeout_nano), in ms; undefined when it set none. */
  timeoutMs: number | undefined;
}

/**
 * One unary method: the call's encoded request message in, its encoded response message out.
 * Failing with a KataError answers the status its kind maps to (a TtrpcStatusError answers its
 * own code); anything else thrown answers INTERNAL and is logged.
 */
export type TtrpcMethod = (request: Buffer, call: TtrpcCall) => Promise<Uint8Array> | Uint8Array;

/** A service's methods by name (`Create`, `Start`, ...). */
export type TtrpcService = Readonly<Record<string, TtrpcMethod>>;
