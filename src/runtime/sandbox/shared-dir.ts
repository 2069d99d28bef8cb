import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errorMessage, internal } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';

/**
 * The sandbox's shared directory on the host (see sandboxSharedDir): what virtiofsd serves to
 * the guest. It is made a bind mount of itself, `nodev,nosuid` (a device node or set-uid file the
 * guest creates through virtio-fs means nothing to the host), with shared propagation: the
 * container layer later bind-mounts root filesystems and volumes under it, and those mounts must
 * reach virtiofsd, which runs in a mount namespace of its own (sandbox=namespace) whose copy of
 * this mount is a slave of it. util-linux's mount/umount, argument arrays, never a shell.
 */

const MOUNT_TIMEOUT_MS = 10_000;

function run(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: MOUNT_TIMEOUT_MS }, (err, _stdout, stderr) => {
      if (err)
        reject(internal('SHARED_DIR_MOUNT_FAILED', `${file} ${args.join(' ')} failed: ${stderr.trim() || err.message}.`, { cause: err }));
      else resolve();
    });
  });
}

/** A mountinfo path field with its octal escapes (`\040` for a space, ...) decoded. */
export function unescapeMountPath(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_m, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/**
 * Pure: the mount points at `dir` or below it in a /proc/<pid>/mountinfo text, in the order to
 * unmount them: deepest first, and of mounts stacked on one point the last mounted first.
 */
export function mountsUnder(mountinfo: string, dir: string): string[] {
  const root = path.resolve(dir);
  const found: Array<{ point: string; order: number }> = [];
  mountinfo.split('\n').forEach((line, order) => {
    const field = line.split(' ')[4];
    if (field === undefined || field === '') return;
    const point = unescapeMountPath(field);
    if (point === root || point.startsWith(`${root}/`)) found.push({ point, order });
  });
  const depth = (p: string) => p.split('/').length;
  found.sort((a, b) => depth(b.point) - depth(a.point) || b.order - a.order);
  return found.map((f) => f.point);
}

async function readMountinfo(): Promise<string> {
  return fsp.readFile('/proc/self/mountinfo', 'utf8');
}

/**
 * Create `dir` (0700) and make it a `nodev,nosuid` bind mount of itself with shared propagation, in
 * a peer group of its own: made private first, since a bind of a directory on a shared mount joins
 * that mount's peer group, and everything mounted under the share would then be copied to the
 * state dir's mount and wherever it propagates (and those copies would outlive our unmounts).
 */
export async function prepareSharedDir(dir: string): Promise<void> {
  await fsp.mkdir(dir, { mode: 0o700 });
  await run('mount', ['--bind', dir, dir]);
  await run('mount', ['-o', 'remount,bind,nodev,nosuid', dir]);
  await run('mount', ['--make-private', dir]);
  await run('mount', ['--make-rshared', dir]);
}

/**
 * Unmount everything at or under `dir`, deepest first (the container layer's bind mounts too, as
 * a safety net, then the directory's own bind mount). A mount that is busy is detached lazily
 * (`umount -l`), logged. Throws when something is still mounted afterwards: nothing below a
 * mount may then be deleted, since a delete would reach through it into the host.
 */
export async function releaseSharedMounts(dir: string, log: Logger): Promise<void> {
  for (const point of mountsUnder(await readMountinfo(), dir)) {
    try {
      await run('umount', [point]);
    } catch (err) {
      log.warn({ mountPoint: point, err: errorMessage(err) }, 'unmount failed; detaching it lazily');
      await run('umount', ['-l', point]).catch((lazyErr: unknown) =>
        log.error({ mountPoint: point, err: errorMessage(lazyErr) }, 'lazy unmount failed too'),
      );
    }
  }
  const left = mountsUnder(await readMountinfo(), dir);
  if (left.length > 0) {
    throw internal('SHARED_DIR_STILL_MOUNTED', `${left.join(', ')} could not be unmounted; ${dir} is kept.`, { details: { left } });
  }
}

/**
 * Remove a sandbox's work directory (which holds the shared directory): every mount under it is
 * released first, and nothing is deleted while one remains.
 */
export async function removeWorkDir(workDir: string, log: Logger): Promise<void> {
  await releaseSharedMounts(workDir, log);
  await fsp.rm(workDir, { recursive: true, force: true });
}
