/**
 * Read-only CRI mounts on the host side of the share (real mounts, no VM): a read-only volume's
 * bind refuses writes at its top, a recursive read-only one also in every mount below it, since
 * the guest's writes reach those submounts through virtiofsd on the host.
 */
import { execFileSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { hostSubmounts, SharedDirMounts } from '../../../src/runtime/container/shared-dir.js';

async function writeError(file: string): Promise<string | undefined> {
  return fsp.writeFile(file, 'x').then(
    () => undefined,
    (err: NodeJS.ErrnoException) => err.code,
  );
}

describe('SharedDirMounts: read-only volumes with a submount', () => {
  let dir: string;
  let volume: string;

  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-rro-'));
    volume = path.join(dir, 'volume');
    await fsp.mkdir(path.join(volume, 'tmpfs'), { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', 'none', path.join(volume, 'tmpfs')]);
  });

  afterEach(async () => {
    execFileSync('umount', ['--lazy', path.join(volume, 'tmpfs')]);
    await fsp.rm(dir, { recursive: true, force: true });
  });

  const bind = async (recursive: boolean) => {
    const mounts = new SharedDirMounts(
      { hostDir: path.join(dir, 'share', 'c1'), guestDir: '/run/share/c1', stagingDir: path.join(dir, 'staging') },
      [{ dir: path.join(dir, 'share'), shared: true }],
      silentLogger(),
    );
    const sources = await mounts.bindCriMounts([
      { container_path: '/mnt', host_path: volume, readonly: true, recursive_read_only: recursive, propagation: 'PROPAGATION_PRIVATE' },
    ]);
    expect(sources).toEqual({ '/mnt': '/run/share/c1/mounts/0' });
    return { mounts, target: path.join(dir, 'share', 'c1', 'mounts', '0') };
  };

  it('hostSubmounts lists the mounts below a source (resolved through a symlink), [] for a missing one', async () => {
    await fsp.symlink(volume, path.join(dir, 'link'));
    expect(await hostSubmounts(path.join(dir, 'link'))).toEqual(['tmpfs']);
    expect(await hostSubmounts(path.join(dir, 'missing'))).toEqual([]);
  });

  it('read-only: the top refuses writes, a submount below it stays writable', async () => {
    const { mounts, target } = await bind(false);
    try {
      expect(await writeError(path.join(target, 'top'))).toBe('EROFS');
      expect(await writeError(path.join(target, 'tmpfs', 'file'))).toBeUndefined();
    } finally {
      expect(await mounts.undo()).toBe(true);
    }
  });

  it('recursive read-only: the submount refuses writes too, and the source itself stays writable', async () => {
    const { mounts, target } = await bind(true);
    try {
      expect(await writeError(path.join(target, 'top'))).toBe('EROFS');
      expect(await writeError(path.join(target, 'tmpfs', 'file'))).toBe('EROFS');
      expect(await writeError(path.join(volume, 'tmpfs', 'file'))).toBeUndefined();
    } finally {
      expect(await mounts.undo()).toBe(true);
    }
  });
});
