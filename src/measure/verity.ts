/**
 * A dm-verity hash tree (on-disk format version 1, sha256, 4096-byte data and hash blocks), as
 * the Linux kernel's dm-verity target reads it (drivers/md/dm-verity-target.c) and cryptsetup's
 * `veritysetup format --no-superblock` writes it:
 *
 * - every data block is hashed as sha256(salt ‖ block) (version 1 puts the salt first);
 * - a hash block holds 128 digests (4096 / 32, rounded down to a power of two), zero-padded;
 *   level 0 holds the digests of the data blocks, level i+1 those of the level-i hash blocks;
 * - levels are added until one hash block covers everything: the smallest L with
 *   (dataBlocks - 1) >> (7 * L) == 0;
 * - on disk the top level comes first, level 0 last (the kernel's hash_level_block order);
 * - the root hash is sha256(salt ‖ the single top-level block); with one data block and no
 *   level, it is the digest of that block.
 *
 * Pure: the caller hands in the data a chunk at a time, so a 100 MiB image is never held whole.
 */
import { createHash } from 'node:crypto';
import { invalid } from '../common/errors.js';

/** dm-verity's block size for data and hash blocks here (the page size, erofs's block size). */
export const VERITY_BLOCK_BYTES = 4096;
/** sha256's digest size. */
export const VERITY_DIGEST_BYTES = 32;
/** Digests per hash block, and its log2 (hash_per_block_bits in the kernel). */
const DIGESTS_PER_BLOCK = VERITY_BLOCK_BYTES / VERITY_DIGEST_BYTES;
const DIGESTS_PER_BLOCK_BITS = Math.log2(DIGESTS_PER_BLOCK);
/** veritysetup refuses salts longer than 256 bytes; kata-ts keeps to that. */
export const VERITY_MAX_SALT_BYTES = 256;

/** A computed tree: what goes on the hash device and what the table line names. */
export interface VerityTree {
  rootHash: Buffer;
  salt: Buffer;
  dataBlocks: number;
  /** Hash blocks, all levels, top level first: the bytes written at hash_start_block. */
  tree: Buffer;
  /** Number of levels (0 for a single data block). */
  levels: number;
}

/** sha256(salt ‖ block). */
function saltedDigest(salt: Buffer, block: Buffer): Buffer {
  return createHash('sha256').update(salt).update(block).digest();
}

/** The number of levels the kernel computes for `dataBlocks` (its `v->levels`). */
export function verityLevels(dataBlocks: number): number {
  let levels = 0;
  while (DIGESTS_PER_BLOCK_BITS * levels < 53 && Math.floor((dataBlocks - 1) / 2 ** (DIGESTS_PER_BLOCK_BITS * levels)) > 0) levels++;
  return levels;
}

/** Hash blocks of level `level` (0: the data digests) for `dataBlocks` data blocks. */
function blocksAtLevel(dataBlocks: number, level: number): number {
  return Math.ceil(dataBlocks / DIGESTS_PER_BLOCK ** (level + 1));
}

/** The size of the tree in hash blocks (what follows hash_start_block on the hash device). */
export function verityHashBlocks(dataBlocks: number): number {
  let total = 0;
  for (let level = 0; level < verityLevels(dataBlocks); level++) total += blocksAtLevel(dataBlocks, level);
  return total;
}

/** Packs digests into zero-padded hash blocks. */
function packDigests(digests: Buffer[]): Buffer {
  const blocks = Math.ceil(digests.length / DIGESTS_PER_BLOCK);
  const out = Buffer.alloc(blocks * VERITY_BLOCK_BYTES);
  digests.forEach((d, i) => {
    d.copy(out, i * VERITY_DIGEST_BYTES);
  });
  return out;
}

/**
 * Builds the tree over `dataBytes` bytes of data, read in order through `readChunk(offset,
 * length)` (which must return exactly `length` bytes). `dataBytes` must be a positive multiple of
 * the block size: dm-verity verifies whole blocks only.
 */
export function buildVerityTree(readChunk: (offset: number, length: number) => Buffer, dataBytes: number, salt: Buffer): VerityTree {
  if (!Number.isSafeInteger(dataBytes) || dataBytes <= 0 || dataBytes % VERITY_BLOCK_BYTES !== 0) {
    throw invalid('MEASURE_VERITY_INPUT_INVALID', `dataBytes ${dataBytes} must be a positive multiple of ${VERITY_BLOCK_BYTES}`);
  }
  if (salt.length > VERITY_MAX_SALT_BYTES) {
    throw invalid('MEASURE_VERITY_INPUT_INVALID', `salt is ${salt.length} bytes, more than the ${VERITY_MAX_SALT_BYTES} dm-verity takes`);
  }
  const dataBlocks = dataBytes / VERITY_BLOCK_BYTES;
  const chunkBlocks = 256;
  let digests: Buffer[] = [];
  for (let first = 0; first < dataBlocks; first += chunkBlocks) {
    const count = Math.min(chunkBlocks, dataBlocks - first);
    const chunk = readChunk(first * VERITY_BLOCK_BYTES, count * VERITY_BLOCK_BYTES);
    if (chunk.length !== count * VERITY_BLOCK_BYTES) {
      throw invalid(
        'MEASURE_VERITY_INPUT_INVALID',
        `reading data block ${first} gave ${chunk.length} bytes, not ${count * VERITY_BLOCK_BYTES}`,
      );
    }
    for (let i = 0; i < count; i++) digests.push(saltedDigest(salt, chunk.subarray(i * VERITY_BLOCK_BYTES, (i + 1) * VERITY_BLOCK_BYTES)));
  }
  const levels = verityLevels(dataBlocks);
  // Level by level, bottom up; written top level first.
  const levelBytes: Buffer[] = [];
  for (let level = 0; level < levels; level++) {
    const packed = packDigests(digests);
    levelBytes.push(packed);
    digests = [];
    for (let off = 0; off < packed.length; off += VERITY_BLOCK_BYTES) {
      digests.push(saltedDigest(salt, packed.subarray(off, off + VERITY_BLOCK_BYTES)));
    }
  }
  const [rootHash] = digests;
  if (rootHash === undefined || digests.length !== 1) throw new Error(`verity tree ended with ${digests.length} top digests`);
  return { rootHash, salt, dataBlocks, tree: Buffer.concat(levelBytes.reverse()), levels };
}

/** The tree of a buffer held whole (tests, small images). */
export function verityTreeOf(data: Buffer, salt: Buffer): VerityTree {
  return buildVerityTree((offset, length) => data.subarray(offset, offset + length), data.length, salt);
}
