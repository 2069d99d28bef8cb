/**
 * Reason codes (`KataError.reason`) raised by src/common itself (files and sockets reached without
 * following links). A new code is added to this union; declaration merging below makes it known
 * to the factories and to `isReason` in src/common/errors.ts.
 */
export type CommonReason = 'UNIX_SOCKET_UNSAFE';

declare module './errors.js' {
  interface KataReasons {
    common: CommonReason;
  }
}
