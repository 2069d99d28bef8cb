/** The one error -> gRPC status mapping keeps a status sentence small enough to reach any client. */
import { status } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { internal, invalid, notFound } from '../../../src/common/errors.js';
import { boundedDetails, MAX_DETAILS_BYTES, toServiceError } from '../../../src/cri/status.js';

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

  const enospc = (path?: string) =>
    Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', syscall: 'write', ...(path ? { path } : {}) });

  it('a full disk met unexpectedly is RESOURCE_EXHAUSTED naming the path, not INTERNAL', () => {
    const se = toServiceError(enospc('/var/lib/kata-ts/sandboxes/abc.json'));
    expect([se.code, se.details, se.metadata?.get('kata-ts-reason')]).toEqual([
      status.RESOURCE_EXHAUSTED,
      'no space left on the disk holding /var/lib/kata-ts/sandboxes/abc.json (write)',
      ['STATE_DISK_FULL'],
    ]);
    expect(toServiceError(enospc()).details).toBe('no space left on the state disk (write)');
  });

  it('an INTERNAL error caused by a full disk keeps its sentence and becomes RESOURCE_EXHAUSTED', () => {
    const se = toServiceError(internal('SHARED_DIR_MOUNT_FAILED', 'the shared directory could not be prepared.', { cause: enospc('/s') }));
    expect([se.code, se.details]).toEqual([
      status.RESOURCE_EXHAUSTED,
      'no space left on the disk holding /s: the shared directory could not be prepared.',
    ]);
    // A deliberate refusal keeps its own status even when a full disk is among its causes.
    expect(toServiceError(invalid('STORE_BAD_ID', 'bad', { cause: enospc() })).code).toBe(status.INVALID_ARGUMENT);
    // Other host failures stay INTERNAL.
    expect(toServiceError(Object.assign(new Error('EIO'), { code: 'EIO' })).code).toBe(status.INTERNAL);
  });
});
