import { status as GrpcStatus } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { ERROR_KINDS } from '../../../src/common/errors.js';
import { kindOfRpcCode, RpcCode, rpcCodeName, rpcCodeOfKind } from '../../../src/common/status-codes.js';

describe('the shared kind -> status code table', () => {
  it('names the same numbers grpc-js does, code by code', () => {
    for (const [name, code] of Object.entries(RpcCode)) {
      expect([name, GrpcStatus[name as keyof typeof GrpcStatus]]).toEqual([name, code]);
    }
  });

  it('gives every kind the code its comment in errors.ts promises', () => {
    expect(Object.fromEntries(ERROR_KINDS.map((k) => [k, rpcCodeName(rpcCodeOfKind(k))]))).toEqual({
      invalid: 'INVALID_ARGUMENT',
      not_found: 'NOT_FOUND',
      exists: 'ALREADY_EXISTS',
      precondition: 'FAILED_PRECONDITION',
      exhausted: 'RESOURCE_EXHAUSTED',
      unimplemented: 'UNIMPLEMENTED',
      unavailable: 'UNAVAILABLE',
      timeout: 'DEADLINE_EXCEEDED',
      cancelled: 'CANCELLED',
      unauthenticated: 'UNAUTHENTICATED',
      internal: 'INTERNAL',
    });
  });

  it('maps a received code back to its kind, and codes without one to internal', () => {
    for (const kind of ERROR_KINDS) expect(kindOfRpcCode(rpcCodeOfKind(kind))).toBe(kind);
    expect(kindOfRpcCode(RpcCode.PERMISSION_DENIED)).toBe('internal');
    expect(kindOfRpcCode(RpcCode.UNKNOWN)).toBe('internal');
    expect(kindOfRpcCode(99)).toBe('internal');
    expect(rpcCodeName(99)).toBe('99');
  });
});
