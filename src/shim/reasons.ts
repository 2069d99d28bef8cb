/**
 * Reason codes (`KataError.reason`) raised by the shim v2 program (src/shim): its flags, its
 * paths, the bundle it is started in, the per-pod server and the rootfs mounts.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type ShimReason =
  | 'SHIM_BUNDLE_INVALID'
  | 'SHIM_ID_INVALID'
  | 'SHIM_INFO_INVALID'
  /** `-info` was given stdin that is not a google.protobuf.Any of runtime options. */
  | 'SHIM_INFO_OPTIONS_INVALID'
  | 'SHIM_LOGGER_FAILED'
  | 'SHIM_NAMESPACE_INVALID'
  /** The node shim server refused or failed a control request (attach, detach), or could not be started. */
  | 'SHIM_NODE_FAILED'
  /** A control request to the node shim server is not one it knows, or names a field wrongly. */
  | 'SHIM_NODE_REQUEST_INVALID'
  | 'SHIM_NO_IMAGE_STORE'
  | 'SHIM_POD_DIR_TAKEN'
  | 'SHIM_POD_NOT_SERVING'
  | 'SHIM_ROOTFS_MOUNT_FAILED'
  | 'SHIM_ROOTFS_UNSUPPORTED'
  /** A rootfs directory containerd names is another file in the runtime's mount namespace (a private root). */
  | 'SHIM_ROOTFS_NOT_SEEN'
  | 'SHIM_SERVE_FAILED'
  | 'SHIM_SOCKET_PATH_TOO_LONG';

declare module '../common/errors.js' {
  interface KataReasons {
    shim: ShimReason;
  }
}
