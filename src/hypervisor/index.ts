/** The hypervisor layer's public API: what src/runtime and src/cli import. */

export { isSameLiveProcess, type ProcStat, readCmdline, readProcStat } from '../common/procfs.js';
export { type AccelerationChoice, type AccelerationRoots, type Accelerator, chooseAcceleration } from './accel.js';
export {
  AGENT_PORT_NAME,
  BALLOON_DEVICE_MIB,
  BASE_KERNEL_PARAMS,
  buildQemuArgv,
  GUEST_IMAGE_SERIAL,
  GUEST_SHARED_DIR,
  INITDATA_FW_CFG_NAME,
  type NicSpec,
  type QemuArgvSpec,
  ROOT_SLOTS,
  SHARED_FS_TAG,
  SNP_HOST_DATA_BYTES,
  SUN_PATH_MAX_BYTES,
  TDX_MR_CONFIG_ID_BYTES,
  type TeeArgvSpec,
  VIRTIO_MEM_BLOCK_MIB,
  VIRTIO_MEM_ID,
  VIRTIO_MEM_QOM_PATH,
  type VmSocketPaths,
} from './argv.js';
export { checkGuestAssets, type GuestAssetCheck, type GuestAssetPaths } from './assets.js';
export { CLAIM_NIC_DEVICE_ID, CLAIM_VFS_DEVICE_ID, type ClaimNic, plugNic, plugSharedFs } from './claim-hotplug.js';
export {
  DEFAULT_VMM_MEMLOCK_BYTES,
  fstabField,
  inJail,
  JAIL_NSENTER_BINARY,
  type JailDevices,
  type JailLayout,
  type JailSpec,
  planJail,
  QEMU_SECCOMP_SANDBOX,
  ROOT_LINK_NAMES,
  SETPRIV_BINARY,
  UNSHARE_BINARY,
  VMM_NOFILE_LIMIT,
  type VmmIdentity,
  type VmmLaunchSpec,
  vmmLaunchCommand,
} from './confine.js';
export { type GuestMessage, type GuestReport, parseGuestLine, READY_PORT_NAME } from './guest-protocol.js';
export {
  GUEST_IMAGE_VERITY_SCHEMA,
  type GuestImageVerity,
  guestImageVerityDocument,
  guestImageVerityPath,
  parseGuestImageVerity,
  readGuestImageVerity,
  VERITY_KERNEL_PARAM,
  verityKernelParam,
} from './guest-verity.js';
export {
  type AttachVmOptions,
  attachVm,
  defaultJailerBinary,
  type ExitInfo,
  type ShutdownResult,
  type StartVmOptions,
  startVm,
  type VmPaths,
  type VmProcess,
  vmPaths,
} from './launcher.js';
export { ANY_EVENT, connectQmp, type ExecuteOptions, QmpClient, type QmpClientOptions, type QmpCloseInfo, QmpError } from './qmp/client.js';
export type * from './qmp/types.js';
export { plugVcpus, setVirtioMemSize, vcpuDeviceId, virtioMemPluggedMiB } from './resize.js';
export {
  detectHostTee,
  formatQemuVersion,
  type HostTeeSupport,
  parseQemuVersion,
  type QemuVersion,
  qemuVersionAtLeast,
  resolveTeeKind,
  TEE_MIN_QEMU,
  type TeeChoice,
  type TeeRoots,
  teeLaunchProblem,
} from './tee.js';
export {
  attachVirtiofsd,
  buildVirtiofsdArgv,
  DEFAULT_VIRTIOFSD_BINARY,
  type StartVirtiofsdOptions,
  startVirtiofsd,
  type VirtiofsdArgvSpec,
  type VirtiofsdProcess,
} from './virtiofsd.js';
