/**
 * Reason codes (`KataError.reason`) raised by src/common itself (files and sockets reached without
 * following links). A new code is added to this union; declaration merging below makes it known
 * to the factories and to `isReason` in src/common/errors.ts.
 */
export type CommonReason =
  | 'UNIX_SOCKET_UNSAFE'
  /** A caller's path that cannot be named through its root (relative, or a loop of links). */
  | 'CALLER_PATH_INVALID'
  /** The descriptor a parent named as the caller's root is not an open directory. */
  | 'CALLER_ROOT_INVALID';

declare module './errors.js' {
  interface KataReasons {
    common: CommonReason;
  }
}
