/**
 * What a hypervisor reads from an OVMF image before it launches a confidential guest, parsed on
 * the host so the launch measurements can be predicted (src/measure/snp.ts, src/measure/tdx.ts).
 *
 * An OVMF image ends with a reset vector (the last 32 bytes). Just before it sits a table of
 * GUID-tagged entries read backwards from the end: the last entry (the "footer") names the
 * table and carries its whole length; every entry is laid out as
 *   [data][u16 length of data + 18][16-byte GUID]
 * so a reader walks from the footer towards the start of the file. The entries used here:
 *   - SEV-ES reset block: the real-mode entry point of the application processors (vCPUs > 0),
 *     which goes into each AP's VMSA;
 *   - SEV hashes table: where QEMU writes the kernel/initrd/cmdline hashes (SNP kernel-hashes=on);
 *   - SEV metadata: a u32 offset from the end of the image to an "ASEV" header listing the
 *     memory ranges the hypervisor pre-validates (and so measures) for SNP;
 *   - TDX metadata: a u32 offset from the end of the image to a "TDVF" descriptor listing the
 *     sections a TDX hypervisor adds (and measures) into the TD.
 * Layouts follow edk2's OvmfPkg/ResetVector (OvmfSevMetadata.asm, IntelTdxMetadata.asm) and
 * QEMU's hw/i386/pc_sysfw_ovmf.c / hw/i386/tdvf.c; the parser is ours and refuses anything it
 * cannot read fully (the image is a file an operator points at, read as untrusted bytes).
 */
import { invalid } from '../common/errors.js';
import './reasons.js';

/** The GUID of the table's footer entry. */
export const OVMF_TABLE_FOOTER_GUID = '96b582de-1fb2-45f7-baea-a366c55a082d';
/** Entry holding the SEV-ES AP reset vector (u32 EIP first). */
export const SEV_ES_RESET_BLOCK_GUID = '00f771de-1a7e-4fcb-890e-68c77e2fb44e';
/** Entry holding the guest physical address (u32) and size (u32) of the SEV hashes table. */
export const SEV_HASH_TABLE_RV_GUID = '7255371f-3a3b-4b04-927b-1da6efa8d454';
/** Entry holding the offset from the image's end of the "ASEV" metadata header (u32). */
export const OVMF_SEV_METADATA_GUID = 'dc886566-984a-4798-a75e-5585a7bf67cc';
/** Entry holding the offset from the image's end of the "TDVF" descriptor (u32). */
export const TDX_METADATA_OFFSET_GUID = 'e47a6535-984a-4798-865e-4685a7bf8ec2';

/** Bytes of the reset vector area after the table. */
const BYTES_AFTER_TABLE = 32;
/** u16 length + 16-byte GUID closing every entry. */
const ENTRY_HEADER_BYTES = 18;

/** Where OVMF is mapped: its last byte sits just below 4 GiB. */
export const FOUR_GIB = 0x1_0000_0000;

function malformed(what: string): never {
  throw invalid('MEASURE_FIRMWARE_MALFORMED', `firmware is not an OVMF image kata-ts can read: ${what}`);
}

/**
 * The 16 bytes a GUID occupies in an EFI structure: the first three groups little-endian, the
 * last two as written.
 */
export function guidToBytes(guid: string): Buffer {
  const m = /^([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})$/i.exec(guid);
  if (m === null) throw invalid('MEASURE_TEE_INPUT_INVALID', `"${guid}" is not a GUID`);
  const [, a, b, c, d, e] = m as unknown as [string, string, string, string, string, string];
  return Buffer.concat([
    Buffer.from(a, 'hex').reverse(),
    Buffer.from(b, 'hex').reverse(),
    Buffer.from(c, 'hex').reverse(),
    Buffer.from(d, 'hex'),
    Buffer.from(e, 'hex'),
  ]);
}

/** The textual (lower-case) form of 16 GUID bytes as EFI stores them. */
export function bytesToGuid(bytes: Buffer): string {
  if (bytes.length !== 16) throw invalid('MEASURE_TEE_INPUT_INVALID', `a GUID has 16 bytes, got ${bytes.length}`);
  const hex = (b: Buffer) => b.toString('hex');
  const rev = (b: Buffer) => Buffer.from(b).reverse();
  return [
    hex(rev(bytes.subarray(0, 4))),
    hex(rev(bytes.subarray(4, 6))),
    hex(rev(bytes.subarray(6, 8))),
    hex(bytes.subarray(8, 10)),
    hex(bytes.subarray(10, 16)),
  ].join('-');
}

/**
 * The GUID table at the end of an OVMF image, entry GUID (lower case) -> entry data. An image
 * without the footer GUID (a non-OVMF firmware, or an OVMF built without it) gives an empty map;
 * a table that is present but inconsistent is refused.
 */
export function parseOvmfFooterTable(firmware: Buffer): Map<string, Buffer> {
  const table = new Map<string, Buffer>();
  const footerEnd = firmware.length - BYTES_AFTER_TABLE;
  if (footerEnd < ENTRY_HEADER_BYTES) return table;
  const footerGuid = firmware.subarray(footerEnd - 16, footerEnd);
  if (!footerGuid.equals(guidToBytes(OVMF_TABLE_FOOTER_GUID))) return table;
  const tableBytes = firmware.readUInt16LE(footerEnd - ENTRY_HEADER_BYTES);
  const entriesBytes = tableBytes - ENTRY_HEADER_BYTES;
  if (entriesBytes < 0 || entriesBytes > footerEnd - ENTRY_HEADER_BYTES) {
    malformed(`the footer table claims ${tableBytes} bytes`);
  }
  const start = footerEnd - ENTRY_HEADER_BYTES - entriesBytes;
  let end = footerEnd - ENTRY_HEADER_BYTES;
  while (end - start >= ENTRY_HEADER_BYTES) {
    const guid = bytesToGuid(firmware.subarray(end - 16, end));
    const length = firmware.readUInt16LE(end - ENTRY_HEADER_BYTES);
    if (length < ENTRY_HEADER_BYTES || length > end - start) {
      malformed(`the footer table entry ${guid} claims ${length} bytes`);
    }
    // QEMU stops at the first match walking back from the footer, so a later duplicate loses.
    if (!table.has(guid)) table.set(guid, Buffer.from(firmware.subarray(end - length, end - ENTRY_HEADER_BYTES)));
    end -= length;
  }
  return table;
}

function u32At(entry: Buffer, guid: string, offset = 0): number {
  if (entry.length < offset + 4) malformed(`the footer table entry ${guid} is ${entry.length} bytes, too short`);
  return entry.readUInt32LE(offset);
}

/** The kinds of range the SNP metadata lists (edk2 OvmfSevMetadata.asm). */
export const SEV_SECTION_KINDS = {
  1: 'SNP_SEC_MEM',
  2: 'SNP_SECRETS',
  3: 'CPUID',
  4: 'SVSM_CAA',
  16: 'SNP_KERNEL_HASHES',
} as const;
/** The name of an SNP metadata range's type. */
export type SevSectionKind = (typeof SEV_SECTION_KINDS)[keyof typeof SEV_SECTION_KINDS];

/** One range of the SNP metadata: guest physical address and size in bytes. */
export interface SevMetadataSection {
  kind: SevSectionKind;
  gpa: number;
  sizeBytes: number;
}

/** What SNP launch prediction needs from an OVMF image. */
export interface OvmfSevInfo {
  /** The SEV-ES AP reset EIP, when the image has the reset block. */
  apResetEip?: number;
  /** Guest physical address of the kernel hashes table, when the image offers one. */
  hashesTableGpa?: number;
  /** The SNP metadata ranges in the image's order (the order QEMU measures them). */
  sections: SevMetadataSection[];
}

/** "ASEV" signature, version 1, then the number of 12-byte items. */
const SEV_METADATA_HEADER_BYTES = 16;
const SEV_METADATA_ITEM_BYTES = 12;

/**
 * Reads the SEV-related entries of an OVMF image. An image without SEV metadata gives no
 * sections (a plain OvmfPkgX64 build); one whose metadata is present but out of bounds, of
 * another version or of an unknown section type is refused.
 */
export function parseSevMetadata(firmware: Buffer): OvmfSevInfo {
  const table = parseOvmfFooterTable(firmware);
  const info: OvmfSevInfo = { sections: [] };
  const reset = table.get(SEV_ES_RESET_BLOCK_GUID);
  if (reset !== undefined) info.apResetEip = u32At(reset, SEV_ES_RESET_BLOCK_GUID);
  const hashes = table.get(SEV_HASH_TABLE_RV_GUID);
  if (hashes !== undefined) {
    const gpa = u32At(hashes, SEV_HASH_TABLE_RV_GUID);
    // QEMU treats a zero address as "no table", and so do we.
    if (gpa !== 0) info.hashesTableGpa = gpa;
  }
  const meta = table.get(OVMF_SEV_METADATA_GUID);
  if (meta === undefined) return info;
  const offsetFromEnd = u32At(meta, OVMF_SEV_METADATA_GUID);
  const start = firmware.length - offsetFromEnd;
  if (offsetFromEnd > firmware.length || start + SEV_METADATA_HEADER_BYTES > firmware.length) {
    malformed(`the SEV metadata offset ${offsetFromEnd} lies outside the image`);
  }
  if (firmware.toString('latin1', start, start + 4) !== 'ASEV') malformed('the SEV metadata has no ASEV signature');
  const headerSize = firmware.readUInt32LE(start + 4);
  const version = firmware.readUInt32LE(start + 8);
  const count = firmware.readUInt32LE(start + 12);
  if (version !== 1) malformed(`the SEV metadata has version ${version}, not 1`);
  const itemsEnd = start + SEV_METADATA_HEADER_BYTES + count * SEV_METADATA_ITEM_BYTES;
  if (itemsEnd > firmware.length || itemsEnd > start + headerSize) {
    malformed(`the SEV metadata lists ${count} sections beyond its ${headerSize} bytes`);
  }
  for (let i = 0; i < count; i++) {
    const at = start + SEV_METADATA_HEADER_BYTES + i * SEV_METADATA_ITEM_BYTES;
    const gpa = firmware.readUInt32LE(at);
    const sizeBytes = firmware.readUInt32LE(at + 4);
    const type = firmware.readUInt32LE(at + 8);
    const kind = SEV_SECTION_KINDS[type as keyof typeof SEV_SECTION_KINDS];
    if (kind === undefined) malformed(`SEV metadata section ${i} has unknown type ${type}`);
    if (gpa % 4096 !== 0 || sizeBytes % 4096 !== 0) {
      malformed(`SEV metadata section ${i} (${kind}) is not page aligned`);
    }
    info.sections.push({ kind, gpa, sizeBytes });
  }
  return info;
}

/** TDVF section types (edk2 IntelTdxMetadata.asm). */
export const TDVF_SECTION_KINDS = {
  0: 'BFV',
  1: 'CFV',
  2: 'TD_HOB',
  3: 'TEMP_MEM',
  4: 'PERM_MEM',
  5: 'PAYLOAD',
  6: 'PAYLOAD_PARAM',
  7: 'TD_INFO',
  8: 'TD_PARAMS',
} as const;
/** The name of a TDVF section's type. */
export type TdvfSectionKind = (typeof TDVF_SECTION_KINDS)[keyof typeof TDVF_SECTION_KINDS];

/** The section's pages are extended into MRTD (TDH.MR.EXTEND). */
export const TDVF_ATTRIBUTE_EXTEND_MR = 0x1;
/** The section's pages are accepted by the guest later (TDH.MEM.PAGE.AUG), not added at launch. */
export const TDVF_ATTRIBUTE_PAGE_AUG = 0x2;

/** One TDVF section: where its bytes are in the image and where they go in the guest. */
export interface TdvfSection {
  kind: TdvfSectionKind;
  dataOffset: number;
  rawDataBytes: number;
  memoryAddress: number;
  memoryBytes: number;
  attributes: number;
}

/** "TDVF", u32 length, u32 version (1), u32 number of 32-byte sections. */
const TDVF_DESCRIPTOR_BYTES = 16;
const TDVF_SECTION_BYTES = 32;

function u64At(buf: Buffer, offset: number, what: string): number {
  const v = buf.readBigUInt64LE(offset);
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) malformed(`${what} is ${v}, beyond what kata-ts reads`);
  return Number(v);
}

/**
 * Reads the TDVF descriptor of a TDX-capable OVMF image (OVMF.inteltdx). Refuses an image
 * without one, and any section whose bytes lie outside the image or whose memory range is not
 * page aligned, as QEMU does.
 */
export function parseTdvfMetadata(firmware: Buffer): TdvfSection[] {
  const table = parseOvmfFooterTable(firmware);
  const entry = table.get(TDX_METADATA_OFFSET_GUID);
  if (entry === undefined) {
    throw invalid('MEASURE_FIRMWARE_UNSUPPORTED', 'firmware has no TDX metadata (not a TDVF/OVMF.inteltdx build)');
  }
  // The entry holds one u32 (edk2's TdxMetadataOffset); QEMU reads the first four bytes.
  const offsetFromEnd = u32At(entry, TDX_METADATA_OFFSET_GUID);
  const start = firmware.length - offsetFromEnd;
  if (offsetFromEnd > firmware.length || start + TDVF_DESCRIPTOR_BYTES > firmware.length) {
    malformed(`the TDVF descriptor offset ${offsetFromEnd} lies outside the image`);
  }
  if (firmware.toString('latin1', start, start + 4) !== 'TDVF') malformed('the TDX metadata has no TDVF signature');
  const version = firmware.readUInt32LE(start + 8);
  const count = firmware.readUInt32LE(start + 12);
  if (version !== 1) malformed(`the TDVF descriptor has version ${version}, not 1`);
  if (start + TDVF_DESCRIPTOR_BYTES + count * TDVF_SECTION_BYTES > firmware.length) {
    malformed(`the TDVF descriptor lists ${count} sections beyond the image`);
  }
  const sections: TdvfSection[] = [];
  for (let i = 0; i < count; i++) {
    const at = start + TDVF_DESCRIPTOR_BYTES + i * TDVF_SECTION_BYTES;
    const type = firmware.readUInt32LE(at + 24);
    const kind = TDVF_SECTION_KINDS[type as keyof typeof TDVF_SECTION_KINDS];
    if (kind === undefined) malformed(`TDVF section ${i} has unknown type ${type}`);
    const section: TdvfSection = {
      kind,
      dataOffset: firmware.readUInt32LE(at),
      rawDataBytes: firmware.readUInt32LE(at + 4),
      memoryAddress: u64At(firmware, at + 8, `TDVF section ${i}'s memory address`),
      memoryBytes: u64At(firmware, at + 16, `TDVF section ${i}'s memory size`),
      attributes: firmware.readUInt32LE(at + 28),
    };
    if (section.memoryAddress % 4096 !== 0 || section.memoryBytes % 4096 !== 0) {
      malformed(`TDVF section ${i} (${kind}) is not page aligned`);
    }
    if (section.rawDataBytes > section.memoryBytes) {
      malformed(`TDVF section ${i} (${kind}) has more raw data than memory`);
    }
    if (section.rawDataBytes > 0 && section.dataOffset + section.rawDataBytes > firmware.length) {
      malformed(`TDVF section ${i} (${kind}) lies outside the image`);
    }
    sections.push(section);
  }
  return sections;
}
