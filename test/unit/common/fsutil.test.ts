/** writeFileAtomic on a disk that fills up mid-write: nothing left behind, and the error names the file. */
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { writeFileAtomic } from '../../../src/common/fsutil.js';

describe('writeFileAtomic', () => {
  let dir = '';
  afterEach(async () => {
    vi.restoreAllMocks();
    if (dir !== '') await fsp.rm(dir, { recursive: true, force: true });
  });

  it('replaces the file whole', async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-fsutil-'));
    const file = path.join(dir, 'r.json');
    await writeFileAtomic(file, 'one');
    await writeFileAtomic(file, 'two');
    expect(await fsp.readFile(file, 'utf8')).toBe('two');
    expect(await fsp.readdir(dir)).toEqual(['r.json']);
  });

  it('removes its temporary file when the write fails (ENOSPC) and keeps the previous version', async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-fsutil-'));
    const file = path.join(dir, 'r.json');
    await writeFileAtomic(file, 'old');
    const realOpen = fsp.open;
    // The one thing a unit test cannot make for real is a full disk (the soak fills a tmpfs):
    // the temporary file's write fails as write(2) does on one.
    vi.spyOn(fsp, 'open').mockImplementation(async (...args: Parameters<typeof fsp.open>) => {
      const handle = await realOpen(...args);
      handle.writeFile = () =>
        Promise.reject(Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', syscall: 'write' }));
      return handle;
    });
    const err = await writeFileAtomic(file, 'new').catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'ENOSPC', path: file });
    expect(await fsp.readdir(dir)).toEqual(['r.json']);
    expect(await fsp.readFile(file, 'utf8')).toBe('old');
  });
});
