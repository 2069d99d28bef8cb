/** raceAbort: the promise's outcome, or reasonOf's error as soon as the signal fires. */
import { describe, expect, it } from 'vitest';
import { raceAbort } from '../../../src/common/abort.js';

const reasonOf = (signal: AbortSignal): Error => new Error(`aborted: ${String(signal.reason)}`);

describe('raceAbort', () => {
  it('settles as the promise does while the signal stays quiet', async () => {
    const signal = new AbortController().signal;
    await expect(raceAbort(Promise.resolve(7), signal, reasonOf)).resolves.toBe(7);
    await expect(raceAbort(Promise.reject(new Error('boom')), signal, reasonOf)).rejects.toThrow('boom');
  });

  it("rejects with reasonOf's error when the signal fires first, or has already fired", async () => {
    const controller = new AbortController();
    const pending = raceAbort(new Promise<never>(() => {}), controller.signal, reasonOf);
    controller.abort('gone');
    await expect(pending).rejects.toThrow('aborted: gone');
    await expect(raceAbort(Promise.resolve(1), controller.signal, reasonOf)).rejects.toThrow('aborted: gone');
  });
});
