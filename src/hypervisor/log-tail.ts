import { constants, promises as fsp } from 'node:fs';
import { errnoCode, precondition } from '../common/errors.js';

/** The most of a log file a tail reads: what a few error lines need, bounded whatever the file holds. */
export const TAIL_WINDOW_BYTES = 64 * 1024;

/**
 * How a log file is opened for reading when a VMM may have written its directory: never through
 * a symlink in the last component (O_NOFOLLOW: a QEMU that swapped `console.log` for a link to a
 * root-only file must not have it read as root), and never blocking (O_NONBLOCK: a FIFO planted
 * in its place would hang the open). The caller checks with fstat that it got a regular file.
 */
export const UNTRUSTED_READ_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/**
 * Open `file` for reading without following a link or blocking, and check it is a regular file
 * with one name (a hard link to someone else's file is refused too). ENOENT gives undefined;
 * anything else that is not a plain file is LOG_FILE_UNSAFE.
 */
export async function openUntrusted(file: string, flags = UNTRUSTED_READ_FLAGS): Promise<fsp.FileHandle | undefined> {
  let handle: fsp.FileHandle;
  try {
    handle = await fsp.open(file, flags);
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT') return undefined;
    if (code === 'ELOOP') throw precondition('LOG_FILE_UNSAFE', `${file} is a symlink; it is not followed.`);
    throw err;
  }
  const stat = await handle.stat().catch(async (err: unknown) => {
    await handle.close();
    throw err;
  });
  if (!stat.isFile() || stat.nlink !== 1) {
    await handle.close();
    throw precondition('LOG_FILE_UNSAFE', `${file} is not a regular file with a single name; it is not read.`);
  }
  return handle;
}

/**
 * The last `lines` lines of a log file ('' when it does not exist); reads at most
 * TAIL_WINDOW_BYTES, never through a symlink, never from anything but a regular file.
 */
export async function tailFile(file: string, lines: number): Promise<string> {
  const handle = await openUntrusted(file);
  if (handle === undefined) return '';
  try {
    const { size } = await handle.stat();
    const length = Math.min(size, TAIL_WINDOW_BYTES);
    const buffer = Buffer.alloc(length);
    const { bytesRead } = await handle.read(buffer, 0, length, size - length);
    const all = buffer.subarray(0, bytesRead).toString('utf8').replace(/\r/g, '').split('\n');
    if (all.at(-1) === '') all.pop();
    return all.slice(-lines).join('\n');
  } finally {
    await handle.close();
  }
}
