/**
 * Reason codes (`KataError.reason`) raised by sandbox and container managers, admission, resize, the record store and deadlines.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type RuntimeReason =
  | 'ADMISSION_BUDGET_EXCEEDED'
  | 'ADMISSION_CONFIDENTIAL_STATIC'
  | 'ADMISSION_MISMATCH'
  | 'ADMISSION_VALUE_TOO_LARGE'
  | 'CALL_CANCELLED'
  | 'CONTAINER_CONFIG_MISSING'
  | 'CONTAINER_EXISTS'
  | 'CONTAINER_IMAGE_MISSING'
  | 'CONTAINER_METADATA_INVALID'
  | 'CONTAINER_NOT_FOUND'
  | 'CONTAINER_RUN_AS_GROUP_WITHOUT_USER'
  | 'DEADLINE_PASSED'
  | 'GUEST_ASSETS_MISSING'
  | 'METRICS_ADDRESS'
  | 'RECORD_CONTAINER_CONFIG_INVALID'
  | 'RESIZE_BEYOND_HEADROOM'
  | 'RESIZE_CONFIDENTIAL_STATIC'
  | 'SANDBOX_CONFIG_MISSING'
  | 'SANDBOX_EXISTS'
  | 'SANDBOX_HOST_NAMESPACE_UNSUPPORTED'
  | 'SANDBOX_METADATA_INVALID'
  | 'SANDBOX_METADATA_MISSING'
  | 'SANDBOX_NOT_FOUND'
  | 'SANDBOX_NOT_READY'
  | 'SANDBOX_NOT_RUNNING'
  | 'SANDBOX_WORKDIR_EXISTS'
  | 'STORE_BAD_ID';

declare module '../common/errors.js' {
  interface KataReasons {
    runtime: RuntimeReason;
  }
}
