/**
 * Reason codes (`KataError.reason`) raised by the containerd installer (`kata-ts install` /
 * `uninstall --containerd`) and its config reader.
 */
export type InstallReason =
  | 'CONTAINERD_VERSION_UNPARSABLE'
  | 'CONTAINERD_VERSION_UNSUPPORTED'
  | 'CONTAINERD_CONFIG_INVALID'
  | 'CONTAINERD_CONFIG_VERSION_UNSUPPORTED'
  | 'CONTAINERD_CONFIG_NOT_EXTENSIBLE'
  | 'INSTALL_HANDLER_CONFLICT'
  | 'INSTALL_FILE_EXISTS'
  | 'INSTALL_FILE_CHANGED'
  | 'INSTALL_STATE_INVALID'
  | 'INSTALL_STATE_STALE'
  | 'INSTALL_SANDBOXER_UNSUPPORTED';

declare module '../common/errors.js' {
  interface KataReasons {
    install: InstallReason;
  }
}
