import type { ServiceError } from '@grpc/grpc-js';
import { expect } from 'vitest';
import { REASON_METADATA_KEY } from '../../src/cri/status.js';

/** Expect a call to fail with the given gRPC status (and, when given, kata-ts reason code). */
export async function expectGrpcError(call: Promise<unknown>, code: number, reason?: string): Promise<ServiceError> {
  let caught: unknown;
  try {
    await call;
  } catch (err) {
    caught = err;
  }
  expect(caught, 'the call was expected to fail').toBeDefined();
  const se = caught as ServiceError;
  expect({ code: se.code, details: se.details }).toMatchObject({ code });
  if (reason !== undefined) expect(se.metadata?.get(REASON_METADATA_KEY)?.[0]).toBe(reason);
  return se;
}
