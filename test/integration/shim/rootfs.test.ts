/**
 * containerd's rootfs mounts for real: an overlay like its overlayfs snapshotter's (a read-only
 * lower layer, an upper and work dir) and a bind mount like the native snapshotter's, mounted at
 * `<bundle>/rootfs` and unmounted again, twice (unmounting is idempotent). Everything lives in a
 * temporary directory, unmounted and removed afterwards also when a test fails.
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { mountRootfs, unmountRootfs } from '../../../src/shim/rootfs.js';

const root = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-rootfs-'));

afterAll(async () => {
  await unmountRootfs(root).catch(() => undefined);
  rmSync(root, { recursive: true, force: true });
});

function mounted(dir: string): string[] {
  return mountsUnder(readFileSync('/proc/self/mountinfo', 'utf8'), dir);
}

describe('rootfs mounts at <bundle>/rootfs', () => {
  it('mounts an overlay snapshot (writes go to the upper dir) and unmounts it, idempotently', async () => {
    const snap = path.join(root, 'snapshots');
    for (const d of ['1/fs', '2/fs', '2/work']) mkdirSync(path.join(snap, d), { recursive: true });
    writeFileSync(path.join(snap, '1/fs/from-image'), 'layer\n');
    const target = path.join(root, 'bundle-overlay', 'rootfs');
    await mountRootfs(
      [
        {
          type: 'overlay',
          source: 'overlay',
          options: ['index=off', `workdir=${snap}/2/work`, `upperdir=${snap}/2/fs`, `lowerdir=${snap}/1/fs`],
        },
      ],
      target,
    );
    expect(mounted(target)).toEqual([target]);
    expect(readFileSync(path.join(target, 'from-image'), 'utf8')).toBe('layer\n');
    writeFileSync(path.join(target, 'written'), 'new\n');
    expect(readdirSync(path.join(snap, '2/fs'))).toEqual(['written']);
    expect(await unmountRootfs(target)).toEqual([target]);
    expect(mounted(target)).toEqual([]);
    expect(readdirSync(target)).toEqual([]);
    expect(await unmountRootfs(target)).toEqual([]);
  });

  it('bind-mounts a directory read-only and unmounts it', async () => {
    const source = path.join(root, 'native', 'fs');
    mkdirSync(source, { recursive: true });
    writeFileSync(path.join(source, 'file'), 'x');
    const target = path.join(root, 'bundle-bind', 'rootfs');
    await mountRootfs([{ type: 'bind', source, options: ['ro'] }], target);
    expect(readFileSync(path.join(target, 'file'), 'utf8')).toBe('x');
    expect(() => writeFileSync(path.join(target, 'other'), 'y')).toThrow(/EROFS/);
    expect(await unmountRootfs(target)).toEqual([target]);
    expect(mounted(target)).toEqual([]);
  });

  it('unmounting a bundle that never had a rootfs is fine', async () => {
    expect(await unmountRootfs(path.join(root, 'never', 'rootfs'))).toEqual([]);
  });
});
