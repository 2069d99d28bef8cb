/**
 * The dm-verity hash tree (src/measure/verity.ts) against vectors derived independently with
 * cryptsetup's own library (test/fixtures/measure/verity-vectors.c: libcryptsetup 2.6.1,
 * crypt_format VERITY with CREATE_HASH | NO_HEADER, as `veritysetup format --no-superblock`):
 * the root hash and the sha256 of the whole tree, for 0, 1, 2 and 3 levels, with a 31-byte salt,
 * an empty salt and a one-byte salt. The kernel checks the same format when a guest boots
 * (test/integration/measure/guest-verity.test.ts).
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { isReason } from '../../../src/common/errors.js';
import { buildVerityTree, VERITY_BLOCK_BYTES, verityHashBlocks, verityLevels, verityTreeOf } from '../../../src/measure/verity.js';

const SALT = Buffer.from('6b6174612d74732076657269747920746573742073616c7420303030303030', 'hex');

/** The vector generator's data: byte at offset o is (o * 31 + (o >> 12) * 7) & 0xff. */
function pattern(blocks: number): Buffer {
  const data = Buffer.alloc(blocks * VERITY_BLOCK_BYTES);
  for (let o = 0; o < data.length; o++) data[o] = (o * 31 + Math.floor(o / 4096) * 7) & 0xff;
  return data;
}

const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
const EMPTY_SHA256 = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';

const VECTORS = [
  {
    blocks: 1,
    salt: SALT,
    levels: 0,
    root: 'fff6fb79602256e15234ee6fea519b87118bd48dc603210afb9dbda2ace13c33',
    tree: EMPTY_SHA256,
    treeBytes: 0,
  },
  {
    blocks: 3,
    salt: SALT,
    levels: 1,
    root: '6cc0832d34f4e275a1f2450fe7460c0b32659f56184bae212cd0dbede461a3c1',
    tree: 'ce00e7097a5550ae8628def9cefa27999dd0465debb633a17c1cfc3436332546',
    treeBytes: 4096,
  },
  {
    blocks: 129,
    salt: SALT,
    levels: 2,
    root: 'f8749c88326c4d34691a49fc5c477c463d7894fd76688c278d7cd45359b2e070',
    tree: '005237b73c3f81e96c65279d6584a0ee2da8e041d52e2c8a3bb09abb8c03bd93',
    treeBytes: 12288,
  },
  {
    blocks: 16385,
    salt: SALT,
    levels: 3,
    root: '07250eeff49a4ecf749ba133cb20efc26116e1202ccd7310a2d9159b7a4885de',
    tree: '110cef93556ae8d22df76d4d46a54dd009bb613f6314451dcef8d175379cd748',
    treeBytes: 540672,
  },
  {
    blocks: 2,
    salt: Buffer.alloc(0),
    levels: 1,
    root: '1ecb7bd66ead7d2a41a5e093ab54b1872feceb4344534a619778646f61ea0fb3',
    // With no salt and a single hash block, the root is the sha256 of the whole tree.
    tree: '1ecb7bd66ead7d2a41a5e093ab54b1872feceb4344534a619778646f61ea0fb3',
    treeBytes: 4096,
  },
  {
    blocks: 300,
    salt: Buffer.from([0]),
    levels: 2,
    root: '752477002b12b90a0e21a204790686d419f741d3946dfe281053028846074270',
    tree: 'baffdb15d2702f7693c4250e0238cdd0dc4a5ed9a9ae5f160d53ac23563b9e93',
    treeBytes: 4 * 4096,
  },
];

describe('dm-verity hash tree (version 1, sha256, 4096-byte blocks)', () => {
  it.each(VECTORS)('$blocks data blocks, $levels levels: root hash and tree equal libcryptsetup', (v) => {
    const t = verityTreeOf(pattern(v.blocks), v.salt);
    expect(t.levels).toBe(v.levels);
    expect(t.dataBlocks).toBe(v.blocks);
    expect(t.rootHash.toString('hex')).toBe(v.root);
    expect(t.tree.length).toBe(v.treeBytes);
    expect(verityHashBlocks(v.blocks) * VERITY_BLOCK_BYTES).toBe(v.treeBytes);
    expect(sha256(t.tree)).toBe(v.tree);
  });

  it('levels follow the kernel: the smallest L with (blocks - 1) >> 7L == 0', () => {
    expect([1, 2, 128, 129, 16384, 16385, 2097152, 2097153].map(verityLevels)).toEqual([0, 1, 1, 2, 2, 3, 3, 4]);
  });

  it('one flipped byte in any data block changes the root hash', () => {
    const data = pattern(129);
    const root = verityTreeOf(data, SALT).rootHash.toString('hex');
    for (const offset of [0, 4096 * 64 + 17, data.length - 1]) {
      const changed = Buffer.from(data);
      changed[offset] = (changed[offset] ?? 0) ^ 1;
      expect(verityTreeOf(changed, SALT).rootHash.toString('hex')).not.toBe(root);
    }
  });

  it('reads the data in chunks, in order, and gives the same tree as the whole buffer', () => {
    const data = pattern(600);
    const reads: number[] = [];
    const t = buildVerityTree(
      (offset, length) => {
        reads.push(offset);
        return data.subarray(offset, offset + length);
      },
      data.length,
      SALT,
    );
    expect(reads).toEqual([...reads].sort((a, b) => a - b));
    expect(reads.length).toBeGreaterThan(1);
    expect(t.rootHash.equals(verityTreeOf(data, SALT).rootHash)).toBe(true);
  });

  it('refuses data that is not whole blocks, a short read and an oversized salt, with a code', () => {
    const code = (fn: () => unknown): string | undefined => {
      try {
        fn();
      } catch (err) {
        return isReason(err, 'MEASURE_VERITY_INPUT_INVALID') ? err.reason : 'other';
      }
      return undefined;
    };
    expect(code(() => verityTreeOf(Buffer.alloc(4095), SALT))).toBe('MEASURE_VERITY_INPUT_INVALID');
    expect(code(() => verityTreeOf(Buffer.alloc(0), SALT))).toBe('MEASURE_VERITY_INPUT_INVALID');
    expect(code(() => buildVerityTree(() => Buffer.alloc(10), 4096, SALT))).toBe('MEASURE_VERITY_INPUT_INVALID');
    expect(code(() => verityTreeOf(Buffer.alloc(4096), Buffer.alloc(257)))).toBe('MEASURE_VERITY_INPUT_INVALID');
  });
});
