import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { checkGuestAssets } from '../../../src/hypervisor/assets.js';

describe('checkGuestAssets', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'assets-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const bzImage = (): Buffer => {
    const b = Buffer.alloc(4096);
    b.write('HdrS', 0x202, 'latin1');
    return b;
  };

  it('accepts a bzImage and a gzip initramfs', async () => {
    writeFileSync(path.join(dir, 'vmlinuz'), bzImage());
    writeFileSync(path.join(dir, 'initrd'), gzipSync(Buffer.from('070701')));
    const check = await checkGuestAssets({ kernelPath: path.join(dir, 'vmlinuz'), initrdPath: path.join(dir, 'initrd') });
    expect(check).toMatchObject({ ok: true, problems: [] });
  });

  it('names every missing or malformed file', async () => {
    writeFileSync(path.join(dir, 'vmlinuz'), Buffer.alloc(4096));
    mkdirSync(path.join(dir, 'initrd'));
    const check = await checkGuestAssets({ kernelPath: path.join(dir, 'vmlinuz'), initrdPath: path.join(dir, 'initrd') });
    expect(check.ok).toBe(false);
    expect(check.problems).toEqual([
      `guest kernel ${dir}/vmlinuz is not an x86 bzImage (no HdrS header at 0x202)`,
      `guest initramfs ${dir}/initrd is not a regular file`,
    ]);
    const missing = await checkGuestAssets({ kernelPath: path.join(dir, 'nope'), initrdPath: path.join(dir, 'vmlinuz') });
    expect(missing.problems).toEqual([`guest kernel ${dir}/nope is missing`, `guest initramfs ${dir}/vmlinuz is not gzip-compressed`]);
    expect(missing.message).toContain('scripts/build-guest.sh');
  });

  it('checks the guest image when one is configured: present and erofs', async () => {
    writeFileSync(path.join(dir, 'vmlinuz'), bzImage());
    writeFileSync(path.join(dir, 'initrd'), gzipSync(Buffer.from('070701')));
    const erofs = Buffer.alloc(8192);
    erofs.writeUInt32LE(0xe0f5e1e2, 1024);
    writeFileSync(path.join(dir, 'guest.img'), erofs);
    writeFileSync(path.join(dir, 'other.img'), Buffer.alloc(8192));
    const base = { kernelPath: path.join(dir, 'vmlinuz'), initrdPath: path.join(dir, 'initrd') };
    const good = await checkGuestAssets({ ...base, guestImagePath: path.join(dir, 'guest.img') });
    expect(good).toMatchObject({ ok: true, problems: [] });
    expect(good.message).toContain(`image ${dir}/guest.img`);
    expect((await checkGuestAssets({ ...base, guestImagePath: path.join(dir, 'other.img') })).problems).toEqual([
      `guest image ${dir}/other.img is not an erofs image`,
    ]);
    expect((await checkGuestAssets({ ...base, guestImagePath: path.join(dir, 'none.img') })).problems).toEqual([
      `guest image ${dir}/none.img is missing`,
    ]);
    expect((await checkGuestAssets({ ...base, guestImagePath: null })).ok).toBe(true);
  });

  it('reports a truncated kernel', async () => {
    writeFileSync(path.join(dir, 'vmlinuz'), Buffer.alloc(10));
    writeFileSync(path.join(dir, 'initrd'), gzipSync(Buffer.from('x')));
    const check = await checkGuestAssets({ kernelPath: path.join(dir, 'vmlinuz'), initrdPath: path.join(dir, 'initrd') });
    expect(check.problems).toEqual([`guest kernel ${dir}/vmlinuz is too short (10 bytes)`]);
  });
});
