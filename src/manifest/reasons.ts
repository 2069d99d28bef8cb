/**
 * Reason codes (`KataError.reason`) raised by Pod manifest parsing and conversion.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type ManifestReason = 'MANIFEST_INVALID' | 'MANIFEST_SYNTAX';

declare module '../common/errors.js' {
  interface KataReasons {
    manifest: ManifestReason;
  }
}
