/**
 * Reason codes (`KataError.reason`) raised by the release layout (`kata-ts release ...`).
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type ReleaseReason =
  | 'RELEASE_BIN_NOT_LINK'
  | 'RELEASE_CURRENT_NOT_LINK'
  | 'RELEASE_ID_INVALID'
  | 'RELEASE_IN_USE'
  | 'RELEASE_IS_CURRENT'
  | 'RELEASE_PATH_INVALID'
  | 'RELEASE_PREFIX_NOT_WRITABLE'
  | 'RELEASE_SOURCE_INCOMPLETE'
  | 'RELEASE_UNKNOWN';

declare module '../common/errors.js' {
  interface KataReasons {
    release: ReleaseReason;
  }
}
