/** Types shared by the RPC client and server: a method table maps names to shapes. */

export type CallKind = 'unary' | 'serverStream' | 'clientStream' | 'bidi';

export interface MethodShape {
  kind: CallKind;
  request: unknown;
  response: unknown;
}

/** The run-time half of a method table: kinds and full protobuf type names. */
export type MethodTable<T> = { readonly [K in keyof T]: { readonly kind: CallKind; readonly request: string; readonly response: string } };

/** What a sender may give for a message: any field may be left out (the default is sent). */
export type Init<T> = T extends Uint8Array
  ? Uint8Array
  : T extends readonly (infer E)[]
    ? Init<E>[]
    : T extends object
      ? { [K in keyof T]?: Init<T[K]> | null }
      : T;

/** Method names of one kind. */
export type MethodsOfKind<T, K extends CallKind> = {
  [M in keyof T]: T[M] extends { kind: K } ? M : never;
}[keyof T] &
  string;

export interface CallContext {
  /** The call's method name. */
  method: string;
  /** Aborted when the caller cancels, the deadline passes or the session ends. */
  signal: AbortSignal;
}

type Req<S> = S extends { request: infer R } ? R : never;
type Res<S> = S extends { response: infer R } ? R : never;

/** The server's function for one method, by its kind. */
export type ServerHandler<S> = S extends { kind: 'unary' }
  ? (request: Req<S>, ctx: CallContext) => Promise<Init<Res<S>>>
  : S extends { kind: 'serverStream' }
    ? (request: Req<S>, ctx: CallContext) => AsyncIterable<Init<Res<S>>>
    : S extends { kind: 'clientStream' }
      ? (requests: AsyncIterable<Req<S>>, ctx: CallContext) => Promise<Init<Res<S>>>
      : (requests: AsyncIterable<Req<S>>, ctx: CallContext) => AsyncIterable<Init<Res<S>>>;

/** A complete dispatch table: leaving a method out does not compile. */
export type ServerHandlers<T> = { [K in keyof T]: ServerHandler<T[K]> };

export interface CallOptions {
  /** Every call has a deadline; on expiry the stream is reset and the call fails with a timeout. */
  timeoutMs: number;
  signal?: AbortSignal;
}

/** Streaming calls may run for as long as they are wanted; a deadline is optional. */
export interface StreamCallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}
