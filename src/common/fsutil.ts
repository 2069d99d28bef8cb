import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from './errors.js';

/**
 * Replace `file` with `data` so that a reader (or a crash) sees either the old or the new content,
 * never a mix: write a temporary sibling, fsync it, rename it over the target, fsync the directory.
 */
export async function writeFileAtomic(file: string, data: string | Uint8Array, mode = 0o600): Promise<void> {
  const dir = path.dirname(file);
  const tmp = path.join(dir, `.${path.basename(file)}.${randomBytes(6).toString('hex')}.tmp`);
  const handle = await fsp.open(tmp, 'wx', mode);
  try {
    try {
      await handle.writeFile(data);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await fsp.rename(tmp, file);
  } catch (err) {
    // A full disk fails the write: the temporary file must not stay behind to fill it further.
    await fsp.rm(tmp, { force: true });
    // A failed write(2) names no path: name the file, so the error says where the disk is full.
    if (err instanceof Error && errnoCode(err) !== undefined && (err as { path?: string }).path === undefined)
      Object.assign(err, { path: file });
    throw err;
  }
  await fsyncDir(dir);
}

export async function fsyncDir(dir: string): Promise<void> {
  const handle = await fsp.open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** Read a file, returning undefined when it does not exist. */
export async function readFileIfExists(file: string): Promise<string | undefined> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

/** True when `p` is a directory (following symlinks); false when missing or not a directory. */
export async function isDirectory(p: string): Promise<boolean> {
  try {
    return (await fsp.stat(p)).isDirectory();
  } catch {
    return false;
  }
}

export async function pathExists(p: string): Promise<boolean> {
  try {
    await fsp.access(p);
    return true;
  } catch {
    return false;
  }
}
