import path from 'node:path';
import { invalid } from '../common/errors.js';
import type { VmShape } from '../sizing/types.js';
import type { Accelerator } from './accel.js';
import { READY_PORT_NAME } from './guest-protocol.js';
import { type GuestImageVerity, verityKernelParam } from './guest-verity.js';

/** The virtio-serial port name the guest agent opens (guest/init, guest/agent). */
export const AGENT_PORT_NAME = 'org.kata-ts.agent';
/** The guest image disk's serial number: guest/init mounts the disk with it at /usr. */
export const GUEST_IMAGE_SERIAL = 'kata-ts-guest';
/** The virtio-fs tag of the sandbox's shared directory. */
export const SHARED_FS_TAG = 'kata-ts-shared';
/** Where guest/init mounts the virtio-fs share inside the guest. */
export const GUEST_SHARED_DIR = '/run/kata-ts/shared';

/** The unix sockets and the console log one VM uses. */
export interface VmSocketPaths {
  qmpSocket: string;
  readySocket: string;
  consoleLog: string;
  /**
   * QEMU listens here for the agent's virtio-serial port (org.kata-ts.agent). Absent: the VM has
   * no agent channel (a VM without containers, as before the agent existed).
   */
  agentSocket?: string;
  /**
   * virtiofsd's vhost-user socket (src/hypervisor/virtiofsd.ts starts it before QEMU, which
   * connects as the client). Absent: no virtio-fs device.
   */
  virtiofsSocket?: string;
}

export interface QemuArgvSpec {
  /** Shown in `ps` (QEMU `-name guest=`); letters, digits, `.`, `_`, `-`. */
  name: string;
  shape: VmShape;
  accel: Accelerator;
  kernelPath: string;
  initrdPath: string;
  /** Extra guest kernel parameters (the config's), appended last so that they can override. */
  kernelParams: string[];
  paths: VmSocketPaths;
  /** `-device` arguments of the PCIe topology (src/pcie pcieQemuArgs), on slots 0x08-0x1e. */
  pcieArgs: string[];
  /** Confidential VMs are static: no CPU hot-plug headroom, no virtio-mem. */
  confidential: boolean;
  /**
   * The read-only guest image (scripts/build-guest.sh's guest.img: node, crun, the agent), the
   * guest's /usr, attached as a virtio-blk disk. Absent: the initramfs is the whole guest.
   */
  guestImagePath?: string;
  /**
   * The guest image's dm-verity table (src/hypervisor/guest-verity.ts), put on the kernel command
   * line as `kata_ts.verity=...`: guest/init then mounts /usr only through dm-verity with it. Only
   * for a TEE VM (whose command line is measured) with a guest image.
   */
  guestImageVerity?: GuestImageVerity;
  /** Under TCG: QEMU's translated-code cache (`tb-size`), bounded so the VMM budget holds it. */
  tcgTranslationCacheMiB?: number;
  /**
   * Free page reporting: a virtio-balloon device with `free-page-reporting=on` (the guest loads
   * virtio_balloon from guest/modules.list). The guest kernel reports free 2 MiB blocks and QEMU
   * discards them (fallocate punch-hole on the memfd backends), so host memory follows what the
   * guest uses. The balloon is never inflated. Never on a confidential VM.
   */
  freePageReporting?: boolean;
  /** The pod's NIC: a virtio-net device on a TAP that QEMU opens by name (see NicSpec). Absent: no network. */
  nic?: NicSpec;
  /**
   * QEMU's `-sandbox` value (its seccomp filter; QEMU_SECCOMP_SANDBOX in confine.ts). Absent: no
   * filter (a handler that opted out, with a reason).
   */
  seccompSandbox?: string;
  /** The VM's TEE (TeeArgvSpec); absent or `none`: an ordinary VM booted by QEMU's default firmware. */
  tee?: TeeArgvSpec;
}

/**
 * What a TEE adds to the argv. `initdataPath`: the pod's initdata document, handed to the guest as
 * the fw_cfg file `opt/org.kata-ts/initdata` (guest/init reads it, after binding it: PCR 8 for
 * vtpm, HOST_DATA for SNP, MRCONFIGID for TDX).
 */
export type TeeArgvSpec =
  | { kind: 'none' }
  | {
      kind: 'vtpm';
      /** OVMF's code, the read-only first pflash unit. */
      ovmfCodePath: string;
      /** The pod's own copy of the variable store, the writable second unit. */
      ovmfVarsPath: string;
      /** swtpm's control socket (src/tpm/swtpm.ts), which QEMU's TPM emulator backend connects to. */
      tpmSocket: string;
      initdataPath?: string;
    }
  | {
      kind: 'snp';
      /** OVMF built for SEV (`-bios`): it checks the kernel, initrd and command line against the hashes QEMU puts in the launch digest. */
      firmwarePath: string;
      /** HOST_DATA, 32 bytes, in the attestation report (the initdata digest in its own algorithm, cut or zero-padded: src/measure/initdata.ts). */
      hostData?: Buffer;
      initdataPath?: string;
    }
  | {
      kind: 'tdx';
      firmwarePath: string;
      /** MRCONFIGID, 48 bytes, in the TD report (the initdata digest in its own algorithm, cut or zero-padded: src/measure/initdata.ts). */
      mrConfigId?: Buffer;
      initdataPath?: string;
    };

/** The fw_cfg name the initdata document has in the guest (`/sys/firmware/qemu_fw_cfg/by_name/...`). */
export const INITDATA_FW_CFG_NAME = 'opt/org.kata-ts/initdata';
/** SEV-SNP's HOST_DATA and TDX's MRCONFIGID sizes in bytes. */
export const SNP_HOST_DATA_BYTES = 32;
export const TDX_MR_CONFIG_ID_BYTES = 48;
/**
 * The C-bit position and the physical address bits lost to it on every SEV-SNP part so far (EPYC
 * 7003/9004/9005 report 51 and 1 in CPUID 0x8000001F); QEMU checks them against the host's.
 */
export const SNP_CBITPOS = 51;
export const SNP_REDUCED_PHYS_BITS = 1;

/**
 * The pod's virtio-net NIC. QEMU runs in the pod's network namespace (the runtime starts it there)
 * and opens the TAP by `tapName`; no helper script runs. `vhost` only where /dev/vhost-net exists,
 * QEMU's own userspace backend otherwise. `mac` is the CNI interface's, so the VM is the pod.
 */
export interface NicSpec {
  tapName: string;
  mac: string;
  vhost: boolean;
}

/**
 * Root-bus (pcie.0) slots of the hypervisor's own devices. Agreed with src/pcie: slot 0 is the
 * host bridge, 0x01-0x07 are ours (0x01 stays free, it is where a VGA would go), 0x08-0x1e hold
 * the PCIe ports, 0x1f is ICH9 (LPC, SATA, SMBus).
 */
export const ROOT_SLOTS = {
  virtioSerial: 0x02,
  virtioMem: 0x03,
  guestImage: 0x04,
  virtioFs: 0x05,
  nic: 0x06,
  balloon: 0x07,
} as const;
export const OWN_SLOT_FIRST = 0x01;
export const OWN_SLOT_LAST = 0x07;
export const PCIE_PORT_SLOT_FIRST = 0x08;
export const PCIE_PORT_SLOT_LAST = 0x1e;
export const ICH9_SLOT = 0x1f;

/**
 * `-accel`. Under TCG:
 * - the translated-code cache (`tb-size`, 1 GiB and growing by default) is bounded, so it fits the
 *   VMM budget that sizing counted it in;
 * - a VM that may hot-plug vCPUs runs one TCG thread for all its vCPUs (`thread=single`).
 *   Multi-threaded TCG in QEMU 7.2 splits the cache into regions that each vCPU thread takes as it
 *   fills them; once the first vCPU has taken all of them (a busy guest does, before the next
 *   flush), a hot-plugged vCPU's new thread finds none and QEMU aborts
 *   (`tcg_region_initial_alloc__locked: assertion failed`). A single TCG thread has no regions per
 *   thread. KVM is unaffected.
 */
function accelArg(accel: Accelerator, shape: VmShape, tcgTranslationCacheMiB: number | undefined): string {
  if (accel !== 'tcg') return accel;
  return [
    'tcg',
    ...(shape.maxVcpus > shape.vcpus ? ['thread=single'] : []),
    ...(tcgTranslationCacheMiB === undefined ? [] : [`tb-size=${tcgTranslationCacheMiB}`]),
  ].join(',');
}

/** QOM ids of the devices the runtime talks to later over QMP. */
export const VIRTIO_MEM_ID = 'vmem0';
export const VIRTIO_MEM_QOM_PATH = `/machine/peripheral/${VIRTIO_MEM_ID}`;
const VIRTIO_MEM_BACKEND_ID = 'vmem0-mem';
/** Boot RAM's memory backend (NUMA node 0). */
const BOOT_RAM_BACKEND_ID = 'ram0';
const VIRTIO_SERIAL_ID = 'vser0';
const READY_CHARDEV_ID = 'ready';
const READY_PORT_ID = 'readyport';
const AGENT_CHARDEV_ID = 'agent';
const AGENT_PORT_ID = 'agentport';
const GUEST_IMAGE_DRIVE_ID = 'guestimg';
const GUEST_IMAGE_DEVICE_ID = 'guestimg0';
const VIRTIOFS_CHARDEV_ID = 'virtiofs';
const VIRTIOFS_DEVICE_ID = 'vfs0';
const NIC_NETDEV_ID = 'net0';
const NIC_DEVICE_ID = 'nic0';
const BALLOON_DEVICE_ID = 'balloon0';
const QMP_CHARDEV_ID = 'qmp';
const CONSOLE_CHARDEV_ID = 'console';
const TPM_CHARDEV_ID = 'chrtpm';
const TPM_BACKEND_ID = 'tpm0';
const TPM_DEVICE_ID = 'tpmcrb0';
const SNP_OBJECT_ID = 'sev0';
const TDX_OBJECT_ID = 'tdx0';
const RESERVED_IDS = new Set([
  VIRTIO_MEM_ID,
  VIRTIO_MEM_BACKEND_ID,
  BOOT_RAM_BACKEND_ID,
  VIRTIO_SERIAL_ID,
  READY_CHARDEV_ID,
  READY_PORT_ID,
  AGENT_CHARDEV_ID,
  AGENT_PORT_ID,
  GUEST_IMAGE_DRIVE_ID,
  GUEST_IMAGE_DEVICE_ID,
  VIRTIOFS_CHARDEV_ID,
  VIRTIOFS_DEVICE_ID,
  NIC_NETDEV_ID,
  NIC_DEVICE_ID,
  BALLOON_DEVICE_ID,
  QMP_CHARDEV_ID,
  CONSOLE_CHARDEV_ID,
  TPM_CHARDEV_ID,
  TPM_BACKEND_ID,
  TPM_DEVICE_ID,
  SNP_OBJECT_ID,
  TDX_OBJECT_ID,
]);

/**
 * virtio-mem's block size (QEMU's default on x86: the THP size). Hot-plug headroom and every
 * `requested-size` must be a multiple of it.
 */
export const VIRTIO_MEM_BLOCK_MIB = 2;
/** q35's limit in QEMU 7.2. */
export const Q35_MAX_CPUS = 288;
/** sockaddr_un.sun_path holds 108 bytes including the terminating NUL. */
export const SUN_PATH_MAX_BYTES = 107;

/**
 * What the free-page-reporting balloon costs QEMU on the host, counted in the VMM's memory budget:
 * the device's state, its virtqueues and the reporting handler (tens of KiB in QEMU 7.2; one MiB
 * is the bound, the smallest unit the budget is planned in). Reporting itself frees host memory.
 */
export const BALLOON_DEVICE_MIB = 1;

/**
 * The guest kernel's swiotlb bounce-buffer pool for a non-confidential VM, in 2 KiB slabs
 * (`swiotlb=2048`: 4 MiB). Linux allocates the pool at boot, zeroed (so every page of it is
 * resident on the host, for the VM's life, and never free for the balloon to report), whenever
 * memory may exist above 4 GiB: with virtio-mem headroom it always may. Its default is 64 MiB.
 * None of the VM's own devices bounce (virtio without VIRTIO_F_ACCESS_PLATFORM does not use the
 * DMA API; the others address 64 bits); 4 MiB is kept for an assigned device limited to 32-bit
 * DMA once hot-plugged memory sits above 4 GiB. A confidential guest bounces all its I/O through
 * this pool: it keeps the kernel's own size. The config's kernelParams come later and override.
 */
export const SWIOTLB_SLABS = 2048;

/**
 * Kernel parameters every guest gets; the shape's and the config's come after them.
 * `cryptomgr.notests=1`: the kernel's boot-time self-tests of its crypto algorithms are skipped.
 * They were half the instructions a Debian 6.1 guest ran before init (0.97 G against 1.85 G,
 * counted with QEMU's `-icount`), a second or more of every boot under TCG, and test
 * implementations no pod chose; minimal guest kernels (Kata's among them) build without them. A
 * config that wants them puts `cryptomgr.notests=0` in hypervisor.kernelParams (the later wins).
 */
export const BASE_KERNEL_PARAMS = ['console=ttyS0', 'panic=-1', 'quiet', 'cryptomgr.notests=1'] as const;

const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/**
 * Pure: the QEMU argv (without the binary) for one VM. Always starts paused (`-S`): the runtime
 * places the VMM in its cgroup and connects the ready port before `cont`. Deterministic: the
 * same spec gives the same argv (goldens in fixtures/argv/). Throws `invalid` naming the field.
 */
export function buildQemuArgv(spec: QemuArgvSpec): string[] {
  validateSpec(spec);
  const { shape } = spec;
  const headroomMiB = shape.maxMemoryMiB - shape.memoryMiB;
  const args: string[] = [];
  const add = (...items: string[]): void => {
    args.push(...items);
  };

  const tee = spec.tee ?? { kind: 'none' };
  const hardwareTee = tee.kind === 'snp' || tee.kind === 'tdx';
  add('-name', `guest=${spec.name},debug-threads=on`);
  add('-machine', machineArg(tee));
  add('-accel', accelArg(spec.accel, shape, spec.tcgTranslationCacheMiB));
  // TCG emulates any model; `max` gives the guest every feature TCG implements. Under KVM the
  // host's own model avoids emulating what the hardware has.
  add('-cpu', spec.accel === 'kvm' ? 'host' : 'max');
  // One socket of maxVcpus cores: the hot-pluggable slots are the cores beyond `cpus`.
  add('-smp', `cpus=${shape.vcpus},maxcpus=${shape.maxVcpus},sockets=1,cores=${shape.maxVcpus},threads=1`);
  add('-m', headroomMiB > 0 ? `size=${shape.memoryMiB}M,maxmem=${shape.maxMemoryMiB}M` : `size=${shape.memoryMiB}M`);
  // Guest RAM must be shareable for vhost-user (virtiofsd maps it to serve virtio-fs requests):
  // memfd-backed with share=on, boot RAM and the virtio-mem region alike. An SNP or TDX guest's
  // private memory is not in this memfd at all: QEMU backs it with KVM's guest_memfd, which no
  // other process can map; the memfd holds only the pages the guest converts to shared itself
  // (its swiotlb bounce buffers, through which virtio-fs goes). No DAX window is ever configured.
  add('-object', `memory-backend-memfd,id=${BOOT_RAM_BACKEND_ID},size=${shape.memoryMiB}M,share=on`);
  // A confidential guest's RAM is named on the machine (memory-backend=); the others' as NUMA node 0.
  if (!hardwareTee) add('-numa', `node,memdev=${BOOT_RAM_BACKEND_ID}`);
  add(...teeArgs(tee));
  add('-nodefaults', '-no-user-config', '-display', 'none');
  add('-S', '-no-reboot');
  add('-msg', 'timestamp=on');
  if (spec.seccompSandbox !== undefined) add('-sandbox', spec.seccompSandbox);

  add('-chardev', `socket,id=${QMP_CHARDEV_ID},path=${optionValue(spec.paths.qmpSocket)},server=on,wait=off`);
  add('-mon', `chardev=${QMP_CHARDEV_ID},mode=control`);
  // append=on: QEMU opens the log O_APPEND, so its writes follow the runtime's truncation when the
  // log is rotated past its cap (src/hypervisor/console-log.ts) instead of leaving a sparse file.
  add('-chardev', `file,id=${CONSOLE_CHARDEV_ID},path=${optionValue(spec.paths.consoleLog)},append=on`);
  add('-device', `isa-serial,chardev=${CONSOLE_CHARDEV_ID}`);

  add('-device', `virtio-serial-pci,id=${VIRTIO_SERIAL_ID},bus=pcie.0,addr=${slotAddr(ROOT_SLOTS.virtioSerial)}`);
  add('-chardev', `socket,id=${READY_CHARDEV_ID},path=${optionValue(spec.paths.readySocket)},server=on,wait=off`);
  add('-device', `virtserialport,id=${READY_PORT_ID},bus=${VIRTIO_SERIAL_ID}.0,chardev=${READY_CHARDEV_ID},name=${READY_PORT_NAME}`);
  if (spec.paths.agentSocket !== undefined) {
    add('-chardev', `socket,id=${AGENT_CHARDEV_ID},path=${optionValue(spec.paths.agentSocket)},server=on,wait=off`);
    add('-device', `virtserialport,id=${AGENT_PORT_ID},bus=${VIRTIO_SERIAL_ID}.0,chardev=${AGENT_CHARDEV_ID},name=${AGENT_PORT_NAME}`);
  }

  if (headroomMiB > 0) {
    // The backend spans the whole headroom; the guest sees none of it until qom-set requested-size.
    add('-object', `memory-backend-memfd,id=${VIRTIO_MEM_BACKEND_ID},size=${headroomMiB}M,share=on`);
    add(
      '-device',
      `virtio-mem-pci,id=${VIRTIO_MEM_ID},memdev=${VIRTIO_MEM_BACKEND_ID},requested-size=0,bus=pcie.0,addr=${slotAddr(ROOT_SLOTS.virtioMem)}`,
    );
  }

  if (spec.guestImagePath !== undefined) {
    // guest/init finds the disk by its serial, whatever name (vda, vdb) the kernel gives it.
    add('-drive', `if=none,id=${GUEST_IMAGE_DRIVE_ID},file=${optionValue(spec.guestImagePath)},format=raw,readonly=on`);
    add(
      '-device',
      `virtio-blk-pci,id=${GUEST_IMAGE_DEVICE_ID},drive=${GUEST_IMAGE_DRIVE_ID},serial=${GUEST_IMAGE_SERIAL},bus=pcie.0,addr=${slotAddr(ROOT_SLOTS.guestImage)}`,
    );
  }
  if (spec.paths.virtiofsSocket !== undefined) {
    add('-chardev', `socket,id=${VIRTIOFS_CHARDEV_ID},path=${optionValue(spec.paths.virtiofsSocket)}`);
    add(
      '-device',
      `vhost-user-fs-pci,id=${VIRTIOFS_DEVICE_ID},chardev=${VIRTIOFS_CHARDEV_ID},tag=${SHARED_FS_TAG},bus=pcie.0,addr=${slotAddr(ROOT_SLOTS.virtioFs)}`,
    );
  }

  if (spec.nic !== undefined) {
    const { tapName, mac, vhost } = spec.nic;
    add('-netdev', `tap,id=${NIC_NETDEV_ID},ifname=${tapName},script=no,downscript=no,vhost=${vhost ? 'on' : 'off'}`);
    add('-device', `virtio-net-pci,id=${NIC_DEVICE_ID},netdev=${NIC_NETDEV_ID},mac=${mac},bus=pcie.0,addr=${slotAddr(ROOT_SLOTS.nic)}`);
  }

  if (spec.freePageReporting === true) {
    add('-device', `virtio-balloon-pci,id=${BALLOON_DEVICE_ID},free-page-reporting=on,bus=pcie.0,addr=${slotAddr(ROOT_SLOTS.balloon)}`);
  }

  const params: string[] = [...BASE_KERNEL_PARAMS, ...shape.kernelParams];
  // virtio-mem memory is onlined by the kernel itself (no udev in the guest); movable so that it
  // can be unplugged again when the VM shrinks.
  if (headroomMiB > 0) params.push('memhp_default_state=online_movable');
  if (!spec.confidential) params.push(`swiotlb=${SWIOTLB_SLABS}`);
  // Before the config's parameters: guest/init takes the first kata_ts.verity= it finds.
  if (spec.guestImageVerity !== undefined) params.push(verityKernelParam(spec.guestImageVerity));
  params.push(...spec.kernelParams);
  add('-kernel', spec.kernelPath, '-initrd', spec.initrdPath, '-append', params.join(' '));

  add(...spec.pcieArgs);
  return args;
}

/**
 * `-machine`. q35 for every kind; a hardware TEE names its guest object and the RAM backend it
 * protects, and TDX needs the split irqchip (the TD's LAPIC is virtualised by the TDX module).
 * SMM stays QEMU's default: Debian's non-secboot OVMF_CODE_4M.fd neither needs nor refuses it.
 */
function machineArg(tee: TeeArgvSpec): string {
  if (tee.kind === 'snp') return `q35,confidential-guest-support=${SNP_OBJECT_ID},memory-backend=${BOOT_RAM_BACKEND_ID}`;
  if (tee.kind === 'tdx') {
    return `q35,kernel-irqchip=split,confidential-guest-support=${TDX_OBJECT_ID},memory-backend=${BOOT_RAM_BACKEND_ID}`;
  }
  return 'q35';
}

/** The TEE's firmware, its TPM or guest object, and the initdata file (see TeeArgvSpec). */
function teeArgs(tee: TeeArgvSpec): string[] {
  const out: string[] = [];
  if (tee.kind === 'vtpm') {
    // Unit 0 is OVMF's code (read only), unit 1 the pod's own variable store: OVMF writes boot
    // entries and its measured-boot state there, so every pod has a copy of its own.
    out.push('-drive', `if=pflash,format=raw,unit=0,readonly=on,file=${optionValue(tee.ovmfCodePath)}`);
    out.push('-drive', `if=pflash,format=raw,unit=1,file=${optionValue(tee.ovmfVarsPath)}`);
    // The CRB interface: the guest kernel's tpm_crb (built into Debian's 6.1) drives it, and OVMF
    // measures the kernel, initrd and command line into it before handing over.
    out.push('-chardev', `socket,id=${TPM_CHARDEV_ID},path=${optionValue(tee.tpmSocket)}`);
    out.push('-tpmdev', `emulator,id=${TPM_BACKEND_ID},chardev=${TPM_CHARDEV_ID}`);
    out.push('-device', `tpm-crb,id=${TPM_DEVICE_ID},tpmdev=${TPM_BACKEND_ID}`);
  } else if (tee.kind === 'snp') {
    // kernel-hashes=on: the hashes of -kernel, -initrd and -append go into the launch digest,
    // so the direct-boot inputs are measured although OVMF.amdsev.fd never reads them from disk.
    const props = [
      `sev-snp-guest,id=${SNP_OBJECT_ID}`,
      `cbitpos=${SNP_CBITPOS}`,
      `reduced-phys-bits=${SNP_REDUCED_PHYS_BITS}`,
      'kernel-hashes=on',
      ...(tee.hostData === undefined ? [] : [`host-data=${tee.hostData.toString('base64')}`]),
    ];
    out.push('-object', props.join(','));
    out.push('-bios', tee.firmwarePath);
  } else if (tee.kind === 'tdx') {
    const props = [
      `tdx-guest,id=${TDX_OBJECT_ID}`,
      ...(tee.mrConfigId === undefined ? [] : [`mrconfigid=${tee.mrConfigId.toString('base64')}`]),
    ];
    out.push('-object', props.join(','));
    out.push('-bios', tee.firmwarePath);
  }
  if (tee.kind !== 'none' && tee.initdataPath !== undefined) {
    out.push('-fw_cfg', `name=${INITDATA_FW_CFG_NAME},file=${optionValue(tee.initdataPath)}`);
  }
  return out;
}

function validateTee(spec: QemuArgvSpec): void {
  const tee = spec.tee;
  if (spec.guestImageVerity !== undefined) {
    // The parameter protects nothing where the command line is not measured, and without an image
    // guest/init would find no disk to verify.
    if (tee === undefined || tee.kind === 'none') {
      throw invalid(
        'GUEST_IMAGE_VERITY_INVALID',
        'guestImageVerity needs a TEE (tee.kind other than none), which measures the command line.',
        {
          details: { field: 'guestImageVerity' },
        },
      );
    }
    if (spec.guestImagePath === undefined) {
      throw invalid('GUEST_IMAGE_VERITY_INVALID', 'guestImageVerity needs guestImagePath, the disk it verifies.', {
        details: { field: 'guestImageVerity' },
      });
    }
  }
  if (tee === undefined || tee.kind === 'none') return;
  if (!spec.confidential) {
    throw invalid(
      'TEE_NEEDS_CONFIDENTIAL',
      `tee.kind ${tee.kind} needs a confidential VM (confidential: true), which is never reconfigured.`,
    );
  }
  const paths: Array<[string, string | undefined]> = [['tee.initdataPath', tee.initdataPath]];
  if (tee.kind === 'vtpm') {
    paths.push(['tee.ovmfCodePath', tee.ovmfCodePath], ['tee.ovmfVarsPath', tee.ovmfVarsPath], ['tee.tpmSocket', tee.tpmSocket]);
    const bytes = Buffer.byteLength(tee.tpmSocket, 'utf8');
    if (bytes > SUN_PATH_MAX_BYTES) {
      throw invalid(
        'UNIX_SOCKET_PATH_TOO_LONG',
        `tee.tpmSocket ${tee.tpmSocket} is ${bytes} bytes long but a unix socket path must fit in ${SUN_PATH_MAX_BYTES} bytes.`,
        { details: { field: 'tee.tpmSocket', path: tee.tpmSocket, bytes, maxBytes: SUN_PATH_MAX_BYTES } },
      );
    }
  } else {
    paths.push(['tee.firmwarePath', tee.firmwarePath]);
    if (spec.accel !== 'kvm') {
      throw invalid('TEE_NEEDS_KVM', `tee.kind ${tee.kind} needs KVM: a ${tee.kind.toUpperCase()} guest cannot run under ${spec.accel}.`);
    }
  }
  for (const [field, value] of paths) if (value !== undefined) requireAbsolute(field, value);
  if (tee.kind === 'snp' && tee.hostData !== undefined && tee.hostData.length !== SNP_HOST_DATA_BYTES) {
    throw invalid('TEE_BINDING_INVALID', `tee.hostData is ${tee.hostData.length} bytes but SEV-SNP HOST_DATA is ${SNP_HOST_DATA_BYTES}.`);
  }
  if (tee.kind === 'tdx' && tee.mrConfigId !== undefined && tee.mrConfigId.length !== TDX_MR_CONFIG_ID_BYTES) {
    throw invalid(
      'TEE_BINDING_INVALID',
      `tee.mrConfigId is ${tee.mrConfigId.length} bytes but TDX MRCONFIGID is ${TDX_MR_CONFIG_ID_BYTES}.`,
    );
  }
}

/** `02.0`: the spelling src/pcie uses for `addr=`. */
function slotAddr(slot: number): string {
  return `${slot.toString(16).padStart(2, '0')}.0`;
}

/** QEMU option values treat `,` as a separator; a literal comma is written twice. */
function optionValue(value: string): string {
  return value.replaceAll(',', ',,');
}

function validateSpec(spec: QemuArgvSpec): void {
  if (!NAME_PATTERN.test(spec.name)) {
    throw invalid(
      'QEMU_NAME_INVALID',
      `VM name ${JSON.stringify(spec.name)} must be 1-64 letters, digits, '.', '_' or '-' starting with a letter or digit.`,
    );
  }
  validateShape(spec.shape, spec.confidential);
  for (const [field, value] of [
    ['kernelPath', spec.kernelPath],
    ['initrdPath', spec.initrdPath],
    ['paths.consoleLog', spec.paths.consoleLog],
    ['guestImagePath', spec.guestImagePath],
  ] as const) {
    if (value !== undefined) requireAbsolute(field, value);
  }
  for (const [field, value] of [
    ['paths.qmpSocket', spec.paths.qmpSocket],
    ['paths.readySocket', spec.paths.readySocket],
    ['paths.agentSocket', spec.paths.agentSocket],
    ['paths.virtiofsSocket', spec.paths.virtiofsSocket],
  ] as const) {
    if (value === undefined) continue;
    requireAbsolute(field, value);
    const bytes = Buffer.byteLength(value, 'utf8');
    if (bytes > SUN_PATH_MAX_BYTES) {
      throw invalid(
        'UNIX_SOCKET_PATH_TOO_LONG',
        `${field} ${value} is ${bytes} bytes long but a unix socket path must fit in ${SUN_PATH_MAX_BYTES} bytes.`,
        { details: { field, path: value, bytes, maxBytes: SUN_PATH_MAX_BYTES } },
      );
    }
  }
  spec.kernelParams.forEach((param, i) => {
    if (param === '' || /[\s"]/.test(param)) {
      throw invalid('KERNEL_PARAM_INVALID', `kernelParams[${i}] ${JSON.stringify(param)} must be non-empty without spaces or quotes.`);
    }
  });
  validatePcieArgs(spec.pcieArgs);
  validateTee(spec);
  if (spec.confidential && spec.freePageReporting === true) {
    throw invalid(
      'CONFIDENTIAL_VM_NO_BALLOON',
      'freePageReporting must be off for a confidential VM: the host would discard pages private to the guest.',
    );
  }
  if (spec.seccompSandbox !== undefined && !/^on(,[a-z]+=(allow|deny|children))*$/.test(spec.seccompSandbox)) {
    throw invalid(
      'QEMU_SANDBOX_INVALID',
      `seccompSandbox ${JSON.stringify(spec.seccompSandbox)} is not a QEMU -sandbox value like "on,spawn=deny".`,
    );
  }
  if (spec.nic !== undefined) {
    if (!/^[A-Za-z0-9_.-]{1,15}$/.test(spec.nic.tapName)) {
      throw invalid(
        'VM_NIC_INVALID',
        `nic.tapName ${JSON.stringify(spec.nic.tapName)} must be an interface name of 1-15 letters, digits, '.', '_' or '-'.`,
      );
    }
    if (!/^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/i.test(spec.nic.mac)) {
      throw invalid('VM_NIC_INVALID', `nic.mac ${JSON.stringify(spec.nic.mac)} must be a MAC address like 02:00:00:00:00:01.`);
    }
  }
}

function validateShape(shape: VmShape, confidential: boolean): void {
  const positive = (field: keyof VmShape, value: number): void => {
    if (!Number.isSafeInteger(value) || value < 1) {
      throw invalid('VM_SHAPE_INVALID', `shape.${field} must be a positive whole number, not ${value}.`);
    }
  };
  positive('vcpus', shape.vcpus);
  positive('maxVcpus', shape.maxVcpus);
  positive('memoryMiB', shape.memoryMiB);
  positive('maxMemoryMiB', shape.maxMemoryMiB);
  if (shape.maxVcpus < shape.vcpus) {
    throw invalid('VM_SHAPE_INVALID', `shape.maxVcpus ${shape.maxVcpus} is below shape.vcpus ${shape.vcpus}.`);
  }
  if (shape.maxVcpus > Q35_MAX_CPUS) {
    throw invalid('VM_SHAPE_INVALID', `shape.maxVcpus ${shape.maxVcpus} exceeds the ${Q35_MAX_CPUS} vCPUs a q35 machine supports.`);
  }
  if (shape.maxMemoryMiB < shape.memoryMiB) {
    throw invalid('VM_SHAPE_INVALID', `shape.maxMemoryMiB ${shape.maxMemoryMiB} is below shape.memoryMiB ${shape.memoryMiB}.`);
  }
  const headroomMiB = shape.maxMemoryMiB - shape.memoryMiB;
  if (headroomMiB % VIRTIO_MEM_BLOCK_MIB !== 0) {
    throw invalid(
      'VM_SHAPE_INVALID',
      `shape memory headroom ${headroomMiB} MiB (maxMemoryMiB - memoryMiB) must be a multiple of the ${VIRTIO_MEM_BLOCK_MIB} MiB virtio-mem block.`,
    );
  }
  if (confidential && (shape.maxVcpus !== shape.vcpus || headroomMiB !== 0)) {
    throw invalid(
      'CONFIDENTIAL_VM_NOT_STATIC',
      `a confidential VM must be static but its shape plans ${shape.vcpus}->${shape.maxVcpus} vCPUs and ${shape.memoryMiB}->${shape.maxMemoryMiB} MiB.`,
    );
  }
  shape.kernelParams.forEach((param, i) => {
    if (param === '' || /[\s"]/.test(param)) {
      throw invalid(
        'KERNEL_PARAM_INVALID',
        `shape.kernelParams[${i}] ${JSON.stringify(param)} must be non-empty without spaces or quotes.`,
      );
    }
  });
}

function requireAbsolute(field: string, value: string): void {
  if (!path.isAbsolute(value) || value.includes('\n') || value.includes('\0')) {
    throw invalid('VM_PATH_INVALID', `${field} ${JSON.stringify(value)} must be an absolute path.`);
  }
}

/**
 * The PCIe arguments come from another planner; refuse ones that would collide with our devices
 * (a root-bus slot outside 0x08-0x1e, or one of our ids) instead of letting QEMU fail at start.
 */
function validatePcieArgs(pcieArgs: string[]): void {
  pcieArgs.forEach((arg, i) => {
    const props = new Map<string, string>();
    for (const part of arg.split(',')) {
      const eq = part.indexOf('=');
      if (eq > 0) props.set(part.slice(0, eq), part.slice(eq + 1));
    }
    const id = props.get('id');
    if (id !== undefined && RESERVED_IDS.has(id)) {
      throw invalid('PCIE_ARGS_CONFLICT', `pcieArgs[${i}] uses id ${id}, which the hypervisor's own devices use.`);
    }
    const addr = props.get('addr');
    if (props.get('bus') !== 'pcie.0' || addr === undefined) return;
    const slot = Number.parseInt(addr.split('.')[0] ?? '', 16);
    if (!Number.isInteger(slot) || slot < PCIE_PORT_SLOT_FIRST || slot > PCIE_PORT_SLOT_LAST) {
      throw invalid(
        'PCIE_ARGS_CONFLICT',
        `pcieArgs[${i}] puts a device on pcie.0 slot ${addr}, outside the 0x08-0x1e range reserved for PCIe ports.`,
      );
    }
  });
}
