/**
 * The caller's root: paths a caller (containerd) hands the shim, read in the caller's mount
 * namespace although the shim works in the runtime's own (src/runtime/mount-namespace.ts).
 *
 * The runtime's namespace is a slave of the one it was made from: where the host's root mount is
 * shared (systemd makes it so) it receives every later mount, and a caller's path names the same
 * file in both. Where the root is private (a host without systemd), whatever containerd mounts
 * after the runtime's namespace exists never arrives there: the pod's network namespace (a bind
 * mount of an nsfs file) is then an empty file in ours ("is not a namespace file").
 *
 * So the process that starts in the caller's namespace (the shim's `start`, and `delete` for its
 * cleanup) opens its root directory and hands the descriptor to the child it runs inside the
 * runtime's namespace (nsenter keeps descriptors open) at CALLER_ROOT_CHILD_FD, named in
 * CALLER_ROOT_ENV. The child adopts it once at start-up (adoptCallerRoot: a close-on-exec copy, so
 * QEMU and every other program it starts never holds a way into the caller's root) and from then
 * on names a caller's path as `/proc/<its pid>/fd/<n>/<path>`: a path walk through that magic link
 * goes on in the caller's mounts, also for the programs it runs (`ip`, `nsenter --net=`).
 * Symbolic links along the path are resolved in the caller's root (an absolute one would
 * otherwise jump back to ours: `/var/run` -> `/run`). That serves whatever is opened (a namespace
 * file, a FIFO, a file read); nothing reached so can be mounted into our namespace (the kernel
 * refuses overlay layers and bind sources of another mount namespace), which is why the shim
 * refuses such rootfs directories instead (src/shim/rootfs.ts requireSourcesSeen).
 *
 * callerPath keeps the path as it is when it names the very same file in this namespace (every
 * shared-root node: behaviour, records and logs unchanged) and when no caller root was handed
 * over (the standalone daemon; a shim run in the runtime's namespace already). Records keep the
 * caller's own path: a later process (a cleanup after the shim died) translates it with its own
 * descriptor.
 */
import { closeSync, constants, fstatSync, openSync, readlinkSync, statSync } from 'node:fs';
import path from 'node:path';
import { errnoCode, errorMessage, internal, invalid } from './errors.js';
import './reasons.js';

/** The environment entry naming the inherited descriptor of the caller's root (its number). */
export const CALLER_ROOT_ENV = 'KATA_TS_CALLER_ROOT_FD';
/** Where a child gets it: the first descriptor after stdio. */
export const CALLER_ROOT_CHILD_FD = 3;
/** As many symbolic links as Linux follows in one path walk (MAXSYMLINKS). */
const MAX_SYMLINKS = 40;

/** Reads the link at `p`; null when `p` is not a symbolic link (or does not exist). */
export type ReadLink = (p: string) => string | null;

/**
 * Pure: `callerPath` (absolute) as a path under `rootLink` (a directory standing for the caller's
 * root), every symbolic link on the way resolved inside that root as the caller would resolve it
 * (`..` never climbs above it). Throws INVALID_ARGUMENT for a relative path or a loop of links.
 */
export function pathInRoot(rootLink: string, callerPath: string, readlink: ReadLink): string {
  if (!path.posix.isAbsolute(callerPath) || callerPath.includes('\0')) {
    throw invalid('CALLER_PATH_INVALID', `the caller's path ${JSON.stringify(callerPath)} is not absolute.`, {
      details: { path: callerPath },
    });
  }
  const resolved: string[] = [];
  const pending = callerPath.split('/').filter((c) => c !== '');
  let links = 0;
  while (pending.length > 0) {
    const part = pending.shift() as string;
    if (part === '.') continue;
    if (part === '..') {
      resolved.pop();
      continue;
    }
    const target = readlink(path.posix.join(rootLink, ...resolved, part));
    if (target === null) {
      resolved.push(part);
      continue;
    }
    if (++links > MAX_SYMLINKS) {
      throw invalid('CALLER_PATH_INVALID', `the caller's path ${callerPath} has more than ${MAX_SYMLINKS} symbolic links on its way.`, {
        details: { path: callerPath },
      });
    }
    if (target.startsWith('/')) resolved.length = 0;
    pending.unshift(...target.split('/').filter((c) => c !== ''));
  }
  return path.posix.join(rootLink, ...resolved);
}

/** `/proc/<pid>/fd/<fd>` of this process's adopted caller root, or null (none handed over). */
let rootLink: string | null = null;

/**
 * Take over the caller's root a parent handed this process (CALLER_ROOT_ENV names its
 * descriptor): a close-on-exec copy is kept, the inherited descriptor closed and the entry removed
 * from `env`, so nothing this process starts inherits either. Without the entry: nothing to do.
 * Throws INTERNAL when the named descriptor is not an open directory.
 */
export function adoptCallerRoot(env: NodeJS.ProcessEnv = process.env, pid = process.pid): void {
  const named = env[CALLER_ROOT_ENV];
  if (named === undefined || named === '') return;
  delete env[CALLER_ROOT_ENV];
  const fd = Number(named);
  try {
    if (!Number.isSafeInteger(fd) || fd < 3 || !fstatSync(fd).isDirectory()) throw new Error('not a directory');
    // Node opens with O_CLOEXEC; through /proc the copy is the same directory on the caller's mount.
    const own = openSync(`/proc/self/fd/${fd}`, constants.O_RDONLY | constants.O_DIRECTORY);
    closeSync(fd);
    rootLink = `/proc/${pid}/fd/${own}`;
  } catch (err) {
    throw internal('CALLER_ROOT_INVALID', `${CALLER_ROOT_ENV}=${named} names no open directory: ${errorMessage(err)}.`);
  }
}

/** The adopted caller root's link (`/proc/<pid>/fd/<n>`), or null. */
export function callerRootLink(): string | null {
  return rootLink;
}

/** Open this process's root directory for a child (the caller's root, seen from the caller's namespace). */
export function openOwnRoot(): number {
  return openSync('/', constants.O_RDONLY | constants.O_DIRECTORY);
}

const readLinkOrNull: ReadLink = (p) => {
  try {
    return readlinkSync(p);
  } catch (err) {
    if (['EINVAL', 'ENOENT', 'ENOTDIR'].includes(errnoCode(err) ?? '')) return null;
    throw err;
  }
};

function sameFile(a: string, b: string): boolean {
  try {
    const [sa, sb] = [statSync(a, { bigint: true }), statSync(b, { bigint: true })];
    return sa.dev === sb.dev && sa.ino === sb.ino;
  } catch {
    return false;
  }
}

/**
 * Where this process opens the file a caller named `p`: `p` itself when no caller root was
 * adopted, when it is relative (to the working directory) or lies under /proc (the same process
 * tree both sides), or when `p` names the very same file here; else `p` through the caller's root.
 */
export function callerPath(p: string): string {
  // A relative path is the working directory's (the bundle), the same directory for both.
  if (rootLink === null || !path.posix.isAbsolute(p) || p === '/proc' || p.startsWith('/proc/')) return p;
  const through = pathInRoot(rootLink, p, readLinkOrNull);
  return sameFile(p, through) ? p : through;
}
