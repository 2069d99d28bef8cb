/**
 * Reason codes (`KataError.reason`) raised by the config file and handler lookup.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type ConfigReason = 'CONFIG_INVALID' | 'CONFIG_NOT_FOUND' | 'CONFIG_UNREADABLE' | 'HANDLER_UNKNOWN';

declare module '../common/errors.js' {
  interface KataReasons {
    config: ConfigReason;
  }
}
