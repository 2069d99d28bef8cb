/** The hypervisor layer's public API: what src/runtime and src/cli import. */
export { chooseAcceleration, type AccelerationChoice, type AccelerationRoots, type Accelerator } from './accel.js';
export { checkGuestAssets, type GuestAssetCheck, type GuestAssetPaths } from './assets.js';
export {
  buildQemuArgv,
  BASE_KERNEL_PARAMS,
  ROOT_SLOTS,
  SUN_PATH_MAX_BYTES,
  VIRTIO_MEM_BLOCK_MIB,
  VIRTIO_MEM_ID,
  VIRTIO_MEM_QOM_PATH,
  type QemuArgvSpec,
  type VmSocketPaths,
} from './argv.js';
export { parseGuestLine, READY_PORT_NAME, type GuestMessage, type GuestReport } from './guest-protocol.js';
export {
  attachVm,
  startVm,
  vmPaths,
  type AttachVmOptions,
  type ExitInfo,
  type ShutdownResult,
  type StartVmOptions,
  type VmPaths,
  type VmProcess,
} from './launcher.js';
export { isSameLiveProcess, readCmdline, readProcStat, type ProcStat } from './procfs.js';
export { plugVcpus, setVirtioMemSize, vcpuDeviceId, virtioMemPluggedMiB } from './resize.js';
export { ANY_EVENT, connectQmp, QmpClient, QmpError, type ExecuteOptions, type QmpClientOptions, type QmpCloseInfo } from './qmp/client.js';
export type * from './qmp/types.js';
