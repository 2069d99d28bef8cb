/**
 * ReseedGuest's agent side (guest/agent/reseed.ts): the request checked before the helper runs,
 * the helper's argv and stdin, its clock line parsed, a failing helper reported as RESEED_FAILED,
 * and a sample read from the urandom path given. The helper itself (ioctls, clock_settime) runs
 * in a real guest: test/integration/template.test.ts.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GuestReseed, type HelperRunner, parseHelperClock, RESEED_SAMPLE_BYTES, validateReseed } from '../../../guest/agent/reseed.js';
import { silentLogger } from '../../../src/common/logger.js';

const hostTime = { seconds: 1_800_000_000, nanos: 123_000_000 };

describe('validateReseed', () => {
  it('takes 32 to 512 bytes of entropy and a valid host time', () => {
    expect(validateReseed({ entropy: new Uint8Array(32), hostTime }).hostTime).toEqual(hostTime);
    expect(validateReseed({ entropy: new Uint8Array(512), hostTime }).entropy.length).toBe(512);
  });

  it.each([0, 31, 513])('refuses %i bytes of entropy, naming the field', (n) => {
    expect(() => validateReseed({ entropy: new Uint8Array(n), hostTime })).toThrow(
      expect.objectContaining({ reason: 'RESEED_REQUEST_INVALID', message: expect.stringMatching(/^entropy holds/) }),
    );
  });

  it.each([null, { seconds: 0, nanos: 0 }, { seconds: 5, nanos: 1_000_000_000 }, { seconds: 5, nanos: -1 }])(
    'refuses host_time %j',
    (t) => {
      expect(() => validateReseed({ entropy: new Uint8Array(64), hostTime: t })).toThrow(
        expect.objectContaining({ reason: 'RESEED_REQUEST_INVALID', message: expect.stringMatching(/^host_time/) }),
      );
    },
  );
});

describe('parseHelperClock', () => {
  it('reads "SECONDS NANOS" and refuses anything else', () => {
    expect(parseHelperClock('1700000000 42\n')).toEqual({ seconds: 1_700_000_000, nanos: 42 });
    expect(() => parseHelperClock('oops')).toThrow(expect.objectContaining({ reason: 'RESEED_FAILED' }));
    expect(() => parseHelperClock('1 2 3\n')).toThrow(expect.objectContaining({ reason: 'RESEED_FAILED' }));
  });
});

describe('GuestReseed', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-reseed-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('runs the helper with the host time as argv and the entropy on stdin, then samples urandom', async () => {
    const urandom = path.join(dir, 'urandom');
    writeFileSync(urandom, Buffer.from('0123456789abcdefXYZ'));
    const calls: Array<{ file: string; args: string[]; stdin: Uint8Array }> = [];
    const run: HelperRunner = async (file, args, stdin) => {
      calls.push({ file, args, stdin });
      return '1600000000 5\n';
    };
    const entropy = new Uint8Array(64).fill(7);
    const out = await new GuestReseed(silentLogger(), { helper: '/helper', urandom }, run).reseed({ entropy, hostTime });
    expect(calls).toEqual([{ file: '/helper', args: ['1800000000', '123000000'], stdin: entropy }]);
    expect(out.guestTimeBefore).toEqual({ seconds: 1_600_000_000, nanos: 5 });
    expect(Buffer.from(out.urandomSample).toString()).toBe('0123456789abcdef');
    expect(out.urandomSample.length).toBe(RESEED_SAMPLE_BYTES);
    expect(out.guestTimeAfter?.seconds).toBeGreaterThan(1_600_000_000);
  });

  it('reports a failing helper as RESEED_FAILED with its message, and never runs it for a bad request', async () => {
    let ran = 0;
    const failing: HelperRunner = async () => {
      ran += 1;
      throw new Error('kata-ts-reseed: RNDADDENTROPY: Operation not permitted');
    };
    const reseed = new GuestReseed(silentLogger(), { helper: '/helper', urandom: '/nonexistent' }, failing);
    await expect(reseed.reseed({ entropy: new Uint8Array(64), hostTime })).rejects.toMatchObject({
      reason: 'RESEED_FAILED',
      message: expect.stringContaining('RNDADDENTROPY: Operation not permitted'),
    });
    await expect(reseed.reseed({ entropy: new Uint8Array(8), hostTime })).rejects.toMatchObject({ reason: 'RESEED_REQUEST_INVALID' });
    expect(ran).toBe(1);
  });
});

describe('GuestReseed with a real helper process', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-reseed-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('survives a helper that exits without reading its stdin, reporting its stderr', async () => {
    // A stand-in for the helper (the real one needs a guest kernel and root): fails at once.
    const helper = path.join(dir, 'helper');
    writeFileSync(helper, '#!/bin/sh\necho "kata-ts-reseed: RNDRESEEDCRNG: Invalid argument" >&2\nexit 1\n', { mode: 0o755 });
    const reseed = new GuestReseed(silentLogger(), { helper, urandom: '/dev/urandom' });
    await expect(reseed.reseed({ entropy: new Uint8Array(512), hostTime })).rejects.toMatchObject({
      reason: 'RESEED_FAILED',
      message: expect.stringContaining('RNDRESEEDCRNG: Invalid argument'),
    });
  });
});
