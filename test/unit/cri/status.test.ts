/** The one error -> gRPC status mapping keeps a status sentence small enough to reach any client. */
import { status } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { notFound } from '../../../src/common/errors.js';
import { boundedDetails, MAX_DETAILS_BYTES, toServiceError } from '../../../src/runtime/cri/status.js';

describe('toServiceError', () => {
  it('keeps an ordinary sentence as it is, with its reason', () => {
    const se = toServiceError(notFound('SANDBOX_NOT_FOUND', 'pod sandbox "abc" does not exist'));
    expect([se.code, se.details, se.metadata?.get('kata-ts-reason')]).toEqual([
      status.NOT_FOUND,
      'pod sandbox "abc" does not exist',
      ['SANDBOX_NOT_FOUND'],
    ]);
  });

  it.each([
    ['ascii', 'z'.repeat(200_000)],
    ['4-byte characters', '🚀'.repeat(50_000)],
    ['mixed', `é${'日本'.repeat(10_000)}`],
  ])('cuts a sentence quoting a huge %s value (the client would never get the status otherwise)', (_n, value) => {
    const se = toServiceError(notFound('SANDBOX_NOT_FOUND', `pod sandbox "${value}" does not exist`));
    expect(Buffer.byteLength(se.details ?? '')).toBeLessThanOrEqual(MAX_DETAILS_BYTES + 16);
    expect(se.details).toMatch(/^pod sandbox ".*\(truncated\)$/s);
    expect(boundedDetails('short')).toBe('short');
  });
});
