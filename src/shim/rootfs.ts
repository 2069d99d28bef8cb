/**
 * A container's root filesystem as containerd hands it to a shim: the `rootfs` list of the Task
 * API's Create request, the mounts its snapshotter prepared (an overlay of the image's layers
 * with a writable upper dir, or a bind mount of a directory for the native snapshotter), to be
 * mounted at `<bundle>/rootfs` by the shim, as runc's shim does, and unmounted when the task is
 * deleted. containerd owns what is mounted (the snapshots); the shim owns only the mount point.
 *
 * The plan (util-linux `mount` argument arrays, never a shell) is pure and checked field by
 * field; only overlay and bind are accepted, since the result is shared into the VM through
 * virtio-fs and nothing else a snapshotter could ask for (a block device, a FUSE file system)
 * would make sense there.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errorMessage, internal, invalid, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { mountsUnder } from '../runtime/sandbox/shared-dir.js';
import './reasons.js';

/** One entry of containerd's `rootfs` list (containerd.types.Mount). */
export interface RootfsMount {
  type: string;
  source: string;
  /** containerd 2.x: a path under the root to mount at; '' (or absent) for the root itself. */
  target?: string;
  options: readonly string[];
}

const MOUNT_TIMEOUT_MS = 30_000;
const SUPPORTED = ['overlay', 'bind'];

/**
 * The `mount` command lines that put `mounts` at `target`, in order (pure). Throws INVALID_ARGUMENT
 * naming the field (`rootfs[0].type`, `rootfs[1].options[2]`, ...) for anything it will not mount.
 */
export function planRootfsMounts(mounts: readonly RootfsMount[], target: string): string[][] {
  if (!path.isAbsolute(target)) throw invalid('SHIM_ROOTFS_UNSUPPORTED', `rootfs mount point ${target} is not an absolute path.`);
  return mounts.map((m, i) => {
    const field = `rootfs[${i}]`;
    if (!SUPPORTED.includes(m.type)) {
      throw invalid('SHIM_ROOTFS_UNSUPPORTED', `${field}.type "${m.type}" is not supported: only overlay and bind are.`, {
        details: { field: `${field}.type`, type: m.type },
      });
    }
    if (m.target !== undefined && m.target !== '') {
      throw invalid('SHIM_ROOTFS_UNSUPPORTED', `${field}.target "${m.target}" is not supported: every rootfs mount goes at the root.`, {
        details: { field: `${field}.target` },
      });
    }
    m.options.forEach((option, j) => {
      // The options travel as one comma-separated -o argument: a comma inside one would split it.
      if (option === '' || option.includes(',')) {
        throw invalid('SHIM_ROOTFS_UNSUPPORTED', `${field}.options[${j}] "${option}" is empty or holds a comma.`, {
          details: { field: `${field}.options[${j}]` },
        });
      }
    });
    if (m.type === 'overlay') {
      const argv = ['mount', '-t', 'overlay'];
      if (m.options.length > 0) argv.push('-o', m.options.join(','));
      return [...argv, '--', m.source === '' ? 'overlay' : m.source, target];
    }
    if (!path.isAbsolute(m.source)) {
      throw invalid('SHIM_ROOTFS_UNSUPPORTED', `${field}.source "${m.source}" of a bind mount is not an absolute path.`, {
        details: { field: `${field}.source` },
      });
    }
    // A bind mount is a bind whatever its options say; rbind (submounts too) unless asked for bind.
    const options = m.options.includes('bind') || m.options.includes('rbind') ? [...m.options] : ['rbind', ...m.options];
    return ['mount', '-o', options.join(','), '--', m.source, target];
  });
}

/** The overlay options that name a directory (lowerdir: a `:`-separated list of them). */
const OVERLAY_DIR_OPTIONS = ['lowerdir', 'upperdir', 'workdir'];

/**
 * Refuse `mounts` when a directory they name (a bind's source; an overlay's lowerdir, upperdir,
 * workdir) is not the one containerd means: `resolve` (src/common/caller-root.ts `callerPath`)
 * answers another path for it when the runtime's mount namespace does not see containerd's file
 * there (a private root, the snapshots on a file system mounted after that namespace was made).
 * Such a directory cannot be used through containerd's root either: the kernel refuses overlay
 * layers and bind sources from another mount namespace. FAILED_PRECONDITION naming the field;
 * relative paths and entries with an escaped `:` are left to the mount. Pure given `resolve`.
 */
export function requireSourcesSeen(mounts: readonly RootfsMount[], resolve: (p: string) => string): void {
  const check = (p: string, field: string) => {
    if (!path.isAbsolute(p) || p.includes('\\') || resolve(p) === p) return;
    throw precondition(
      'SHIM_ROOTFS_NOT_SEEN',
      `${field} ${p} is not containerd's directory in kata-ts's mount namespace: the node's root mount is private and it was mounted after that namespace was made (make the root mount shared, as systemd does).`,
      { details: { field, path: p } },
    );
  };
  mounts.forEach((m, i) => {
    if (m.type === 'bind') check(m.source, `rootfs[${i}].source`);
    if (m.type !== 'overlay') return;
    m.options.forEach((option, j) => {
      const eq = option.indexOf('=');
      if (eq < 0 || !OVERLAY_DIR_OPTIONS.includes(option.slice(0, eq))) return;
      for (const dir of option.slice(eq + 1).split(':')) check(dir, `rootfs[${i}].options[${j}]`);
    });
  });
}

/** How a command line is run (tests may replace it). */
export type CommandRunner = (argv: readonly string[]) => Promise<void>;

/** Run an argv with execFile (no shell); a failure is INTERNAL with the command's own stderr. */
export const runCommand: CommandRunner = (argv) =>
  new Promise((resolve, reject) => {
    const [file, ...args] = argv as [string, ...string[]];
    execFile(file, args, { timeout: MOUNT_TIMEOUT_MS }, (err, _stdout, stderr) => {
      if (err) {
        reject(
          internal('SHIM_ROOTFS_MOUNT_FAILED', `${argv.join(' ')} failed: ${stderr.trim() || err.message}.`, {
            cause: err,
          }),
        );
      } else resolve();
    });
  });

/**
 * Mount containerd's rootfs list at `target` (created when missing). All or nothing: when one
 * mount fails, those made before it are unmounted again. An empty list mounts nothing (the rootfs
 * is already in place, as CRI-O prepares it).
 */
export async function mountRootfs(mounts: readonly RootfsMount[], target: string, run: CommandRunner = runCommand): Promise<void> {
  const plan = planRootfsMounts(mounts, target);
  if (plan.length === 0) return;
  await fsp.mkdir(target, { recursive: true, mode: 0o755 });
  let done = 0;
  try {
    for (const argv of plan) {
      await run(argv);
      done++;
    }
  } catch (err) {
    for (; done > 0; done--) await run(['umount', '--', target]).catch(() => undefined);
    throw err;
  }
}

/**
 * Unmount everything at or under `target`, deepest and latest first (a busy mount is detached
 * lazily). Idempotent: nothing mounted there is fine. Returns the mount points it released;
 * throws when one is still mounted afterwards.
 */
export async function unmountRootfs(target: string, logger?: Logger, run: CommandRunner = runCommand): Promise<string[]> {
  // mountinfo names mount points by their real path.
  const real = await fsp.realpath(target).catch(() => target);
  const points = mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), real);
  for (const point of points) {
    try {
      await run(['umount', '--', point]);
    } catch (err) {
      logger?.warn({ mountPoint: point, err: errorMessage(err) }, 'rootfs unmount failed; detaching it lazily');
      await run(['umount', '-l', '--', point]).catch(() => undefined);
    }
  }
  const left = mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), real);
  if (left.length > 0) {
    throw internal('SHIM_ROOTFS_MOUNT_FAILED', `${left.join(', ')} could not be unmounted.`, { details: { left } });
  }
  return points;
}
