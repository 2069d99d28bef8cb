import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { errorMessage } from '../common/errors.js';
import { pathExists } from '../common/fsutil.js';

const run = promisify(execFile);

/** How containers' root filesystems are made: overlay mounts of shared layers, or copies. */
export type RootfsMode = 'overlay' | 'copy';

export interface RootfsModeProbe {
  mode: RootfsMode;
  /** Why copy was chosen (empty for overlay). */
  reason: string;
}

/**
 * Whether overlay root filesystems work in `dir` (the image store, on the disk layers and
 * containers' upper directories live on): a real overlay of two lower layers is mounted there, the
 * top one holding a 0/0 character-device whiteout and an opaque directory (`setfattr`), and the
 * merged view must hide what they hide and take a write into the upper directory. Anything
 * missing (overlayfs, mknod, `trusted.*` xattrs, setfattr, an upper fs overlay refuses such as
 * overlayfs itself) answers `copy` with the reason. Leaves nothing behind.
 */
export async function probeOverlay(dir: string): Promise<RootfsModeProbe> {
  const root = path.join(dir, `.probe-${randomBytes(6).toString('hex')}`);
  const merged = path.join(root, 'merged');
  let mounted = false;
  try {
    await fsp.mkdir(root, { recursive: true, mode: 0o700 });
    for (const d of ['bottom/dir', 'top/dir', 'upper', 'work', 'merged']) await fsp.mkdir(path.join(root, d), { recursive: true });
    await fsp.writeFile(path.join(root, 'bottom/gone'), 'x');
    await fsp.writeFile(path.join(root, 'bottom/dir/old'), 'x');
    await fsp.writeFile(path.join(root, 'top/dir/new'), 'x');
    await run('mknod', ['-m', '0', '--', path.join(root, 'top/gone'), 'c', '0', '0']);
    await run('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', '--', path.join(root, 'top/dir')]);
    await run('mount', ['-t', 'overlay', '-o', 'lowerdir=top:bottom,upperdir=upper,workdir=work', '--', 'overlay', 'merged'], {
      cwd: root,
    });
    mounted = true;
    const seen = {
      gone: await pathExists(path.join(merged, 'gone')),
      old: await pathExists(path.join(merged, 'dir/old')),
      added: await pathExists(path.join(merged, 'dir/new')),
    };
    await fsp.writeFile(path.join(merged, 'written'), 'x');
    const copiedUp = await pathExists(path.join(root, 'upper/written'));
    if (seen.gone || seen.old || !seen.added || !copiedUp) {
      return { mode: 'copy', reason: `overlayfs in ${dir} does not honour whiteouts or opaque directories (${JSON.stringify(seen)})` };
    }
    return { mode: 'overlay', reason: '' };
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim() || errorMessage(err);
    // A full disk says nothing about overlayfs: a restart on it must not turn layered images
    // unusable until the next one. Nothing new can be made there anyway.
    if ((err as { code?: string }).code === 'ENOSPC' || /No space left on device/.test(stderr))
      return { mode: 'overlay', reason: `not probed: no space left in ${dir}` };
    return { mode: 'copy', reason: `an overlay cannot be made in ${dir}: ${stderr}` };
  } finally {
    if (mounted) await run('umount', ['--', merged]).catch(() => run('umount', ['--lazy', '--', merged]).catch(() => undefined));
    await fsp.rm(root, { recursive: true, force: true }).catch(() => undefined);
  }
}

/** Where the image store records the mode it chose at its last start (`kata-ts doctor` reads it). */
export function rootfsModeFile(stateDir: string): string {
  return path.join(stateDir, 'images', 'rootfs-mode.json');
}

/** The mode the daemon chose at its last start, or undefined before its first (or an unreadable file). */
export async function readRootfsMode(stateDir: string): Promise<RootfsModeProbe | undefined> {
  try {
    const doc = JSON.parse(await fsp.readFile(rootfsModeFile(stateDir), 'utf8')) as Partial<RootfsModeProbe>;
    if ((doc.mode === 'overlay' || doc.mode === 'copy') && typeof doc.reason === 'string') return { mode: doc.mode, reason: doc.reason };
  } catch {
    // Missing or unreadable: not decided yet as far as anyone can tell.
  }
  return undefined;
}
