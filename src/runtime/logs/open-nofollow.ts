/**
 * Opening a CRI log file as root without following a symbolic link anywhere on its path. The
 * path comes from a request (log_directory joined with log_path, both checked to be normalised
 * and free of `..`), but the directories on it are the host's: a link planted there (in /tmp, or
 * by a pod that writes into a hostPath volume) would make the daemon append to, create or cut a
 * file of the link's choosing. Each component is opened beneath the previous one's descriptor
 * with O_NOFOLLOW, through `/proc/self/fd/<fd>/<name>` (Node has no openat): the magic link
 * names the directory already held, and only `<name>` is resolved, without following it.
 */
import { constants, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { errnoCode, invalid, precondition } from '../../common/errors.js';
import './reasons.js';

const DIR_FLAGS = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;
/**
 * (libuv opens every file close-on-exec.) O_NONBLOCK: a FIFO planted at the log path fails with ENXIO instead of blocking a thread of
 * libuv's pool until a reader comes (regular files ignore the flag).
 */
const LOG_FLAGS = constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/** The components of an absolute, normalised path; refused (INVALID_ARGUMENT) otherwise. */
function componentsOf(absPath: string): string[] {
  const parts = absPath.split('/').slice(1);
  if (!absPath.startsWith('/') || parts.some((p) => p === '' || p === '.' || p === '..' || p.includes('\0')))
    throw invalid('LOGS_PATH_UNUSABLE', `log path ${JSON.stringify(absPath)} is not an absolute, normalised path`);
  return parts;
}

const beneath = (dir: FileHandle, name: string): string => `/proc/self/fd/${dir.fd}/${name}`;

/** Why opening `name` failed, said as the request's fault (a link or a non-directory on its path) where it is. */
function unusable(err: unknown, shown: string): unknown {
  const code = errnoCode(err);
  // ELOOP: O_NOFOLLOW met a link; ENOTDIR: a file (or a link, for O_DIRECTORY) where a directory must be.
  if (code === 'ELOOP' || code === 'ENOTDIR' || code === 'EISDIR' || code === 'ENXIO' || code === 'ENAMETOOLONG')
    return precondition('LOGS_PATH_UNUSABLE', `${shown} cannot be used for a log (${code}: a symbolic link, or not what it must be).`, {
      cause: err,
    });
  if (code === 'ENOENT') return precondition('LOGS_DIR_MISSING', `log directory of ${shown} does not exist.`, { cause: err });
  return err;
}

/**
 * Open the directory `absDir` component by component without following links; with `create`,
 * missing components are made (mode 0755, as containerd makes a log's directory) beneath the
 * last one that exists. The caller closes the handle.
 */
export async function openDirNoFollow(absDir: string, options: { create: boolean }): Promise<FileHandle> {
  let dir = await fsp.open('/', DIR_FLAGS);
  let shown = '';
  try {
    for (const name of componentsOf(absDir)) {
      shown = `${shown}/${name}`;
      let next: FileHandle;
      try {
        next = await fsp.open(beneath(dir, name), DIR_FLAGS);
      } catch (err) {
        if (!(options.create && errnoCode(err) === 'ENOENT')) throw unusable(err, shown);
        // mkdir does not follow a link in its last component (EEXIST if a link appeared meanwhile).
        await fsp.mkdir(beneath(dir, name), { mode: 0o755 }).catch((e: unknown) => {
          if (errnoCode(e) !== 'EEXIST') throw e;
        });
        next = await fsp.open(beneath(dir, name), DIR_FLAGS).catch((e: unknown) => {
          throw unusable(e, shown);
        });
      }
      await dir.close();
      dir = next;
    }
    return dir;
  } catch (err) {
    await dir.close();
    throw err;
  }
}

/**
 * Open the CRI log file `absPath` for appending (created 0640 if missing) with no link followed
 * on its whole path, its directories made when `createDirs`; refused unless it is a regular file.
 */
export async function openLogNoFollow(absPath: string, options: { createDirs: boolean }): Promise<FileHandle> {
  const parts = componentsOf(absPath);
  const name = parts.pop() as string;
  const dir = await openDirNoFollow(`/${parts.join('/')}`, { create: options.createDirs });
  try {
    const file = await fsp.open(beneath(dir, name), LOG_FLAGS, 0o640).catch((err: unknown) => {
      throw unusable(err, absPath);
    });
    const st = await file.stat();
    if (!st.isFile()) {
      await file.close();
      throw precondition('LOGS_PATH_UNUSABLE', `${absPath} cannot be used for a log: it is not a regular file.`);
    }
    return file;
  } finally {
    await dir.close();
  }
}

/**
 * The first component of `absPath` that is a symbolic link, among those that exist (the rest may
 * be made later, by the kubelet or by openDirNoFollow, never as links of ours), or undefined.
 * Read-only: what RunPodSandbox checks of a log_directory before anything is made.
 */
export async function firstSymlinkIn(absPath: string): Promise<string | undefined> {
  let at = '';
  for (const name of componentsOf(absPath)) {
    at = `${at}/${name}`;
    const st = await fsp.lstat(at).catch((err: unknown) => {
      if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return undefined;
      throw err;
    });
    if (st === undefined) return undefined;
    if (st.isSymbolicLink()) return at;
  }
  return undefined;
}
