import { promises as fsp } from 'node:fs';
import { errnoCode } from '../common/errors.js';

export interface GuestAssetPaths {
  kernelPath: string;
  initrdPath: string;
  /** The read-only guest image (guest.img); not checked when absent or null. */
  guestImagePath?: string | null;
}

/** The verdict `doctor` and Status print: ok, and one sentence per problem found. */
export interface GuestAssetCheck {
  ok: boolean;
  message: string;
  problems: string[];
}

/** Offset of the "HdrS" magic in an x86 bzImage's setup header (Linux boot protocol). */
const BZIMAGE_MAGIC_OFFSET = 0x202;
/** The erofs superblock starts 1024 bytes in, with its magic (little-endian) first. */
const EROFS_SUPER_OFFSET = 1024;
const EROFS_MAGIC = 0xe0f5e1e2;

/**
 * Check that the guest kernel and initramfs exist and look like what QEMU's `-kernel`/`-initrd`
 * expect (an x86 bzImage with its "HdrS" header; a gzip-compressed cpio; an erofs guest image), so that a broken setup
 * is reported by `doctor` instead of as a VM that never signals ready. Reads a few bytes only.
 */
export async function checkGuestAssets(paths: GuestAssetPaths): Promise<GuestAssetCheck> {
  const problems: string[] = [];
  const kernel = await readHead(paths.kernelPath, BZIMAGE_MAGIC_OFFSET + 4);
  if (typeof kernel === 'string') problems.push(`guest kernel ${paths.kernelPath} ${kernel}`);
  else if (kernel.subarray(BZIMAGE_MAGIC_OFFSET, BZIMAGE_MAGIC_OFFSET + 4).toString('latin1') !== 'HdrS') {
    problems.push(`guest kernel ${paths.kernelPath} is not an x86 bzImage (no HdrS header at 0x202)`);
  }
  const initrd = await readHead(paths.initrdPath, 2);
  if (typeof initrd === 'string') problems.push(`guest initramfs ${paths.initrdPath} ${initrd}`);
  else if (initrd[0] !== 0x1f || initrd[1] !== 0x8b) problems.push(`guest initramfs ${paths.initrdPath} is not gzip-compressed`);
  const imagePath = paths.guestImagePath ?? null;
  if (imagePath !== null) {
    const image = await readHead(imagePath, EROFS_SUPER_OFFSET + 4);
    if (typeof image === 'string') problems.push(`guest image ${imagePath} ${image}`);
    else if (image.readUInt32LE(EROFS_SUPER_OFFSET) !== EROFS_MAGIC) problems.push(`guest image ${imagePath} is not an erofs image`);
  }

  if (problems.length === 0) {
    const files = `guest kernel ${paths.kernelPath}${imagePath === null ? ' and' : ','} initramfs ${paths.initrdPath}`;
    const image = imagePath === null ? '' : ` and image ${imagePath}`;
    return { ok: true, message: `${files}${image} are present`, problems };
  }
  return {
    ok: false,
    message: `${problems.join('; ')} (build them with scripts/build-guest.sh)`,
    problems,
  };
}

/** The first `length` bytes of a regular file, or why they cannot be had. */
async function readHead(file: string, length: number): Promise<Buffer | string> {
  let handle: fsp.FileHandle;
  try {
    const stat = await fsp.stat(file);
    if (!stat.isFile()) return 'is not a regular file';
    handle = await fsp.open(file, 'r');
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT') return 'is missing';
    return `cannot be read (${code ?? 'error'})`;
  }
  try {
    const buffer = Buffer.alloc(length);
    const { bytesRead } = await handle.read(buffer, 0, length, 0);
    if (bytesRead < length) return `is too short (${bytesRead} bytes)`;
    return buffer;
  } finally {
    await handle.close();
  }
}
