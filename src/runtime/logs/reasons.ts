/**
 * Reason codes (`KataError.reason`) raised while turning a container's output into its CRI log
 * file, or while writing it to the caller's FIFOs. A new code is added to this union; declaration
 * merging makes it known to the factories.
 */
export type LogsReason =
  | 'LOGS_DIR_MISSING'
  | 'LOGS_FIFO_UNUSABLE'
  | 'LOGS_OUTPUT_GAP'
  | 'LOGS_PATH_UNUSABLE'
  | 'LOGS_STATE_CORRUPT'
  | 'LOGS_WRITER_CLOSED';

declare module '../../common/errors.js' {
  interface KataReasons {
    logs: LogsReason;
  }
}
