/**
 * A CRI client for code that runs OUTSIDE vitest: the scenarios inside the confined systemd
 * harness (test/harness/systemd/) are plain `node --import tsx` processes, where importing vitest
 * (test/helpers/cri-client.ts does, for expectGrpcError) throws. Calls never throw: they resolve
 * with what the server answered, so a scenario records every outcome for the outer test.
 */
import { credentials, Metadata, status as GrpcStatus, type Client, type ServiceError } from '@grpc/grpc-js';
import { loadCriPackage } from '../../src/runtime/cri/proto.js';
import { REASON_METADATA_KEY } from '../../src/runtime/cri/status.js';

/** What one rpc came back with: the decoded response, or the gRPC status and kata-ts reason. */
export type RpcOutcome<T = Record<string, unknown>> =
  | { ok: true; value: T }
  | { ok: false; code: number; codeName: string; details: string; reason: string | null };

export interface PlainCri {
  runtime: Client;
  close(): void;
  /** Calls a RuntimeService rpc by name; `timeoutMs` becomes the call's deadline. */
  call<T = Record<string, unknown>>(method: string, request: object, timeoutMs?: number): Promise<RpcOutcome<T>>;
}

/** A RuntimeService client on a unix socket, built from proto/ as crictl's is. */
export function plainCri(socketPath: string): PlainCri {
  const { v1 } = loadCriPackage();
  const runtime = new v1.RuntimeService(`unix://${socketPath}`, credentials.createInsecure());
  return {
    runtime,
    close: () => runtime.close(),
    call<T>(method: string, request: object, timeoutMs = 120_000): Promise<RpcOutcome<T>> {
      const fn = (runtime as unknown as Record<string, (...args: unknown[]) => unknown>)[method];
      if (typeof fn !== 'function') throw new Error(`no rpc ${method} on the RuntimeService client`);
      return new Promise((resolve) => {
        fn.call(runtime, request, new Metadata(), { deadline: Date.now() + timeoutMs }, (err: ServiceError | null, res: T) => {
          if (err === null) {
            resolve({ ok: true, value: res });
            return;
          }
          const reason = err.metadata?.get(REASON_METADATA_KEY)?.[0];
          resolve({
            ok: false,
            code: err.code,
            codeName: GrpcStatus[err.code] ?? String(err.code),
            details: err.details,
            reason: typeof reason === 'string' ? reason : null,
          });
        });
      });
    },
  };
}
