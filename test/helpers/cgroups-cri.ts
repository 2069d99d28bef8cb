/**
 * A CRI client for code that runs OUTSIDE vitest: the scenarios inside the confined systemd
 * harness (test/harness/systemd/) are plain `node --import tsx` processes, where importing vitest
 * (cri-expect.ts does) throws. `outcome()` never throws: it resolves with what the server
 * answered, so a scenario records every outcome for the outer test.
 */
import { status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';
import { REASON_METADATA_KEY } from '../../src/cri/status.js';
import { criClient, type RuntimeServiceMethods } from './cri-client.js';

/** What one rpc came back with: the decoded response, or the gRPC status and kata-ts reason. */
export type RpcOutcome<T = Record<string, unknown>> =
  | { ok: true; value: T }
  | { ok: false; code: number; codeName: string; details: string; reason: string | null };

export interface PlainCri {
  /** The typed RuntimeService methods of the shared CRI test client. */
  runtime: RuntimeServiceMethods;
  close(): void;
}

/** A RuntimeService client on a unix socket, built on the shared CRI test client. */
export function plainCri(socketPath: string): PlainCri {
  const clients = criClient(socketPath);
  return { runtime: clients.runtime, close: () => clients.close() };
}

/** The outcome of a call (`outcome(cri.runtime.Status({}))`): its response or its gRPC status. */
export function outcome<T>(call: Promise<T>): Promise<RpcOutcome<T>> {
  return call.then(
    (value): RpcOutcome<T> => ({ ok: true, value }),
    (err: ServiceError): RpcOutcome<T> => {
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
}
