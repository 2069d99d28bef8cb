/**
 * The Authenticode (PE/COFF image) SHA-256 hash, computed the way EDK2's measured boot hashes an
 * image before it runs it (the digest of the EV_EFI_BOOT_SERVICES_APPLICATION event in PCR 4).
 *
 * The rules, from Microsoft's PE/COFF "Authenticode" description as EDK2 implements them:
 * 1. the headers up to SizeOfHeaders, leaving out the 4-byte CheckSum field of the optional
 *    header and the 8-byte Certificate Table data directory (when the image has one);
 * 2. every section's raw data (SizeOfRawData bytes at PointerToRawData), sections sorted by
 *    PointerToRawData, sections without raw data skipped;
 * 3. whatever follows: from offset SumOfBytesHashed (headers + all raw data, not the end of the
 *    last section: gaps shift it, as EDK2 does) to the end of the file less the certificate
 *    table's size, so a signature appended at the end is not hashed.
 */
import { createHash } from 'node:crypto';
import { invalid } from '../common/errors.js';
import './reasons.js';

const PE32_MAGIC = 0x10b;
const PE32_PLUS_MAGIC = 0x20b;
const SECTION_HEADER_BYTES = 40;
/** Index of the Certificate Table ("security") entry among the data directories. */
const SECURITY_DIRECTORY_INDEX = 4;

/** Where the hashed and skipped parts of a PE image lie (all offsets from the file's start). */
export interface PeLayout {
  magic: 'PE32' | 'PE32+';
  checksumOffset: number;
  /** Offset of the Certificate Table data directory entry, null when the image has none. */
  certDirectoryOffset: number | null;
  certTableBytes: number;
  sizeOfHeaders: number;
  /** Sections with raw data, in hashing order. */
  sections: Array<{ name: string; pointerToRawData: number; sizeOfRawData: number }>;
}

function malformed(what: string): never {
  throw invalid('MEASURE_PE_MALFORMED', `the kernel image is not a PE/COFF file kata-ts can hash: ${what}`);
}

function u16(image: Buffer, offset: number, field: string): number {
  if (offset < 0 || offset + 2 > image.length) malformed(`${field} lies outside the file`);
  return image.readUInt16LE(offset);
}

function u32(image: Buffer, offset: number, field: string): number {
  if (offset < 0 || offset + 4 > image.length) malformed(`${field} lies outside the file`);
  return image.readUInt32LE(offset);
}

/** Reads the parts of a PE image's headers that Authenticode hashing needs (pure, bounded). */
export function parsePeLayout(image: Buffer): PeLayout {
  if (u16(image, 0, 'the MZ signature') !== 0x5a4d) malformed('no MZ signature');
  const pe = u32(image, 0x3c, 'e_lfanew');
  if (u32(image, pe, 'the PE signature') !== 0x00004550) malformed('no PE signature at e_lfanew');
  const coff = pe + 4;
  const numberOfSections = u16(image, coff + 2, 'NumberOfSections');
  const sizeOfOptionalHeader = u16(image, coff + 16, 'SizeOfOptionalHeader');
  const opt = coff + 20;
  const magicValue = u16(image, opt, 'the optional header magic');
  if (magicValue !== PE32_MAGIC && magicValue !== PE32_PLUS_MAGIC) malformed(`optional header magic 0x${magicValue.toString(16)}`);
  const plus = magicValue === PE32_PLUS_MAGIC;
  const sizeOfHeaders = u32(image, opt + 60, 'SizeOfHeaders');
  const checksumOffset = opt + 64;
  const numberOfRvaAndSizes = u32(image, opt + (plus ? 108 : 92), 'NumberOfRvaAndSizes');
  const directories = opt + (plus ? 112 : 96);
  const hasCertDirectory = numberOfRvaAndSizes > SECURITY_DIRECTORY_INDEX;
  const certDirectoryOffset = hasCertDirectory ? directories + SECURITY_DIRECTORY_INDEX * 8 : null;
  const certTableBytes = certDirectoryOffset === null ? 0 : u32(image, certDirectoryOffset + 4, 'the certificate table size');
  if (sizeOfHeaders > image.length) malformed('SizeOfHeaders is larger than the file');
  if (checksumOffset + 4 > sizeOfHeaders || (certDirectoryOffset !== null && certDirectoryOffset + 8 > sizeOfHeaders))
    malformed('the optional header extends past SizeOfHeaders');
  const table = opt + sizeOfOptionalHeader;
  const sections: PeLayout['sections'] = [];
  for (let i = 0; i < numberOfSections; i++) {
    const at = table + i * SECTION_HEADER_BYTES;
    if (at + SECTION_HEADER_BYTES > image.length) malformed(`section header ${i} lies outside the file`);
    const sizeOfRawData = image.readUInt32LE(at + 16);
    const pointerToRawData = image.readUInt32LE(at + 20);
    const name = image
      .subarray(at, at + 8)
      .toString('latin1')
      .replace(/\0+$/, '');
    if (sizeOfRawData === 0) continue;
    if (pointerToRawData + sizeOfRawData > image.length) malformed(`section ${JSON.stringify(name)} lies outside the file`);
    sections.push({ name, pointerToRawData, sizeOfRawData });
  }
  // A stable sort: sections at the same offset keep their table order, as EDK2's insertion sort does.
  sections.sort((a, b) => a.pointerToRawData - b.pointerToRawData);
  return { magic: plus ? 'PE32+' : 'PE32', checksumOffset, certDirectoryOffset, certTableBytes, sizeOfHeaders, sections };
}

/** The Authenticode SHA-256 of a PE/COFF image, as EDK2 measures it into PCR 4. */
export function authenticodeSha256(image: Buffer): Buffer {
  return authenticodeDigest(image, 'sha256');
}

/**
 * The Authenticode digest of a PE/COFF image with another hash: the same ranges, e.g. SHA-384 as
 * a TDX guest's firmware measures the kernel into RTMR[1].
 */
export function authenticodeDigest(image: Buffer, algorithm: 'sha256' | 'sha384'): Buffer {
  const layout = parsePeLayout(image);
  const hash = createHash(algorithm);
  hash.update(image.subarray(0, layout.checksumOffset));
  if (layout.certDirectoryOffset === null) {
    hash.update(image.subarray(layout.checksumOffset + 4, layout.sizeOfHeaders));
  } else {
    hash.update(image.subarray(layout.checksumOffset + 4, layout.certDirectoryOffset));
    hash.update(image.subarray(layout.certDirectoryOffset + 8, layout.sizeOfHeaders));
  }
  let sumOfBytesHashed = layout.sizeOfHeaders;
  for (const s of layout.sections) {
    hash.update(image.subarray(s.pointerToRawData, s.pointerToRawData + s.sizeOfRawData));
    sumOfBytesHashed += s.sizeOfRawData;
  }
  if (image.length > sumOfBytesHashed) {
    const end = image.length - layout.certTableBytes;
    if (end < sumOfBytesHashed) malformed('the certificate table is larger than the data after the sections');
    hash.update(image.subarray(sumOfBytesHashed, end));
  }
  return hash.digest();
}
