/**
 * ReseedGuest (docs/templates.md, "Reseed after restore"): a VM restored from a template runs
 * on with the template's kernel CRNG state and the template's wall clock. The host sends fresh
 * entropy and its clock; the static helper guest/native/reseed.c credits the entropy to the
 * kernel's pool, makes the CRNG reseed from it at once, and sets CLOCK_REALTIME (node has no
 * ioctl nor clock_settime). Then the agent reads a sample of /dev/urandom, which the host may
 * compare between clones.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { invalid, unavailable } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';
import type { ReseedGuestRequest, ReseedGuestResponse, Timestamp } from '../../src/generated/agent/agent.js';

export type GuestReseedReason = 'RESEED_REQUEST_INVALID' | 'RESEED_FAILED';

declare module '../../src/common/errors.js' {
  interface KataReasons {
    guestReseed: GuestReseedReason;
  }
}

/** What the helper accepts (guest/native/reseed.c ENTROPY_MIN_BYTES, ENTROPY_MAX_BYTES). */
export const RESEED_ENTROPY_MIN_BYTES = 32;
export const RESEED_ENTROPY_MAX_BYTES = 512;
/** Bytes of /dev/urandom returned after the reseed. */
export const RESEED_SAMPLE_BYTES = 16;

export interface ReseedPaths {
  /** The static helper (built by scripts/build-guest.sh). */
  helper: string;
  urandom: string;
}

export const GUEST_RESEED_PATHS: ReseedPaths = { helper: '/usr/lib/kata-ts/kata-ts-reseed', urandom: '/dev/urandom' };

/** Runs the helper: argv, bytes on stdin, its stdout (a test passes its own). */
export type HelperRunner = (file: string, args: string[], stdin: Uint8Array) => Promise<string>;

function runHelper(file: string, args: string[], stdin: Uint8Array): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(file, args, { timeout: 10_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(stderr.trim() || err.message));
      else resolve(stdout);
    });
    // A helper that exits before reading all of stdin makes the write fail (EPIPE): its exit
    // status and stderr say why; the stream's error must not end the agent.
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(Buffer.from(stdin));
  });
}

/** Checks the request: the entropy's size and a plausible host clock. Pure. */
export function validateReseed(req: ReseedGuestRequest): { entropy: Uint8Array; hostTime: Timestamp } {
  const n = req.entropy.length;
  if (n < RESEED_ENTROPY_MIN_BYTES || n > RESEED_ENTROPY_MAX_BYTES) {
    throw invalid(
      'RESEED_REQUEST_INVALID',
      `entropy holds ${n} bytes; ${RESEED_ENTROPY_MIN_BYTES} to ${RESEED_ENTROPY_MAX_BYTES} are wanted.`,
    );
  }
  const t = req.hostTime;
  if (
    t === null ||
    !Number.isSafeInteger(t.seconds) ||
    t.seconds < 1 ||
    !Number.isInteger(t.nanos) ||
    t.nanos < 0 ||
    t.nanos > 999_999_999
  ) {
    throw invalid('RESEED_REQUEST_INVALID', 'host_time is missing or not a valid point in time.');
  }
  return { entropy: req.entropy, hostTime: t };
}

/** Parses the helper's "SECONDS NANOS" line. */
export function parseHelperClock(out: string): Timestamp {
  const m = /^(\d+) (\d+)\n?$/.exec(out);
  if (m === null) throw unavailable('RESEED_FAILED', `kata-ts-reseed printed ${JSON.stringify(out.slice(0, 80))}, not "SECONDS NANOS".`);
  return { seconds: Number(m[1]), nanos: Number(m[2]) };
}

function timestampNow(): Timestamp {
  const ms = Date.now();
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 };
}

export class GuestReseed {
  constructor(
    private readonly logger: Logger,
    private readonly paths: ReseedPaths = GUEST_RESEED_PATHS,
    private readonly run: HelperRunner = runHelper,
  ) {}

  async reseed(req: ReseedGuestRequest): Promise<ReseedGuestResponse> {
    const { entropy, hostTime } = validateReseed(req);
    let out: string;
    try {
      out = await this.run(this.paths.helper, [String(hostTime.seconds), String(hostTime.nanos)], entropy);
    } catch (err) {
      throw unavailable('RESEED_FAILED', `the guest could not be reseeded: ${err instanceof Error ? err.message : String(err)}.`);
    }
    const guestTimeBefore = parseHelperClock(out);
    const handle = await fsp.open(this.paths.urandom, 'r');
    const sample = Buffer.alloc(RESEED_SAMPLE_BYTES);
    try {
      await handle.read(sample, 0, sample.length, null);
    } finally {
      await handle.close();
    }
    const guestTimeAfter = timestampNow();
    this.logger.info({ guestTimeBefore, guestTimeAfter, entropyBytes: entropy.length }, 'guest reseeded and clock set');
    return { guestTimeBefore, guestTimeAfter, urandomSample: sample };
  }
}
