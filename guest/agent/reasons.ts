/**
 * Reason codes (`KataError.reason`) raised by the guest agent while it runs containers and
 * processes. They travel to the host with the error kind, so the host can branch on them with
 * `isReason`. A new code is added to this union; declaration merging below makes it known to the
 * factories in src/common/errors.ts.
 */
export type GuestAgentReason =
  | 'AGENT_JSON_INVALID'
  | 'CGROUPS_PATH_INVALID'
  | 'CONTAINER_ID_INVALID'
  | 'CONTAINER_NOT_CREATED'
  | 'CONTAINER_NOT_RUNNING'
  | 'CONTAINER_NO_CGROUP'
  | 'CONTAINER_RUNNING'
  | 'EXEC_EXISTS'
  | 'EXEC_ID_INVALID'
  | 'EXEC_NOT_FOUND'
  | 'EXEC_RUNNING'
  | 'OUTPUT_OFFSET_UNAVAILABLE'
  | 'RUNTIME_FAILED'
  | 'RUNTIME_START_FAILED'
  | 'SPEC_PROCESS_MISSING';

declare module '../../src/common/errors.js' {
  interface KataReasons {
    guestAgent: GuestAgentReason;
  }
}
