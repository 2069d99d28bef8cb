/**
 * Reason codes (`KataError.reason`) raised by the command line (`plan` input).
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type CliReason = 'PLAN_MEASUREMENTS_UNAVAILABLE' | 'PLAN_REQUEST_UNRECOGNISED';

declare module '../common/errors.js' {
  interface KataReasons {
    cli: CliReason;
  }
}
