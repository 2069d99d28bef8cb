/**
 * Reason codes (`KataError.reason`) raised by the cgroupfs and systemd drivers.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type CgroupReason =
  | 'CGROUP_BUSY'
  | 'CGROUP_CONTROLLERS_NOT_DELEGATED'
  | 'CGROUP_CONTROLLER_MISSING'
  | 'CGROUP_CPUSET_EMPTY'
  | 'CGROUP_EXISTS'
  | 'CGROUP_FILE_MISSING'
  | 'CGROUP_IO_FAILED'
  | 'CGROUP_LIMITS_INVALID'
  | 'CGROUP_NOT_WRITABLE'
  | 'CGROUP_NO_CPUSET'
  | 'CGROUP_PARENT_INVALID'
  | 'CGROUP_PARENT_STYLE_MISMATCH'
  | 'CGROUP_PID_GONE'
  | 'CGROUP_PID_INVALID'
  | 'CGROUP_RECORD_INVALID'
  | 'CGROUP_ROOT_MISSING'
  | 'CGROUP_ROOT_NOT_CGROUP'
  | 'CGROUP_SANDBOX_ID_INVALID'
  | 'CGROUP_UNIFIED_MISSING'
  | 'CGROUP_WRITE_REFUSED'
  | 'SYSTEMD_ACCESS_DENIED'
  | 'SYSTEMD_CALL_FAILED'
  | 'SYSTEMD_JOB_FAILED'
  | 'SYSTEMD_JOB_TIMEOUT'
  | 'SYSTEMD_LIMITS_NOT_APPLIED'
  | 'SYSTEMD_NO_SUCH_UNIT'
  | 'SYSTEMD_PID_NOT_PLACED'
  | 'SYSTEMD_REFUSED'
  | 'SYSTEMD_TIMEOUT'
  | 'SYSTEMD_UNAVAILABLE'
  | 'SYSTEMD_UNIT_EXISTS';

declare module '../common/errors.js' {
  interface KataReasons {
    cgroups: CgroupReason;
  }
}
