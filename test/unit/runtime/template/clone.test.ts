/**
 * The host's side of a clone's reseed (src/runtime/template/clone.ts): the request it plans and
 * the checks of the guest's answer (a clock that was set, a sample drawn). The call itself, on
 * real clones: test/integration/template.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { ReseedGuestResponse } from '../../../../src/generated/agent/agent.js';
import { checkReseedAnswer, planReseed, RESEED_ENTROPY_BYTES } from '../../../../src/runtime/template/clone.js';

const sample = new Uint8Array(16).fill(1);
function answer(afterMs: number): ReseedGuestResponse {
  return {
    guestTimeBefore: { seconds: 1, nanos: 0 },
    guestTimeAfter: { seconds: Math.floor(afterMs / 1000), nanos: (afterMs % 1000) * 1e6 },
    urandomSample: sample,
  };
}

describe('planReseed', () => {
  it('sends the entropy given and the host clock as seconds and nanos', () => {
    const entropy = new Uint8Array(RESEED_ENTROPY_BYTES);
    expect(planReseed(1_700_000_000_123, entropy)).toEqual({ entropy, hostTime: { seconds: 1_700_000_000, nanos: 123_000_000 } });
  });
});

describe('checkReseedAnswer', () => {
  const sent = 1_700_000_000_000;
  it('accepts a guest clock between the time sent and the answer', () => {
    expect(() => checkReseedAnswer(answer(sent), sent, sent + 2000)).not.toThrow();
    expect(() => checkReseedAnswer(answer(sent + 1500), sent, sent + 2000)).not.toThrow();
  });

  it('refuses a clock still behind (not set) or far ahead, and an answer without a sample', () => {
    expect(() => checkReseedAnswer(answer(sent - 30_000), sent, sent + 2000)).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_RESEED_FAILED', message: expect.stringContaining('it was not set') }),
    );
    expect(() => checkReseedAnswer(answer(sent + 3_600_000), sent, sent + 2000)).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_RESEED_FAILED' }),
    );
    expect(() => checkReseedAnswer({ ...answer(sent), guestTimeAfter: null }, sent, sent + 2000)).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_RESEED_FAILED' }),
    );
    expect(() => checkReseedAnswer({ ...answer(sent), urandomSample: new Uint8Array() }, sent, sent + 2000)).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_RESEED_FAILED', message: expect.stringContaining('no urandom sample') }),
    );
  });
});
