import { execFileSync } from 'node:child_process';
import { constants, promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { ConsoleLog } from '../../../src/hypervisor/console-log.js';
import { TAIL_WINDOW_BYTES, tailFile } from '../../../src/hypervisor/log-tail.js';

const SECRET = 'root-only-secret-4711';

describe('console log and tails: files a VMM could plant are never followed', () => {
  let dir: string;
  let secret: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'console-log-'));
    secret = path.join(dir, 'secret');
    await fsp.writeFile(secret, `${SECRET}\n`, { mode: 0o600 });
    await fsp.mkdir(path.join(dir, 'vmm'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('tailFile refuses a symlink, a FIFO (without hanging) and a second hard link; reads at most TAIL_WINDOW_BYTES', async () => {
    const log = path.join(dir, 'vmm', 'console.log');
    await fsp.symlink(secret, log);
    await expect(tailFile(log, 10)).rejects.toMatchObject({ reason: 'LOG_FILE_UNSAFE' });
    await fsp.rm(log);
    execFileSync('mkfifo', [log]);
    await expect(tailFile(log, 10)).rejects.toMatchObject({ reason: 'LOG_FILE_UNSAFE' });
    await fsp.rm(log);
    await fsp.link(secret, log);
    await expect(tailFile(log, 10)).rejects.toMatchObject({ reason: 'LOG_FILE_UNSAFE' });
    await fsp.rm(log);
    await fsp.writeFile(log, `${'x'.repeat(TAIL_WINDOW_BYTES * 2)}\nlast line\n`);
    expect(await tailFile(log, 1)).toBe('last line');
    expect((await tailFile(log, 1000)).length).toBeLessThanOrEqual(TAIL_WINDOW_BYTES);
    expect(await tailFile(path.join(dir, 'absent'), 5)).toBe('');
  });

  it('reads beneath its directory fd: a renamed work dir is still found, a planted link is not followed', async () => {
    const log = path.join(dir, 'vmm', 'console.log');
    await fsp.writeFile(log, 'booting\nready\n');
    const console = new ConsoleLog(log, silentLogger(), { checkIntervalMs: 0 });
    try {
      await fsp.rename(path.join(dir, 'vmm'), path.join(dir, 'moved'));
      expect(await console.tail(1)).toBe('ready');
      await fsp.rm(path.join(dir, 'moved', 'console.log'));
      await fsp.symlink(secret, path.join(dir, 'moved', 'console.log'));
      expect(await console.tail(10)).toBe('');
      expect(await console.check()).toBe('unsafe');
      expect((await fsp.readFile(secret, 'utf8')).trim()).toBe(SECRET);
    } finally {
      console.close();
    }
  });

  it('rotates past the cap: the last maxBytes to console.log.1 (replacing a planted link, not writing through it), the log truncated and appended to again', async () => {
    const log = path.join(dir, 'vmm', 'console.log');
    const maxBytes = 1000;
    // QEMU's side: an O_APPEND writer, as `-chardev file,append=on` opens it.
    const qemu = await fsp.open(log, constants.O_WRONLY | constants.O_CREAT | constants.O_APPEND, 0o600);
    await fsp.symlink(secret, `${log}.1`);
    const console = new ConsoleLog(log, silentLogger(), { maxBytes, checkIntervalMs: 0 });
    try {
      await qemu.write('a'.repeat(maxBytes));
      expect(await console.check()).toBe('within-cap');
      await qemu.write('b'.repeat(500));
      expect(await console.check()).toBe('rotated');
      expect((await fsp.lstat(`${log}.1`)).isFile()).toBe(true);
      const rotated = await fsp.readFile(`${log}.1`, 'utf8');
      expect(rotated).toBe('a'.repeat(500) + 'b'.repeat(500));
      expect((await fsp.readFile(secret, 'utf8')).trim()).toBe(SECRET);
      expect((await fsp.stat(log)).size).toBe(0);
      await qemu.write('after\n');
      expect(await fsp.readFile(log, 'utf8')).toBe('after\n');
      expect((await fsp.readdir(path.join(dir, 'vmm'))).sort()).toEqual(['console.log', 'console.log.1']);
    } finally {
      console.close();
      await qemu.close();
    }
  });
});
