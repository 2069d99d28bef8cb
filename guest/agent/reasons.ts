/**
 * Reason codes (`KataError.reason`) raised by the guest agent while it runs containers and
 * processes. They travel to the host with the error kind, so the host can branch on them with
 * `isReason`. A new code is added to this union; declaration merging below makes it known to the
 * factories in src/common/errors.ts.
 */
export type GuestAgentReason =
  | 'AGENT_JSON_INVALID'
  | 'AGENT_NO_CONTAINER_BACKEND'
  | 'AGENT_NO_NETWORK_SERVICE'
  | 'AGENT_NO_POD_SERVICE'
  | 'AGENT_NO_RESEED_SERVICE'
  | 'AGENT_NO_SECRET_SERVICE'
  | 'AGENT_PORT_NOT_FOUND'
  | 'AGENT_PORT_OPEN_FAILED'
  | 'CGROUPS_PATH_INVALID'
  | 'CONTAINER_ID_INVALID'
  | 'CONTAINER_ID_MISSING'
  | 'CONTAINER_NOT_CREATED'
  | 'CONTAINER_NOT_RUNNING'
  | 'CONTAINER_NO_CGROUP'
  | 'CONTAINER_RUNNING'
  | 'DEVICE_KIND_UNKNOWN'
  | 'DEVICE_NOT_IN_GUEST'
  | 'EXEC_EXISTS'
  | 'EXEC_ID_INVALID'
  | 'EXEC_ID_MISSING'
  | 'EXEC_NOT_FOUND'
  | 'EXEC_RUNNING'
  | 'OUTPUT_ACK_BEYOND_END'
  | 'OUTPUT_ALREADY_READ'
  | 'OUTPUT_NOT_PIPED'
  | 'OUTPUT_OFFSET_GONE'
  | 'OUTPUT_OFFSET_UNAVAILABLE'
  | 'OUTPUT_READ_CANCELLED'
  | 'PORT_CONNECT_FAILED'
  | 'NETWORK_NIC_NOT_FOUND'
  | 'NETWORK_REQUEST_INVALID'
  | 'POD_HOSTNAME_INVALID'
  | 'POD_ID_INVALID'
  | 'PORT_INVALID'
  | 'RESOURCES_INVALID'
  | 'RUNTIME_FAILED'
  | 'RUNTIME_PROCESS_NOT_RUNNABLE'
  | 'RUNTIME_START_FAILED'
  | 'SECRET_NO_ATTESTER'
  | 'SECRET_REQUEST_INVALID'
  | 'SECRET_RESOURCE_REFUSED'
  | 'SECRET_RESOURCE_UNAVAILABLE'
  | 'SECRET_VOLUME_EXISTS'
  | 'SECRET_VOLUME_TOO_LARGE'
  | 'SHARED_PATH_INVALID'
  | 'SPEC_PROCESS_MISSING'
  | 'STDIN_CLOSED'
  | 'STDIN_NOT_OPEN'
  | 'TPM_COMMAND_FAILED'
  | 'TPM_CREDENTIAL_REFUSED'
  | 'TPM_REQUEST_INVALID'
  | 'TPM_RESPONSE_MALFORMED'
  | 'TPM_UNAVAILABLE'
  | 'INITDATA_UNMEASURED';

declare module '../../src/common/errors.js' {
  interface KataReasons {
    guestAgent: GuestAgentReason;
  }
}
