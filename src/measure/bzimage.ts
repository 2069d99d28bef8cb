/**
 * QEMU's patch of a bzImage's setup header for direct kernel boot (`-kernel/-initrd/-append`),
 * reproduced so the kernel OVMF measures can be hashed on the host before boot.
 *
 * QEMU (hw/i386/x86.c, x86_load_linux, as in Debian 12's 7.2) reads the first 8 KiB of the
 * kernel, writes loader facts into the setup header and hands OVMF the setup (patched) plus the
 * rest of the file over fw_cfg; OVMF re-assembles them into the "kernel" file it loads and
 * measures. So the measured image is the file with these fields overwritten (offsets are the
 * Linux x86 boot protocol's):
 *   0x1fa vid_mode        only when the command line has `vga=`
 *   0x210 type_of_loader  0xb0 (QEMU)
 *   0x211 loadflags       | 0x80 (CAN_USE_HEAP)
 *   0x218 ramdisk_image   where QEMU puts the initrd (below)
 *   0x21c ramdisk_size    the initrd's size
 *   0x224 heap_end_ptr    cmdline_addr - real_addr - 0x200 = 0xfe00
 *   0x228 cmd_line_ptr    0x20000
 * The initrd sits at the highest 4 KiB boundary below min(initrd_addr_max, RAM below 4 GiB -
 * ACPI data size) - 1 that fits it, so PCR 4 depends on the initrd's size and the VM's memory.
 */
import { invalid } from '../common/errors.js';
import './reasons.js';

/** Where QEMU places the command line and the real-mode code for a modern (>= 2.02) kernel. */
const CMDLINE_ADDR = 0x20000;
const REAL_ADDR = 0x10000;
/** QEMU reads (and patches) at most this much of the kernel's start. */
const HEADER_BUFFER_BYTES = 8192;
/** XLF_CAN_BE_LOADED_ABOVE_4G in xloadflags (0x236). */
const XLF_CAN_BE_LOADED_ABOVE_4G = 1 << 1;

/**
 * What QEMU 7.2's pc/q35 machines reserve at the top of low RAM for ACPI tables
 * (pcmc->acpi_data_size = 0x20000 + 0x8000); the initrd ends below it.
 */
export const QEMU_PC_ACPI_DATA_SIZE_BYTES = 0x28000;

export interface SetupHeaderPatchInput {
  /** Exactly the text given to `-append`. */
  cmdline: string;
  initrdBytes: number;
  /** RAM QEMU maps below 4 GiB (see q35RamBelow4GiBBytes). */
  ramBelow4GiBBytes: number;
  /** Defaults to QEMU_PC_ACPI_DATA_SIZE_BYTES. */
  acpiDataSizeBytes?: number;
}

export interface PatchedKernel {
  /** A copy of the kernel with the header fields QEMU writes. */
  image: Buffer;
  bootProtocol: number;
  initrdAddress: number;
  /** The highest address QEMU allowed for the initrd's last byte. */
  initrdMaxAddress: number;
}

function bad(what: string): never {
  throw invalid('MEASURE_BZIMAGE_MALFORMED', `the kernel is not a bzImage QEMU can boot: ${what}`);
}

/**
 * RAM below 4 GiB on QEMU's q35 machine for `-m ramBytes`: all of it up to 2.75 GiB
 * (0xb0000000); from there on QEMU keeps 2 GiB low and puts the rest above 4 GiB.
 */
export function q35RamBelow4GiBBytes(ramBytes: number): number {
  if (!Number.isSafeInteger(ramBytes) || ramBytes <= 0)
    throw invalid('MEASURE_RAM_INVALID', `ramBytes must be a positive integer, got ${ramBytes}`);
  const lowmem = ramBytes >= 0xb0000000 ? 0x80000000 : 0xb0000000;
  return Math.min(ramBytes, lowmem);
}

/**
 * The `vga=` value QEMU writes to vid_mode, or null without one. QEMU looks for the first
 * "vga=" anywhere in the text (even inside another word) and refuses to start on a bad value.
 */
function videoMode(cmdline: string): number | null {
  const at = cmdline.indexOf('vga=');
  if (at < 0) return null;
  const rest = cmdline.slice(at + 4);
  if (rest.startsWith('normal')) return 0xffff;
  if (rest.startsWith('ext')) return 0xfffe;
  if (rest.startsWith('ask')) return 0xfffd;
  // qemu_strtoui with base 0: hex with 0x, octal with a leading 0, else decimal, then a space or the end.
  const m = /^(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)(?= |$)/.exec(rest);
  const value = m?.[1] === undefined ? Number.NaN : Number(m[1].startsWith('0') && !/^0[xX]/.test(m[1]) ? Number.parseInt(m[1], 8) : m[1]);
  if (!Number.isFinite(value) || value > 0xffffffff)
    throw invalid('MEASURE_CMDLINE_INVALID', 'cmdline has a vga= value QEMU refuses (normal, ext, ask or a number)');
  return value & 0xffff;
}

/** The kernel as OVMF receives it from QEMU for this command line, initrd size and RAM (pure). */
export function patchSetupHeader(kernel: Buffer, input: SetupHeaderPatchInput): PatchedKernel {
  const acpi = input.acpiDataSizeBytes ?? QEMU_PC_ACPI_DATA_SIZE_BYTES;
  if (!Number.isSafeInteger(input.initrdBytes) || input.initrdBytes < 0)
    throw invalid('MEASURE_INITRD_TOO_LARGE', `initrdBytes must be a non-negative integer, got ${input.initrdBytes}`);
  if (!Number.isSafeInteger(input.ramBelow4GiBBytes) || input.ramBelow4GiBBytes <= acpi || input.ramBelow4GiBBytes > 2 ** 32)
    throw invalid('MEASURE_RAM_INVALID', `ramBelow4GiBBytes must lie between the ACPI data size and 4 GiB, got ${input.ramBelow4GiBBytes}`);
  if (kernel.length < 0x240) bad('shorter than a setup header');
  if (kernel.readUInt32LE(0x202) !== 0x53726448) bad('no "HdrS" setup header signature');
  const protocol = kernel.readUInt16LE(0x206);
  // Older protocols load low and patch other fields; no kernel kata-ts can boot with OVMF is one.
  if (protocol < 0x202 || (kernel[0x211] ?? 0) % 2 === 0)
    throw invalid(
      'MEASURE_BZIMAGE_UNSUPPORTED',
      `the kernel's boot protocol 0x${protocol.toString(16)} is older than 2.02 or not loaded high`,
    );
  const setupSects = kernel[0x1f1] === 0 ? 4 : (kernel[0x1f1] ?? 4);
  const setupBytes = (setupSects + 1) * 512;
  if (setupBytes > kernel.length) bad('setup_sects is larger than the file');

  let initrdMax: number;
  if (protocol >= 0x20c && (kernel.readUInt16LE(0x236) & XLF_CAN_BE_LOADED_ABOVE_4G) !== 0) initrdMax = 0xffffffff;
  else if (protocol >= 0x203) initrdMax = kernel.readUInt32LE(0x22c);
  else initrdMax = 0x37ffffff;
  if (initrdMax >= input.ramBelow4GiBBytes - acpi) initrdMax = input.ramBelow4GiBBytes - acpi - 1;
  if (input.initrdBytes >= initrdMax)
    throw invalid('MEASURE_INITRD_TOO_LARGE', `the initrd (${input.initrdBytes} bytes) does not fit below ${initrdMax} bytes of low RAM`);
  // `& ~4095` on QEMU's 64-bit hwaddr: round down to a 4 KiB page.
  const initrdAddress = Math.floor((initrdMax - input.initrdBytes) / 4096) * 4096;

  const header = Buffer.from(kernel.subarray(0, Math.min(HEADER_BUFFER_BYTES, kernel.length)));
  header.writeUInt32LE(CMDLINE_ADDR, 0x228);
  const vga = videoMode(input.cmdline);
  if (vga !== null) header.writeUInt16LE(vga, 0x1fa);
  header[0x210] = 0xb0;
  header[0x211] = (header[0x211] ?? 0) | 0x80;
  header.writeUInt16LE(CMDLINE_ADDR - REAL_ADDR - 0x200, 0x224);
  header.writeUInt32LE(initrdAddress, 0x218);
  header.writeUInt32LE(input.initrdBytes, 0x21c);

  const image = Buffer.from(kernel);
  // Only the part of the header buffer that falls inside the setup is handed on (QEMU's memcpy).
  header.copy(image, 0, 0, Math.min(header.length, setupBytes));
  return { image, bootProtocol: protocol, initrdAddress, initrdMaxAddress: initrdMax };
}
