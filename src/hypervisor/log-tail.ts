import { promises as fsp } from 'node:fs';
import { errnoCode } from '../common/errors.js';

const TAIL_WINDOW_BYTES = 64 * 1024;

/** The last `lines` lines of a log file ('' when it does not exist); reads at most 64 KiB. */
export async function tailFile(file: string, lines: number): Promise<string> {
  let handle: fsp.FileHandle;
  try {
    handle = await fsp.open(file, 'r');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return '';
    throw err;
  }
  try {
    const { size } = await handle.stat();
    const length = Math.min(size, TAIL_WINDOW_BYTES);
    const buffer = Buffer.alloc(length);
    await handle.read(buffer, 0, length, size - length);
    const all = buffer.toString('utf8').replace(/\r/g, '').split('\n');
    if (all.at(-1) === '') all.pop();
    return all.slice(-lines).join('\n');
  } finally {
    await handle.close();
  }
}
