/**
 * The AMD SEV-SNP launch digest (MEASUREMENT of the attestation report) a pod would have when
 * QEMU launches it with OVMF.amdsev and `kernel-hashes=on`, predicted on the host.
 *
 * The PSP keeps a SHA-384 chain over every page the hypervisor hands it with
 * SNP_LAUNCH_UPDATE (SEV-SNP ABI, "PAGE_INFO"): for each 4 KiB page,
 *   digest = sha384(digest || contents || u16 0x70 || u8 page type || u8 is_imi(0) ||
 *                   u8 vmpl3/2/1 perms (0) || u8 0 || u64 gpa)
 * where `contents` is sha384(page) for normal and VMSA pages and 48 zero bytes otherwise.
 * QEMU feeds, in this order:
 *   1. the whole firmware image as normal pages, mapped so that it ends at 4 GiB;
 *   2. each range of OVMF's SNP metadata, in the image's order: SEC memory as zero pages,
 *      the secrets page, the CPUID page, the SVSM calling area as zero pages, and the kernel
 *      hashes page: a normal page holding QEMU's hashes table at the address OVMF names
 *      (zero pages when no kernel is given);
 *   3. one VMSA page per vCPU, at the fixed address 0xFFFFFFFFF000: the BSP starts at the
 *      reset vector 0xFFFFFFF0, the APs at OVMF's SEV-ES reset block; both carry the guest's
 *      SEV_FEATURES and the CPU signature (CPUID 1 EAX) of the vCPU model in RDX.
 * The arithmetic is checked against the published vectors of virtee/sev-snp-measure
 * (test/unit/measure/snp.test.ts); this implementation is ours.
 */
import { createHash } from 'node:crypto';
import { invalid } from '../common/errors.js';
import { FOUR_GIB, guidToBytes, type OvmfSevInfo, parseSevMetadata, type SevMetadataSection } from './ovmf-metadata.js';
import './reasons.js';

const PAGE_BYTES = 4096;
const SHA384_BYTES = 48;
const ZERO_CONTENTS = Buffer.alloc(SHA384_BYTES);

/** PAGE_INFO.PAGE_TYPE values of SNP_LAUNCH_UPDATE. */
const PAGE_TYPE = { normal: 0x01, vmsa: 0x02, zero: 0x03, unmeasured: 0x04, secrets: 0x05, cpuid: 0x06 } as const;
const PAGE_INFO_BYTES = 0x70;
/** The address the PSP records for every VMSA page: (u64)-1, page aligned, bits above 51 clear. */
const VMSA_GPA = 0xffff_ffff_f000;

function sha384(data: Buffer): Buffer {
  return createHash('sha384').update(data).digest();
}

/** The running launch digest (the guest context's LD). */
class LaunchDigest {
  private digest: Buffer = Buffer.alloc(SHA384_BYTES);

  private update(pageType: number, gpa: number, contents: Buffer): void {
    const info = Buffer.alloc(PAGE_INFO_BYTES);
    this.digest.copy(info, 0);
    contents.copy(info, SHA384_BYTES);
    info.writeUInt16LE(PAGE_INFO_BYTES, 0x60);
    info.writeUInt8(pageType, 0x62);
    // is_imi, vmpl3/2/1 permissions and a reserved byte stay zero for a QEMU launch.
    info.writeBigUInt64LE(BigInt(gpa), 0x68);
    this.digest = sha384(info);
  }

  normalPages(gpa: number, data: Buffer): void {
    for (let at = 0; at < data.length; at += PAGE_BYTES) {
      this.update(PAGE_TYPE.normal, gpa + at, sha384(data.subarray(at, at + PAGE_BYTES)));
    }
  }

  emptyPages(pageType: number, gpa: number, sizeBytes: number): void {
    for (let at = 0; at < sizeBytes; at += PAGE_BYTES) this.update(pageType, gpa + at, ZERO_CONTENTS);
  }

  vmsaPage(page: Buffer): void {
    this.update(PAGE_TYPE.vmsa, VMSA_GPA, sha384(page));
  }

  hex(): string {
    return this.digest.toString('hex');
  }
}

/** The CPUID 1 EAX signature of a family/model/stepping (AMD CPUID specification #25481). */
export function cpuSignature(family: number, model: number, stepping: number): number {
  const baseFamily = Math.min(family, 0xf);
  const extFamily = family > 0xf ? (family - 0xf) & 0xff : 0;
  return ((extFamily << 20) | (((model >> 4) & 0xf) << 16) | (baseFamily << 8) | ((model & 0xf) << 4) | (stepping & 0xf)) >>> 0;
}

/**
 * The signature of the first CPU in a /proc/cpuinfo text ("cpu family", "model", "stepping"):
 * what a vCPU of QEMU's `-cpu host` reports, so what its VMSA carries. The caller reads the file.
 */
export function cpuSignatureFromCpuinfo(cpuinfo: string): number {
  const field = (name: string): number => {
    const m = new RegExp(`^${name}\\s*:\\s*(\\d+)\\s*$`, 'm').exec(cpuinfo);
    if (m?.[1] === undefined) bad(`cpuinfo has no "${name}" line`);
    return Number(m[1]);
  };
  return cpuSignature(field('cpu family'), field('model'), field('stepping'));
}

/** QEMU's EPYC CPU models and the signature their vCPUs report (QEMU's builtin_x86_defs). */
export const SNP_VCPU_SIGNATURES: Readonly<Record<string, number>> = {
  EPYC: cpuSignature(23, 1, 2),
  'EPYC-v1': cpuSignature(23, 1, 2),
  'EPYC-v2': cpuSignature(23, 1, 2),
  'EPYC-IBPB': cpuSignature(23, 1, 2),
  'EPYC-v3': cpuSignature(23, 1, 2),
  'EPYC-v4': cpuSignature(23, 1, 2),
  'EPYC-Rome': cpuSignature(23, 49, 0),
  'EPYC-Rome-v1': cpuSignature(23, 49, 0),
  'EPYC-Rome-v2': cpuSignature(23, 49, 0),
  'EPYC-Rome-v3': cpuSignature(23, 49, 0),
  'EPYC-Rome-v4': cpuSignature(23, 49, 0),
  'EPYC-Milan': cpuSignature(25, 1, 1),
  'EPYC-Milan-v1': cpuSignature(25, 1, 1),
  'EPYC-Milan-v2': cpuSignature(25, 1, 1),
  'EPYC-Genoa': cpuSignature(25, 17, 0),
  'EPYC-Genoa-v1': cpuSignature(25, 17, 0),
  'EPYC-Turin': cpuSignature(26, 0, 0),
};

/** The SEV hashes table GUIDs QEMU writes (target/i386/sev.c) and OVMF checks. */
const HASHES_TABLE_GUID = '9438d606-4f22-4cc9-b479-a793d411fd21';
const KERNEL_ENTRY_GUID = '4de79437-abd2-427f-b835-d5b172d2045b';
const INITRD_ENTRY_GUID = '44baf731-3a2f-4bd7-9af1-41e29169781d';
const CMDLINE_ENTRY_GUID = '97d02dd8-bd20-4c94-aa78-e7714d36ab2a';
/** GUID + u16 length + sha256. */
const HASHES_ENTRY_BYTES = 16 + 2 + 32;
/** GUID + u16 length + three entries (cmdline, initrd, kernel). */
const HASHES_TABLE_BYTES = 16 + 2 + 3 * HASHES_ENTRY_BYTES;

/**
 * QEMU's SEV hashes table for `-kernel/-initrd/-append` with kernel-hashes=on, padded to 16
 * bytes. The kernel is hashed as the file is (QEMU leaves an encrypted guest's setup header
 * alone), the command line with its terminating NUL (a lone NUL without -append), a missing
 * initrd as the empty string.
 */
export function sevHashesTable(kernel: Buffer, initrd: Buffer | undefined, cmdline: string | undefined): Buffer {
  const table = Buffer.alloc((HASHES_TABLE_BYTES + 15) & ~15);
  guidToBytes(HASHES_TABLE_GUID).copy(table, 0);
  table.writeUInt16LE(HASHES_TABLE_BYTES, 16);
  const entries: [string, Buffer][] = [
    [CMDLINE_ENTRY_GUID, Buffer.concat([Buffer.from(cmdline ?? '', 'utf8'), Buffer.alloc(1)])],
    [INITRD_ENTRY_GUID, initrd ?? Buffer.alloc(0)],
    [KERNEL_ENTRY_GUID, kernel],
  ];
  entries.forEach(([guid, data], i) => {
    const at = 18 + i * HASHES_ENTRY_BYTES;
    guidToBytes(guid).copy(table, at);
    table.writeUInt16LE(HASHES_ENTRY_BYTES, at + 16);
    createHash('sha256')
      .update(data)
      .digest()
      .copy(table, at + 18);
  });
  return table;
}

/*
 * VMSA (the SEV-ES save area, AMD APM vol. 2 table B-4): offsets of the fields QEMU sets for
 * a vCPU at reset. Segment registers are {u16 selector, u16 attributes, u32 limit, u64 base}.
 */
const VMSA_SEGMENTS = { es: 0x00, cs: 0x10, ss: 0x20, ds: 0x30, fs: 0x40, gs: 0x50, gdtr: 0x60, ldtr: 0x70, idtr: 0x80, tr: 0x90 };
const VMSA_U64 = {
  efer: 0xd0,
  cr4: 0x148,
  cr0: 0x158,
  dr7: 0x160,
  dr6: 0x168,
  rflags: 0x170,
  rip: 0x178,
  gPat: 0x268,
  rdx: 0x310,
  sevFeatures: 0x3b0,
  xcr0: 0x3e8,
};
const VMSA_MXCSR = 0x408;
const VMSA_X87_FCW = 0x410;
/** The BSP starts at the architectural reset vector. */
const BSP_RESET_EIP = 0xffff_fff0;

function vmsaPage(eip: number, sevFeatures: bigint, vcpuSignature: number): Buffer {
  const page = Buffer.alloc(PAGE_BYTES);
  const segment = (name: keyof typeof VMSA_SEGMENTS, selector: number, attrib: number, limit: number, base: number) => {
    const at = VMSA_SEGMENTS[name];
    page.writeUInt16LE(selector, at);
    page.writeUInt16LE(attrib, at + 2);
    page.writeUInt32LE(limit, at + 4);
    page.writeBigUInt64LE(BigInt(base), at + 8);
  };
  // Real mode at reset, as QEMU/KVM set it up (flat 64 KiB data segments, CS based so that
  // CS:IP is the entry point).
  segment('es', 0, 0x93, 0xffff, 0);
  segment('cs', 0xf000, 0x9b, 0xffff, (eip & 0xffff0000) >>> 0);
  segment('ss', 0, 0x93, 0xffff, 0);
  segment('ds', 0, 0x93, 0xffff, 0);
  segment('fs', 0, 0x93, 0xffff, 0);
  segment('gs', 0, 0x93, 0xffff, 0);
  segment('gdtr', 0, 0, 0xffff, 0);
  segment('ldtr', 0, 0x82, 0xffff, 0);
  segment('idtr', 0, 0, 0xffff, 0);
  segment('tr', 0, 0x8b, 0xffff, 0);
  const u64 = (name: keyof typeof VMSA_U64, value: bigint | number) => page.writeBigUInt64LE(BigInt(value), VMSA_U64[name]);
  u64('efer', 0x1000); // KVM sets EFER.SVME
  u64('cr4', 0x40); // KVM sets CR4.MCE
  u64('cr0', 0x10);
  u64('dr7', 0x400);
  u64('dr6', 0xffff0ff0);
  u64('rflags', 0x2);
  u64('rip', eip & 0xffff);
  u64('gPat', 0x0007_0406_0007_0406n); // the PAT MSR's reset value
  u64('rdx', vcpuSignature);
  u64('sevFeatures', sevFeatures);
  u64('xcr0', 0x1);
  page.writeUInt32LE(0x1f80, VMSA_MXCSR);
  page.writeUInt16LE(0x37f, VMSA_X87_FCW);
  return page;
}

/** Inputs of an SNP launch as QEMU (>= 9.1, sev-snp-guest with kernel-hashes=on) performs it. */
export interface SnpLaunchInput {
  /** The OVMF.amdsev image as given to QEMU's `-bios`. */
  firmware: Buffer;
  /** vCPUs at boot (`-smp`): one VMSA page each. */
  vcpus: number;
  /**
   * QEMU's `-cpu` model (EPYC-v4, EPYC-Milan, ...) or the CPUID 1 EAX signature itself (for
   * `-cpu host`: cpuSignatureFromCpuinfo of the host's /proc/cpuinfo).
   */
  vcpuType: string | number;
  /** The `-kernel` file; without it the hashes page is measured as zero pages. */
  kernel?: Buffer;
  /** The `-initrd` file. */
  initrd?: Buffer;
  /** Exactly the `-append` text. */
  cmdline?: string;
  /**
   * SNP HOST_DATA (32 bytes, the initdata binding). Not part of the launch digest: the PSP
   * copies it into the attestation report beside MEASUREMENT, so a verifier checks both.
   */
  hostData?: Buffer;
  /**
   * SEV_FEATURES of the guest's VMSAs (bit 0 SNPActive must be set; QEMU's default for
   * sev-snp-guest is 0x1, Linux guests often use 0x21 with DebugSwap).
   */
  guestFeatures: bigint | number;
}

/** An SNP prediction: the launch digest plus what the report carries beside it. */
export interface SnpMeasurement {
  /** The report's MEASUREMENT, lower-case hex (48 bytes). */
  launchDigest: string;
  /** HOST_DATA as given, hex, reported alongside (not measured). */
  hostData?: string;
  /** The metadata ranges measured after the firmware, for explanations and tests. */
  sections: SevMetadataSection[];
  vcpuSignature: number;
}

function bad(message: string): never {
  throw invalid('MEASURE_TEE_INPUT_INVALID', message);
}

function resolveSignature(vcpuType: string | number): number {
  if (typeof vcpuType === 'number') {
    if (!Number.isInteger(vcpuType) || vcpuType < 0 || vcpuType > 0xffff_ffff) {
      bad(`vcpuType must be a CPU model name or a 32-bit signature, got ${vcpuType}`);
    }
    return vcpuType;
  }
  const signature = SNP_VCPU_SIGNATURES[vcpuType];
  if (signature === undefined) bad(`vcpuType "${vcpuType}" is not an AMD EPYC model kata-ts knows`);
  return signature;
}

function validate(input: SnpLaunchInput): { features: bigint; signature: number } {
  if (!Number.isInteger(input.vcpus) || input.vcpus < 1 || input.vcpus > 512) {
    bad(`vcpus must be an integer from 1 to 512, got ${input.vcpus}`);
  }
  const features = BigInt(input.guestFeatures);
  if (features < 0n || features >= 1n << 64n || (features & 1n) === 0n) {
    bad(`guestFeatures must be a 64-bit SEV_FEATURES value with bit 0 (SNPActive) set, got ${input.guestFeatures}`);
  }
  if (input.hostData !== undefined && input.hostData.length !== 32) {
    bad(`hostData must be 32 bytes, got ${input.hostData.length}`);
  }
  if (input.kernel === undefined && (input.initrd !== undefined || input.cmdline !== undefined)) {
    bad('initrd and cmdline need a kernel (QEMU hashes them only for direct kernel boot)');
  }
  if (input.cmdline?.includes('\0')) bad('cmdline must not contain a NUL character');
  if (input.firmware.length === 0 || input.firmware.length % PAGE_BYTES !== 0 || input.firmware.length > FOUR_GIB / 2) {
    throw invalid('MEASURE_FIRMWARE_MALFORMED', `firmware must be a whole number of 4 KiB pages, got ${input.firmware.length} bytes`);
  }
  return { features, signature: resolveSignature(input.vcpuType) };
}

function measureSection(ld: LaunchDigest, section: SevMetadataSection, sev: OvmfSevInfo, hashes: Buffer | undefined): void {
  switch (section.kind) {
    case 'SNP_SEC_MEM':
    case 'SVSM_CAA':
      ld.emptyPages(PAGE_TYPE.zero, section.gpa, section.sizeBytes);
      return;
    case 'SNP_SECRETS':
      ld.emptyPages(PAGE_TYPE.secrets, section.gpa, PAGE_BYTES);
      return;
    case 'CPUID':
      ld.emptyPages(PAGE_TYPE.cpuid, section.gpa, PAGE_BYTES);
      return;
    case 'SNP_KERNEL_HASHES': {
      if (hashes === undefined) {
        ld.emptyPages(PAGE_TYPE.zero, section.gpa, section.sizeBytes);
        return;
      }
      const tableGpa = sev.hashesTableGpa;
      if (tableGpa === undefined || tableGpa < section.gpa || tableGpa + hashes.length > section.gpa + section.sizeBytes) {
        throw invalid('MEASURE_FIRMWARE_MALFORMED', 'firmware has no SEV hashes table inside its SNP_KERNEL_HASHES range');
      }
      // QEMU writes the table at its address inside an otherwise zero range.
      const range = Buffer.alloc(section.sizeBytes);
      hashes.copy(range, tableGpa - section.gpa);
      ld.normalPages(section.gpa, range);
      return;
    }
  }
}

/**
 * Predicts the SNP launch measurement of a QEMU launch (VMM type QEMU) and returns it with the
 * values reported beside it. Pure: reads only the given buffers.
 */
export function snpMeasurement(input: SnpLaunchInput): SnpMeasurement {
  const { features, signature } = validate(input);
  const sev = parseSevMetadata(input.firmware);
  if (sev.sections.length === 0) {
    throw invalid('MEASURE_FIRMWARE_UNSUPPORTED', 'firmware has no SNP metadata (not an OVMF.amdsev build)');
  }
  const hashes = input.kernel === undefined ? undefined : sevHashesTable(input.kernel, input.initrd, input.cmdline);
  if (hashes !== undefined && !sev.sections.some((s) => s.kind === 'SNP_KERNEL_HASHES')) {
    throw invalid('MEASURE_FIRMWARE_UNSUPPORTED', 'firmware cannot measure a kernel: its SNP metadata has no SNP_KERNEL_HASHES range');
  }
  if (input.vcpus > 1 && sev.apResetEip === undefined) {
    throw invalid('MEASURE_FIRMWARE_UNSUPPORTED', 'firmware has no SEV-ES reset block, so it cannot start more than one vCPU');
  }
  const ld = new LaunchDigest();
  ld.normalPages(FOUR_GIB - input.firmware.length, input.firmware);
  for (const section of sev.sections) measureSection(ld, section, sev, hashes);
  const bsp = vmsaPage(BSP_RESET_EIP, features, signature);
  const ap = sev.apResetEip === undefined ? bsp : vmsaPage(sev.apResetEip, features, signature);
  for (let i = 0; i < input.vcpus; i++) ld.vmsaPage(i === 0 ? bsp : ap);
  const result: SnpMeasurement = { launchDigest: ld.hex(), sections: sev.sections, vcpuSignature: signature };
  if (input.hostData !== undefined) result.hostData = input.hostData.toString('hex');
  return result;
}

/**
 * The SNP launch digest (attestation report MEASUREMENT, hex) of a QEMU launch. HOST_DATA is
 * validated but not part of it: see snpMeasurement for the values reported alongside.
 */
export function snpLaunchDigest(input: SnpLaunchInput): string {
  return snpMeasurement(input).launchDigest;
}

/**
 * The reference values a verifier loads for this prediction, under the names trustee's default
 * EAR policy reads (attestation-service/src/token/ear_default_policy.rego:
 * `input.snp.measurement in data.reference.snp_launch_measurement`); the `snp` object of the
 * kata-ts reference-values document. HOST_DATA is left out: trustee's verifier checks it against
 * the initdata digest itself.
 */
export function snpReferenceValues(m: SnpMeasurement): Record<string, string> {
  return { snp_launch_measurement: m.launchDigest };
}
