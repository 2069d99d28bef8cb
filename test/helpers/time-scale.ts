/**
 * One place that decides how long tests wait. The bounds written in tests are sized for an idle
 * two-core developer machine; a fresh CI machine, or one shared with other jobs, boots the same
 * TCG guests several times slower, so every bound is multiplied by one factor taken from here.
 *
 * No vitest import: vitest.config.ts, benches and the confined systemd harness load this too.
 */
import os from 'node:os';

/** The core count the written bounds were measured on. */
const REFERENCE_CPUS = 2;
/** CI runs on fresh machines (cold caches, first boots of every image): generous by default. */
const CI_FACTOR = 3;

/**
 * The multiplier for every wait bound: TEST_TIME_SCALE when set (a positive number), otherwise
 * CI_FACTOR under CI=true, times how much fewer cores this machine has than the reference.
 */
export function timeScale(env: NodeJS.ProcessEnv = process.env, cpus: number = os.availableParallelism()): number {
  const explicit = env.TEST_TIME_SCALE;
  if (explicit !== undefined && explicit !== '') {
    const value = Number(explicit);
    if (!Number.isFinite(value) || value <= 0)
      throw new Error(`TEST_TIME_SCALE must be a positive number, not ${JSON.stringify(explicit)}`);
    return value;
  }
  const ci = env.CI === 'true' || env.CI === '1' ? CI_FACTOR : 1;
  return ci * Math.max(1, REFERENCE_CPUS / Math.max(1, cpus));
}

/** `ms` (a bound sized for an idle reference machine) scaled to this machine. */
export function scaledMs(ms: number): number {
  return Math.round(ms * timeScale());
}
