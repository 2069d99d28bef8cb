import { execFileSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createContainerSnapshot, removeContainerSnapshot } from '../../../src/images/snapshot.js';

let work: string;

beforeEach(async () => {
  work = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-snapshot-'));
});

afterEach(async () => {
  await fsp.rm(work, { recursive: true, force: true });
});

describe('createContainerSnapshot', () => {
  it('copies modes, owners, mtimes, symlinks, hard links and FIFOs into independent inodes', async () => {
    const image = path.join(work, 'image');
    await fsp.mkdir(path.join(image, 'bin'), { recursive: true });
    await fsp.writeFile(path.join(image, 'bin/tool'), 'v1');
    await fsp.chmod(path.join(image, 'bin/tool'), 0o4755);
    await fsp.link(path.join(image, 'bin/tool'), path.join(image, 'bin/tool-hard'));
    await fsp.symlink('tool', path.join(image, 'bin/sh'));
    await fsp.mkdir(path.join(image, 'home/app'), { recursive: true, mode: 0o700 });
    await fsp.chown(path.join(image, 'home/app'), 1000, 1000);
    const mtime = new Date('2020-05-05T05:05:05Z');
    await fsp.utimes(path.join(image, 'bin/tool'), mtime, mtime);
    execFileSync('mkfifo', [path.join(image, 'fifo')]);

    const dest = path.join(work, 'containers', 'c1', 'rootfs');
    await createContainerSnapshot(image, dest);

    const tool = await fsp.stat(path.join(dest, 'bin/tool'));
    expect(tool.mode & 0o7777).toBe(0o4755);
    expect(tool.mtime.getTime()).toBe(mtime.getTime());
    expect((await fsp.stat(path.join(dest, 'bin/tool-hard'))).ino).toBe(tool.ino);
    expect(await fsp.readlink(path.join(dest, 'bin/sh'))).toBe('tool');
    const home = await fsp.stat(path.join(dest, 'home/app'));
    expect([home.uid, home.gid, home.mode & 0o777]).toEqual([1000, 1000, 0o700]);
    expect((await fsp.lstat(path.join(dest, 'fifo'))).isFIFO()).toBe(true);

    // A container writing in place must not change the image.
    expect(tool.ino).not.toBe((await fsp.stat(path.join(image, 'bin/tool'))).ino);
    await fsp.writeFile(path.join(dest, 'bin/tool'), 'changed by the container');
    expect(await fsp.readFile(path.join(image, 'bin/tool'), 'utf8')).toBe('v1');
    expect((await fsp.readdir(path.dirname(dest))).sort()).toEqual(['rootfs']);
  });

  it('refuses an existing destination with ALREADY_EXISTS, and removal is idempotent', async () => {
    const image = path.join(work, 'image');
    await fsp.mkdir(image);
    const dest = path.join(work, 'rootfs');
    await createContainerSnapshot(image, dest);
    await expect(createContainerSnapshot(image, dest)).rejects.toMatchObject({ kind: 'exists', reason: 'SNAPSHOT_EXISTS' });
    await removeContainerSnapshot(dest);
    await removeContainerSnapshot(dest);
    expect(await fsp.readdir(work)).toEqual(['image']);
  });

  it('leaves nothing behind when the copy fails', async () => {
    const dest = path.join(work, 'rootfs');
    await expect(createContainerSnapshot(path.join(work, 'missing-image'), dest)).rejects.toMatchObject({
      kind: 'internal',
      reason: 'SNAPSHOT_COPY_FAILED',
    });
    expect(await fsp.readdir(work)).toEqual([]);
  });
});
