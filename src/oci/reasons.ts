/**
 * Reason codes (`KataError.reason`) raised while turning a container's request, image and sandbox
 * facts into an OCI runtime spec. A new code is added to this union; declaration merging below
 * makes it known to the factories and to `isReason` in src/common/errors.ts.
 */
export type OciReason =
  | 'OCI_AMBIENT_NOT_GRANTED'
  | 'OCI_APPARMOR_UNSUPPORTED'
  | 'OCI_CAPABILITY_UNKNOWN'
  | 'OCI_CWD_RELATIVE'
  | 'OCI_DEVICE_INVALID'
  | 'OCI_DEVICE_UNRESOLVED'
  | 'OCI_DNS_INVALID'
  | 'OCI_ENV_INVALID'
  | 'OCI_GROUP_UNKNOWN'
  | 'OCI_HOSTNAME_INVALID'
  | 'OCI_HOST_IPC_UNSUPPORTED'
  | 'OCI_HOST_NETWORK_UNSUPPORTED'
  | 'OCI_ID_INVALID'
  | 'OCI_MOUNT_DUPLICATE'
  | 'OCI_MOUNT_IDMAP_UNSUPPORTED'
  | 'OCI_MOUNT_IMAGE_UNSUPPORTED'
  | 'OCI_MOUNT_PATH_INVALID'
  | 'OCI_MOUNT_PROPAGATION_PRIVILEGED'
  | 'OCI_MOUNT_RRO_INVALID'
  | 'OCI_MOUNT_SOURCE_UNRESOLVED'
  | 'OCI_NO_COMMAND'
  | 'OCI_NUL_IN_STRING'
  | 'OCI_PATH_INVALID'
  | 'OCI_PRIVILEGED_POD_REQUIRED'
  | 'OCI_PROFILE_REF_MISSING'
  | 'OCI_PROFILE_UNKNOWN'
  | 'OCI_RESOURCE_INVALID'
  | 'OCI_RUN_AS_GROUP_WITHOUT_USER'
  | 'OCI_SECCOMP_PROFILE_INVALID'
  | 'OCI_SECCOMP_PROFILE_MISSING'
  | 'OCI_SELINUX_UNSUPPORTED'
  | 'OCI_SYSCTL_NOT_NAMESPACED'
  | 'OCI_TARGET_NAMESPACE_UNKNOWN'
  | 'OCI_USER_NAMESPACE_UNSUPPORTED'
  | 'OCI_USER_UNKNOWN';

declare module '../common/errors.js' {
  interface KataReasons {
    oci: OciReason;
  }
}
