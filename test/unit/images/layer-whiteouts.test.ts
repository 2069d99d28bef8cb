/**
 * A layer unpacked on its own for an overlay: OCI whiteouts become overlayfs's (a 0/0 character
 * device, `trusted.overlay.opaque` = y), parents it does not carry take their metadata from the
 * layers below, and the LayerStore keys directories by diff id and never leaves a half layer.
 * Needs root (mknod, trusted.* xattrs), as the daemon does.
 */
import { execFileSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { type Digest, sha256Digest } from '../../../src/images/digest.js';
import { LayerStore } from '../../../src/images/layers.js';
import { applyLayer } from '../../../src/images/unpack.js';
import { OVERLAY_OPAQUE_XATTR } from '../../../src/images/unpack-applier.js';
import { buildTar, type TarEntrySpec } from '../../helpers/images-tar.js';

let work: string;

beforeEach(async () => {
  work = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-images-layers-'));
});

afterEach(async () => {
  await fsp.rm(work, { recursive: true, force: true });
});

const LAYER = `sha256:${'cd'.repeat(32)}` as Digest;

function xattr(p: string, name: string): string | undefined {
  try {
    return execFileSync('getfattr', ['--only-values', '-n', name, '--', p], { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
  } catch {
    return undefined;
  }
}

async function applyOverlay(root: string, entries: TarEntrySpec[], parents: string[] = []) {
  await fsp.mkdir(root, { recursive: true });
  return applyLayer(root, Readable.from([await buildTar(entries)]), { layer: LAYER, whiteouts: 'overlay', parents });
}

describe('a layer unpacked on its own (overlay whiteouts)', () => {
  it('turns .wh.<name> into a 0/0 character device owned as the entry, and .wh..wh..opq into the opaque xattr', async () => {
    const root = path.join(work, 'top');
    const stats = await applyOverlay(root, [
      { name: 'etc/', type: 'directory' },
      { name: 'etc/.wh.gone', uid: 7, gid: 8 },
      { name: 'var/cache/', type: 'directory' },
      { name: 'var/cache/.wh..wh..opq' },
      { name: 'var/cache/fresh', content: 'new' },
    ]);
    const dev = await fsp.lstat(path.join(root, 'etc/gone'));
    expect(dev.isCharacterDevice()).toBe(true);
    expect([dev.rdev, dev.uid, dev.gid]).toEqual([0, 7, 8]);
    expect(xattr(path.join(root, 'var/cache'), OVERLAY_OPAQUE_XATTR)).toBe('y');
    expect(xattr(path.join(root, 'etc'), OVERLAY_OPAQUE_XATTR)).toBeUndefined();
    // No OCI whiteout file is left; what the layer itself carries is there.
    expect((await fsp.readdir(path.join(root, 'etc'))).sort()).toEqual(['gone']);
    expect(await fsp.readFile(path.join(root, 'var/cache/fresh'), 'utf8')).toBe('new');
    expect([stats.whiteouts, stats.opaqueDirs]).toEqual([1, 1]);
  });

  it('keeps what the same layer wrote under a whited-out name, and a later entry replaces the device', async () => {
    const root = path.join(work, 'top');
    await applyOverlay(root, [{ name: 'a', content: 'mine' }, { name: '.wh.a' }, { name: '.wh.b' }, { name: 'b', content: 'back' }]);
    expect(await fsp.readFile(path.join(root, 'a'), 'utf8')).toBe('mine');
    expect(await fsp.readFile(path.join(root, 'b'), 'utf8')).toBe('back');
  });

  it('gives a parent it does not carry the mode and owner the layers below have (a /tmp stays 1777)', async () => {
    const below = path.join(work, 'below');
    await fsp.mkdir(path.join(below, 'tmp'), { recursive: true });
    await fsp.chmod(path.join(below, 'tmp'), 0o1777);
    await fsp.mkdir(path.join(below, 'home/app'), { recursive: true });
    await fsp.chown(path.join(below, 'home/app'), 1000, 1000);
    await fsp.chmod(path.join(below, 'home/app'), 0o700);
    const root = path.join(work, 'top');
    await applyOverlay(root, [{ name: 'tmp/x', content: '1' }, { name: 'home/app/.wh.old' }, { name: 'new/dir/f', content: '2' }], [below]);
    expect((await fsp.stat(path.join(root, 'tmp'))).mode & 0o7777).toBe(0o1777);
    const home = await fsp.stat(path.join(root, 'home/app'));
    expect([home.mode & 0o7777, home.uid, home.gid]).toEqual([0o700, 1000, 1000]);
    expect((await fsp.stat(path.join(root, 'new/dir'))).mode & 0o7777).toBe(0o755);
  });

  it('refuses an opaque marker at the root and whiteouts that escape, changing nothing outside', async () => {
    await expect(applyOverlay(path.join(work, 'a'), [{ name: '.wh..wh..opq' }])).rejects.toMatchObject({
      reason: 'IMAGE_LAYER_INVALID_ENTRY',
    });
    await expect(applyOverlay(path.join(work, 'b'), [{ name: '../.wh.x' }])).rejects.toMatchObject({
      reason: 'IMAGE_LAYER_UNSAFE_ENTRY',
    });
  });
});

describe('LayerStore', () => {
  it('unpacks each missing layer once under its diff id, bottom first, and skips stored ones', async () => {
    const store = new LayerStore(path.join(work, 'layers'));
    await store.init();
    const base = await buildTar([
      { name: 'tmp/', type: 'directory', mode: 0o1777 },
      { name: 'gone', content: 'x' },
    ]);
    const top = await buildTar([{ name: '.wh.gone' }, { name: 'tmp/t', content: 't' }]);
    const files = [path.join(work, 'base.tar'), path.join(work, 'top.tar')];
    await fsp.writeFile(files[0]!, base);
    await fsp.writeFile(files[1]!, top);
    const chain = [
      { digest: sha256Digest(base), diffId: sha256Digest(base), file: files[0]! },
      { digest: sha256Digest(top), diffId: sha256Digest(top), file: files[1]! },
    ];
    expect(await store.ensure(chain, {})).toBe(2);
    expect(await store.ensure(chain, {})).toBe(0);
    expect((await store.list()).sort()).toEqual(chain.map((l) => l.diffId.slice(7)).sort());
    expect((await fsp.lstat(path.join(store.pathOf(chain[1]!.diffId), 'gone'))).isCharacterDevice()).toBe(true);
    // The implicit /tmp of the top layer took its 1777 from the base layer.
    expect((await fsp.stat(path.join(store.pathOf(chain[1]!.diffId), 'tmp'))).mode & 0o7777).toBe(0o1777);
  });

  it('leaves no directory when a layer does not match its diff id', async () => {
    const store = new LayerStore(path.join(work, 'layers'));
    await store.init();
    const tar = await buildTar([{ name: 'f', content: 'x' }]);
    await fsp.writeFile(path.join(work, 'l.tar'), tar);
    const wrong = `sha256:${'0'.repeat(64)}` as Digest;
    await expect(store.ensure([{ digest: sha256Digest(tar), diffId: wrong, file: path.join(work, 'l.tar') }], {})).rejects.toMatchObject({
      reason: 'IMAGE_LAYER_DIFF_ID_MISMATCH',
    });
    expect(await store.list()).toEqual([]);
  });
});
