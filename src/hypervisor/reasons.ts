/**
 * Reason codes (`KataError.reason`) raised by QEMU argv, launch, QMP, the guest ready channel and resize helpers.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type HypervisorReason =
  | 'CONFIDENTIAL_VM_NO_BALLOON'
  | 'CONFIDENTIAL_VM_NOT_STATIC'
  | 'GUEST_IMAGE_VERITY_INVALID'
  | 'GUEST_READY_TIMEOUT'
  | 'GUEST_REPORT_TIMEOUT'
  | 'KERNEL_PARAM_INVALID'
  | 'LOG_FILE_UNSAFE'
  | 'MEMORY_HOTPLUG_EXHAUSTED'
  | 'PCIE_ARGS_CONFLICT'
  | 'QEMU_EXITED'
  | 'QEMU_EXITED_AT_START'
  | 'QEMU_KILL_FAILED'
  | 'QEMU_LOG_UNWRITABLE'
  | 'QEMU_NAME_INVALID'
  | 'QEMU_SANDBOX_INVALID'
  | 'QEMU_SPAWN_FAILED'
  | 'QEMU_START_TIMEOUT'
  | 'QMP_CLOSED'
  | 'QMP_COMMAND_FAILED'
  | 'QMP_CONNECT_FAILED'
  | 'QMP_EVENT_TIMEOUT'
  | 'QMP_PROTOCOL_VIOLATION'
  | 'QMP_TIMEOUT'
  | 'READY_CHANNEL_VIOLATION'
  | 'READY_SOCKET_CONNECT_FAILED'
  | 'TEE_BINDING_INVALID'
  | 'TEE_NEEDS_CONFIDENTIAL'
  | 'TEE_NEEDS_KVM'
  | 'UNIX_SOCKET_PATH_TOO_LONG'
  | 'VCPU_COUNT_INVALID'
  | 'VCPU_HOTPLUG_EXHAUSTED'
  | 'VIRTIOFSD_EXITED'
  | 'VIRTIOFSD_LOG_UNWRITABLE'
  | 'VM_IDENTITY_INVALID'
  | 'VM_NIC_INVALID'
  | 'VIRTIOFSD_PATH_INVALID'
  | 'VIRTIOFSD_SPAWN_FAILED'
  | 'VIRTIOFSD_START_TIMEOUT'
  | 'VIRTIO_MEM_SIZE_INVALID'
  | 'VM_PATH_INVALID'
  | 'VM_PROCESS_GONE'
  | 'VM_PROCESS_MISMATCH'
  | 'VM_READY_CHANNEL_MISSING'
  | 'VM_SHAPE_INVALID';

declare module '../common/errors.js' {
  interface KataReasons {
    hypervisor: HypervisorReason;
  }
}
