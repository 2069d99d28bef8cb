/**
 * The guest image's dm-verity parameters: the file scripts/build-guest.sh writes beside guest.img
 * (`guest.img.verity.json`), and the kernel parameter that carries them to guest/init on the
 * measured command line of a TEE pod. The hash tree itself follows the image's data in the same
 * file (hash_start_block = the data's block count); src/measure/verity.ts computes it.
 *
 * Why the command line: it is what every TEE profile measures before the guest runs (PCR 9 for
 * vtpm, the kernel-hashes table for SNP, RTMR[2] for TDX). With the root hash in it, a guest
 * image the host swapped after planning fails dm-verity's check in the guest instead of running.
 */
import { promises as fsp } from 'node:fs';
import { errnoCode, invalid } from '../common/errors.js';

/** The kernel parameter guest/init reads from /proc/cmdline. */
export const VERITY_KERNEL_PARAM = 'kata_ts.verity';
/** What the metadata file says it is. */
export const GUEST_IMAGE_VERITY_SCHEMA = 'kata-ts/guest-image-verity/v1';
/** The one layout kata-ts builds: dm-verity format version 1, sha256, 4096-byte data and hash blocks. */
export const GUEST_VERITY_BLOCK_BYTES = 4096;
/** The metadata file is a few hundred bytes; more is refused before parsing. */
const METADATA_MAX_BYTES = 4096;

/** The dm-verity table of a guest image, as guest/init hands it to the kernel. */
export interface GuestImageVerity {
  /** sha256 of the top hash block, 64 lowercase hex digits. */
  rootHash: string;
  /** The salt, lowercase hex (1 to 256 bytes). */
  salt: string;
  /** 4096-byte blocks of erofs data the tree covers. */
  dataBlocks: number;
  /** Where the tree starts in the same file, in 4096-byte blocks. */
  hashStartBlock: number;
}

/** The metadata file's path for an image: beside it, `<image>.verity.json`. */
export function guestImageVerityPath(imagePath: string): string {
  return `${imagePath}.verity.json`;
}

function bad(field: string, message: string): Error {
  return invalid('GUEST_IMAGE_VERITY_INVALID', `guest image verity ${field} ${message}.`, { details: { field } });
}

function hex(field: string, value: unknown, minBytes: number, maxBytes: number): string {
  if (typeof value !== 'string' || !/^(?:[0-9a-f]{2})+$/.test(value) || value.length / 2 < minBytes || value.length / 2 > maxBytes) {
    const size = minBytes === maxBytes ? `${minBytes}` : `${minBytes} to ${maxBytes}`;
    throw bad(field, `must be ${size} bytes of lowercase hex`);
  }
  return value;
}

function blocks(field: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) throw bad(field, 'must be a positive whole number');
  return value;
}

/**
 * Checks a parsed metadata document (what build-guest.sh wrote) and returns its table. Every
 * field is checked, because its values end up in a kernel parameter and a dm table line.
 */
export function parseGuestImageVerity(doc: unknown): GuestImageVerity {
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw bad('document', 'must be a JSON object');
  const d = doc as Record<string, unknown>;
  if (d.schema !== GUEST_IMAGE_VERITY_SCHEMA) throw bad('schema', `must be ${GUEST_IMAGE_VERITY_SCHEMA}`);
  if (d.version !== 1) throw bad('version', 'must be 1 (salt first)');
  if (d.hashAlgorithm !== 'sha256') throw bad('hashAlgorithm', 'must be sha256');
  if (d.dataBlockSize !== GUEST_VERITY_BLOCK_BYTES) throw bad('dataBlockSize', `must be ${GUEST_VERITY_BLOCK_BYTES}`);
  if (d.hashBlockSize !== GUEST_VERITY_BLOCK_BYTES) throw bad('hashBlockSize', `must be ${GUEST_VERITY_BLOCK_BYTES}`);
  const verity: GuestImageVerity = {
    rootHash: hex('rootHash', d.rootHash, 32, 32),
    salt: hex('salt', d.salt, 1, 256),
    dataBlocks: blocks('dataBlocks', d.dataBlocks),
    hashStartBlock: blocks('hashStartBlock', d.hashStartBlock),
  };
  // The tree follows the data: starting inside it would hash blocks the tree overwrote.
  if (verity.hashStartBlock < verity.dataBlocks) throw bad('hashStartBlock', `must not be below dataBlocks (${verity.dataBlocks})`);
  return verity;
}

/** The metadata document build-guest.sh writes for a tree (the inverse of parseGuestImageVerity). */
export function guestImageVerityDocument(verity: GuestImageVerity): Record<string, unknown> {
  return {
    schema: GUEST_IMAGE_VERITY_SCHEMA,
    version: 1,
    hashAlgorithm: 'sha256',
    dataBlockSize: GUEST_VERITY_BLOCK_BYTES,
    hashBlockSize: GUEST_VERITY_BLOCK_BYTES,
    ...verity,
  };
}

/** `kata_ts.verity=<root hash>,<salt>,<data blocks>,<hash start block>`: what guest/init parses. */
export function verityKernelParam(verity: GuestImageVerity): string {
  const v = parseGuestImageVerity(guestImageVerityDocument(verity));
  return `${VERITY_KERNEL_PARAM}=${v.rootHash},${v.salt},${v.dataBlocks},${v.hashStartBlock}`;
}

/**
 * The verity table of a guest image, from the file beside it; null when the image has none (built
 * before verity, or by hand). A file that exists but is unreadable, too large or malformed is a
 * coded error naming the field.
 */
export async function readGuestImageVerity(imagePath: string): Promise<GuestImageVerity | null> {
  const file = guestImageVerityPath(imagePath);
  let text: string;
  try {
    const handle = await fsp.open(file, 'r');
    try {
      const buffer = Buffer.alloc(METADATA_MAX_BYTES + 1);
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0);
      if (bytesRead > METADATA_MAX_BYTES) throw bad('document', `${file} is larger than ${METADATA_MAX_BYTES} bytes`);
      text = buffer.subarray(0, bytesRead).toString('utf8');
    } finally {
      await handle.close();
    }
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT') return null;
    if (code === undefined) throw err;
    throw bad('document', `${file} cannot be read (${code})`);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw bad('document', `${file} is not JSON`);
  }
  return parseGuestImageVerity(doc);
}
