/**
 * A CRI client for code that runs OUTSIDE vitest: the scenarios inside the confined systemd
 * harness (test/harness/systemd/) are plain `node --import tsx` processes, where importing vitest
 * (cri-expect.ts does) throws. Calls never throw: they resolve
 * with what the server answered, so a scenario records every outcome for the outer test.
 */
import { type Client, status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';
import { REASON_METADATA_KEY } from '../../src/cri/status.js';
import { criClients, rpc } from './cri-client.js';

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

/** A RuntimeService client on a unix socket, built on the shared CRI test client. */
export function plainCri(socketPath: string): PlainCri {
  const clients = criClients(socketPath);
  return {
    runtime: clients.runtime,
    close: () => clients.close(),
    call<T>(method: string, request: object, timeoutMs = 120_000): Promise<RpcOutcome<T>> {
      return rpc<T>(clients.runtime, method, request, { deadline: Date.now() + timeoutMs }).then(
        (value) => ({ ok: true, value }),
        (err: ServiceError) => {
          const reason = err.metadata?.get(REASON_METADATA_KEY)?.[0];
          return {
            ok: false,
            code: err.code,
            codeName: GrpcStatus[err.code] ?? String(err.code),
            details: err.details,
            reason: typeof reason === 'string' ? reason : null,
          };
        },
      );
    },
  };
}
