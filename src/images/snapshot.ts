import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { alreadyExists, exhausted, internal, type KataError } from '../common/errors.js';
import { pathExists } from '../common/fsutil.js';
import { abortReason, throwIfAborted } from './abort.js';

/**
 * Make a container's private root filesystem as a copy of an image's flat tree: the fallback
 * where overlayfs does not work, and for images an older kata-ts unpacked flat (rootfs.ts makes
 * an overlay of the image's layers everywhere else; docs/images.md).
 *
 * Why a copy (`cp -a --reflink=auto`) and not hard links: hard links share inodes, so a container
 * writing a file in place (O_RDWR, O_TRUNC, chmod, chown through virtio-fs from the guest) would
 * change the image for every other container. `cp -a` keeps everything the image had (modes,
 * owners, mtimes, symlinks, hard links within the tree, device nodes, xattrs), and with
 * `--reflink=auto` it is a constant-time copy-on-write clone on btrfs/XFS, a plain copy elsewhere.
 *
 * The copy goes to a temporary sibling and is renamed into place, so `dest` either does not
 * exist or is complete. ALREADY_EXISTS when `dest` exists.
 */
export async function createContainerSnapshot(imageRootfs: string, dest: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
  if (await pathExists(dest)) throw alreadyExists('SNAPSHOT_EXISTS', `container root filesystem ${dest} already exists`);
  throwIfAborted(opts.signal);
  await fsp.mkdir(path.dirname(dest), { recursive: true, mode: 0o700 });
  const tmp = path.join(path.dirname(dest), `.tmp-${path.basename(dest)}-${randomBytes(6).toString('hex')}`);
  try {
    await runCp(['-a', '--reflink=auto', '--', imageRootfs, tmp], path.dirname(dest), opts.signal);
    await fsp.rename(tmp, dest);
  } catch (err) {
    await fsp.rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/** Remove a container snapshot; a missing one is fine (removal is idempotent). */
export async function removeContainerSnapshot(dest: string): Promise<void> {
  await fsp.rm(dest, { recursive: true, force: true });
}

/** cp's failure as one sentence: its first complaint, and RESOURCE_EXHAUSTED when the disk is full. */
function copyFailure(code: number | null, stderr: string, into: string): KataError {
  const first = stderr.trim().split('\n')[0] ?? '';
  if (/No space left on device|Disk quota exceeded/.test(stderr))
    return exhausted('SNAPSHOT_DISK_FULL', `no space left in ${into} for a copy of the container's root filesystem`, {
      details: { cp: first },
    });
  return internal('SNAPSHOT_COPY_FAILED', `cp exited ${code} copying the container root filesystem: ${first}`);
}

function runCp(args: string[], into: string, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('cp', args, { stdio: ['ignore', 'ignore', 'pipe'], signal });
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => {
      if (stderr.length < 4096) stderr += c.toString();
    });
    child.on('error', (err) => {
      if (signal?.aborted === true) reject(abortReason(signal, 'copying the container root filesystem'));
      else reject(internal('SNAPSHOT_COPY_FAILED', 'cp could not be started to copy the container root filesystem', { cause: err }));
    });
    child.on('close', (code) => {
      if (signal?.aborted === true) reject(abortReason(signal, 'copying the container root filesystem'));
      else if (code === 0) resolve();
      else reject(copyFailure(code, stderr, into));
    });
  });
}
