import { expect } from 'vitest';
import { KataError } from '../../src/common/errors.js';

/** The KataError a promise rejects with; fails the test when it resolves or rejects otherwise. */
export async function rejection(p: Promise<unknown>): Promise<KataError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, 'expected a rejection with a KataError').toBeInstanceOf(KataError);
  return err as KataError;
}

/** The KataError `fn` throws synchronously; fails the test when it returns or throws otherwise. */
export function thrown(fn: () => unknown): KataError {
  try {
    fn();
  } catch (err) {
    expect(err, 'expected a KataError').toBeInstanceOf(KataError);
    return err as KataError;
  }
  throw new Error('expected a KataError to be thrown');
}
