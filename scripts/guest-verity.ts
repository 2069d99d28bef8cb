/**
 * Appends a dm-verity hash tree to a guest image and writes its table beside it; run by
 * scripts/build-guest.sh on the freshly made erofs image, before it is moved into place:
 *
 *   node --import tsx scripts/guest-verity.ts --image FILE --metadata FILE
 *
 * The image's data (padded with zeros to whole 4096-byte blocks, which erofs ignores) is followed
 * by the tree (src/measure/verity.ts), so hash_start_block = the data's block count and one disk
 * carries both. The salt is sha256 of the data: a build of the same files gives the same salt,
 * tree and root hash, and two different images never share a salt. The metadata file is what
 * the runtime reads (src/hypervisor/guest-verity.ts) and puts on a TEE pod's command line.
 */
import { createHash } from 'node:crypto';
import { closeSync, fstatSync, openSync, readSync, renameSync, writeFileSync, writeSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { guestImageVerityDocument, parseGuestImageVerity } from '../src/hypervisor/guest-verity.js';
import { buildVerityTree, VERITY_BLOCK_BYTES } from '../src/measure/verity.js';

const CHUNK_BYTES = 1024 * 1024;

/** Reads exactly `length` bytes at `offset`, or fails. */
function readExactly(fd: number, offset: number, length: number): Buffer {
  const buffer = Buffer.alloc(length);
  let done = 0;
  while (done < length) {
    const n = readSync(fd, buffer, done, length - done, offset + done);
    if (n === 0) throw new Error(`the image ended at ${offset + done} bytes, before ${offset + length}`);
    done += n;
  }
  return buffer;
}

function main(): void {
  const { values } = parseArgs({ options: { image: { type: 'string' }, metadata: { type: 'string' } } });
  const image = values.image;
  const metadata = values.metadata;
  if (image === undefined || metadata === undefined) throw new Error('usage: guest-verity.ts --image FILE --metadata FILE');
  const fd = openSync(image, 'r+');
  try {
    const size = fstatSync(fd).size;
    if (size === 0) throw new Error(`${image} is empty`);
    const pad = (VERITY_BLOCK_BYTES - (size % VERITY_BLOCK_BYTES)) % VERITY_BLOCK_BYTES;
    if (pad > 0) writeSync(fd, Buffer.alloc(pad), 0, pad, size);
    const dataBytes = size + pad;
    const salt = createHash('sha256');
    for (let offset = 0; offset < dataBytes; offset += CHUNK_BYTES) {
      salt.update(readExactly(fd, offset, Math.min(CHUNK_BYTES, dataBytes - offset)));
    }
    const tree = buildVerityTree((offset, length) => readExactly(fd, offset, length), dataBytes, salt.digest());
    writeSync(fd, tree.tree, 0, tree.tree.length, dataBytes);
    const verity = parseGuestImageVerity(
      guestImageVerityDocument({
        rootHash: tree.rootHash.toString('hex'),
        salt: tree.salt.toString('hex'),
        dataBlocks: tree.dataBlocks,
        hashStartBlock: tree.dataBlocks,
      }),
    );
    writeFileSync(`${metadata}.tmp`, `${JSON.stringify(guestImageVerityDocument(verity), null, 2)}\n`);
    renameSync(`${metadata}.tmp`, metadata);
    process.stdout.write(`${verity.rootHash} ${tree.dataBlocks} data blocks, ${tree.tree.length / VERITY_BLOCK_BYTES} hash blocks\n`);
  } finally {
    closeSync(fd);
  }
}

main();
