/**
 * Reason codes (`KataError.reason`) raised while predicting launch measurements (src/measure).
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type MeasureReason =
  | 'MEASURE_ARGV_UNREADABLE'
  | 'MEASURE_NO_VTPM'
  | 'MEASURE_PE_MALFORMED'
  | 'MEASURE_BZIMAGE_MALFORMED'
  | 'MEASURE_BZIMAGE_UNSUPPORTED'
  | 'MEASURE_INITRD_EMPTY'
  | 'MEASURE_INITRD_TOO_LARGE'
  | 'MEASURE_CMDLINE_INVALID'
  | 'MEASURE_RAM_INVALID'
  | 'MEASURE_DIGEST_INVALID'
  | 'MEASURE_VARS_MALFORMED'
  | 'MEASURE_REFERENCE_VALUES_INVALID'
  | 'MEASURE_FIRMWARE_MALFORMED'
  | 'MEASURE_FIRMWARE_UNSUPPORTED'
  | 'MEASURE_TEE_INPUT_INVALID'
  | 'MEASURE_INITDATA_INVALID'
  | 'MEASURE_INITDATA_NO_TEE'
  | 'MEASURE_QUOTE_INVALID'
  | 'MEASURE_VERITY_INPUT_INVALID';

declare module '../common/errors.js' {
  interface KataReasons {
    measure: MeasureReason;
  }
}
