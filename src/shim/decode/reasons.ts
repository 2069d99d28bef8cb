/**
 * Reason codes (`KataError.reason`) raised while decoding what containerd or CRI-O hands a shim
 * (a bundle's config.json, an exec's process). A new code is added to this union; declaration
 * merging below makes it known to the factories and to `isReason` in src/common/errors.ts.
 */
export type ShimDecodeReason =
  | 'SHIM_ANNOTATION_INVALID'
  | 'SHIM_ANNOTATION_MISSING'
  | 'SHIM_CGROUPS_PATH_INVALID'
  | 'SHIM_CONTAINER_TYPE_MISMATCH'
  | 'SHIM_ENV_INVALID'
  | 'SHIM_MOUNT_UNSUPPORTED'
  | 'SHIM_SANDBOX_MISMATCH'
  | 'SHIM_SOLO_INVALID'
  | 'SHIM_STDIO_INVALID'
  | 'SHIM_SPEC_INVALID';

declare module '../../common/errors.js' {
  interface KataReasons {
    shimDecode: ShimDecodeReason;
  }
}
