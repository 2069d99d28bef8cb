import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { type Digest, sha256Digest } from '../../../src/images/digest.js';
import { applyLayer, applyLayerFile, unpackImage } from '../../../src/images/unpack.js';
import { buildTar, FIXED_MTIME, gzip, type TarEntrySpec, zstd } from '../../helpers/images-tar.js';

let work: string;
let root: string;
let outside: string;

beforeEach(async () => {
  work = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-images-unpack-'));
  root = path.join(work, 'root');
  outside = path.join(work, 'outside');
  await fsp.mkdir(root);
  await fsp.mkdir(outside);
});

afterEach(async () => {
  await fsp.rm(work, { recursive: true, force: true });
});

const LAYER = `sha256:${'ab'.repeat(32)}` as Digest;

async function apply(entries: TarEntrySpec[], layer = LAYER) {
  const tar = await buildTar(entries);
  return applyLayer(root, Readable.from([tar]), { layer });
}

async function expectRefused(promise: Promise<unknown>, reason: string, entry: string): Promise<void> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(KataError);
  const k = err as KataError;
  expect(k.kind).toBe('invalid');
  expect(k.reason).toBe(reason);
  expect(k.message).toContain(LAYER);
  expect(k.message).toContain(entry);
}

async function treeOf(dir: string): Promise<string[]> {
  const out: string[] = [];
  async function walk(rel: string): Promise<void> {
    for (const name of (await fsp.readdir(path.join(dir, rel))).sort()) {
      const r = rel === '' ? name : `${rel}/${name}`;
      out.push(r);
      const st = await fsp.lstat(path.join(dir, r));
      if (st.isDirectory()) await walk(r);
    }
  }
  await walk('');
  return out;
}

describe('applyLayer: file types and metadata', () => {
  it('creates files, directories, symlinks, hard links and FIFOs with modes, owners and mtimes', async () => {
    const stats = await apply([
      { name: './', type: 'directory', mode: 0o755 },
      { name: 'bin/', type: 'directory', mode: 0o755 },
      { name: 'bin/tool', content: '#!/bin/sh\necho hi\n', mode: 0o4755, uid: 0, gid: 0 },
      { name: 'home/', type: 'directory', mode: 0o750, uid: 1000, gid: 1000 },
      { name: 'home/app.txt', content: 'owned by app', mode: 0o600, uid: 1000, gid: 1001 },
      { name: 'bin/sh', type: 'symlink', linkname: 'tool', uid: 7, gid: 8 },
      { name: 'bin/tool-hard', type: 'link', linkname: 'bin/tool' },
      { name: 'run/fifo', type: 'fifo', mode: 0o640 },
    ]);
    expect(stats).toMatchObject({ files: 2, directories: 2, symlinks: 1, hardlinks: 1, specialFiles: 1, skipped: 0 });

    const tool = await fsp.stat(path.join(root, 'bin/tool'));
    expect(tool.mode & 0o7777).toBe(0o4755);
    expect(tool.mtime.getTime()).toBe(FIXED_MTIME.getTime());
    const home = await fsp.stat(path.join(root, 'home'));
    expect(home.mode & 0o7777).toBe(0o750);
    expect([home.uid, home.gid]).toEqual([1000, 1000]);
    expect(home.mtime.getTime()).toBe(FIXED_MTIME.getTime());
    const app = await fsp.stat(path.join(root, 'home/app.txt'));
    expect([app.uid, app.gid, app.mode & 0o777]).toEqual([1000, 1001, 0o600]);
    expect(await fsp.readlink(path.join(root, 'bin/sh'))).toBe('tool');
    const link = await fsp.lstat(path.join(root, 'bin/sh'));
    expect([link.uid, link.gid]).toEqual([7, 8]);
    const hard = await fsp.stat(path.join(root, 'bin/tool-hard'));
    expect(hard.ino).toBe(tool.ino);
    expect(hard.nlink).toBe(2);
    const fifo = await fsp.lstat(path.join(root, 'run/fifo'));
    expect(fifo.isFIFO()).toBe(true);
    expect(fifo.mode & 0o777).toBe(0o640);
    // A parent the tar never declared is created 0755.
    expect((await fsp.stat(path.join(root, 'run'))).mode & 0o777).toBe(0o755);
  });

  it('replaces a symlink with a file instead of writing through it', async () => {
    await fsp.writeFile(path.join(outside, 'target'), 'original');
    await apply([{ name: 'link', type: 'symlink', linkname: path.join(outside, 'target') }]);
    await apply([{ name: 'link', content: 'new file' }]);
    expect(await fsp.readFile(path.join(outside, 'target'), 'utf8')).toBe('original');
    expect((await fsp.lstat(path.join(root, 'link'))).isFile()).toBe(true);
  });

  it('lets a file replace a directory and a directory replace a file', async () => {
    await apply([
      { name: 'a/', type: 'directory' },
      { name: 'a/inner', content: 'x' },
      { name: 'b', content: 'file' },
    ]);
    await apply([
      { name: 'a', content: 'now a file' },
      { name: 'b/', type: 'directory' },
      { name: 'b/c', content: 'c' },
    ]);
    expect(await fsp.readFile(path.join(root, 'a'), 'utf8')).toBe('now a file');
    expect(await treeOf(root)).toEqual(['a', 'b', 'b/c']);
  });

  it('follows an absolute symlink in a parent path inside the root (chroot semantics)', async () => {
    await apply([
      { name: 'usr/lib/', type: 'directory' },
      { name: 'lib', type: 'symlink', linkname: '/usr/lib' },
    ]);
    await apply([{ name: 'lib/libc.so', content: 'elf' }]);
    expect(await fsp.readFile(path.join(root, 'usr/lib/libc.so'), 'utf8')).toBe('elf');
    expect(await treeOf(outside)).toEqual([]);
  });

  it('reports the sha256 of the uncompressed tar and checks it against the diff_id', async () => {
    const tar = await buildTar([{ name: 'f', content: 'data' }]);
    const stats = await applyLayer(root, Readable.from([tar]), { layer: LAYER, expectedDiffId: sha256Digest(tar) });
    expect(stats.diffId).toBe(sha256Digest(tar));
    const wrong = `sha256:${'00'.repeat(32)}` as Digest;
    const err = await applyLayer(root, Readable.from([tar]), { layer: LAYER, expectedDiffId: wrong }).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_LAYER_DIFF_ID_MISMATCH' });
  });
});

describe('applyLayer: OCI whiteouts', () => {
  it('applies .wh. files and opaque directories from an upper layer', async () => {
    await apply([
      { name: 'a/', type: 'directory' },
      { name: 'a/b', content: 'b' },
      { name: 'a/c', content: 'c' },
      { name: 'd/', type: 'directory' },
      { name: 'd/e', content: 'e' },
      { name: 'd/sub/', type: 'directory' },
      { name: 'd/sub/f', content: 'f' },
      { name: 'gone/', type: 'directory' },
      { name: 'gone/deep', content: 'x' },
    ]);
    const stats = await apply([
      { name: 'a/.wh.b', content: '' },
      { name: 'd/', type: 'directory' },
      { name: 'd/new', content: 'new' },
      // The opaque marker after this layer's own entries: they must survive it.
      { name: 'd/.wh..wh..opq', content: '' },
      { name: '.wh.gone', content: '' },
      { name: 'a/.wh.never-existed', content: '' },
    ]);
    expect(stats).toMatchObject({ whiteouts: 3, opaqueDirs: 1 });
    expect(await treeOf(root)).toEqual(['a', 'a/c', 'd', 'd/new']);
  });

  it('keeps entries of the same layer under an opaque directory declared first', async () => {
    await apply([
      { name: 'etc/', type: 'directory' },
      { name: 'etc/old.conf', content: 'old' },
      { name: 'etc/dir/', type: 'directory' },
      { name: 'etc/dir/lower', content: 'l' },
    ]);
    await apply([
      { name: 'etc/', type: 'directory' },
      { name: 'etc/.wh..wh..opq', content: '' },
      { name: 'etc/new.conf', content: 'new' },
      { name: 'etc/dir/upper', content: 'u' },
    ]);
    expect(await treeOf(path.join(root, 'etc'))).toEqual(['dir', 'dir/upper', 'new.conf']);
  });

  it('spares a path the same layer wrote when a whiteout names it', async () => {
    await apply([{ name: 'x', content: 'lower' }]);
    await apply([
      { name: 'x', content: 'upper' },
      { name: '.wh.x', content: '' },
    ]);
    expect(await fsp.readFile(path.join(root, 'x'), 'utf8')).toBe('upper');
  });
});

describe('applyLayer: entries that escape the root are refused', () => {
  it('refuses a name with ..', async () => {
    await expectRefused(apply([{ name: '../evil', content: 'x' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', '../evil');
    await expectRefused(apply([{ name: 'a/../../evil', content: 'x' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'a/../../evil');
    expect(await treeOf(work)).toEqual(['outside', 'root']);
  });

  it('refuses an absolute name', async () => {
    await expectRefused(apply([{ name: '/etc/passwd', content: 'x' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', '/etc/passwd');
  });

  it('refuses a write through a relative symlink that climbs out of the root', async () => {
    await apply([{ name: 'esc', type: 'symlink', linkname: '../outside' }]);
    await expectRefused(apply([{ name: 'esc/pwned', content: 'x' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'esc/pwned');
    // Even within one layer, and through a chain of links.
    await expectRefused(
      apply([
        { name: 'hop1', type: 'symlink', linkname: 'hop2/..' },
        { name: 'hop2', type: 'symlink', linkname: '../../outside' },
        { name: 'hop1/pwned', content: 'x' },
      ]),
      'IMAGE_LAYER_UNSAFE_ENTRY',
      'hop1/pwned',
    );
    expect(await treeOf(outside)).toEqual([]);
  });

  it('refuses whiteouts and opaque markers through an escaping symlink', async () => {
    await fsp.writeFile(path.join(outside, 'victim'), 'keep me');
    await apply([{ name: 'esc', type: 'symlink', linkname: '../../outside' }]);
    await expectRefused(apply([{ name: 'esc/.wh.victim', content: '' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'esc/.wh.victim');
    await expectRefused(apply([{ name: 'esc/.wh..wh..opq', content: '' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'esc/.wh..wh..opq');
    expect(await fsp.readFile(path.join(outside, 'victim'), 'utf8')).toBe('keep me');
  });

  it('refuses hard links to paths outside the root', async () => {
    await fsp.writeFile(path.join(outside, 'secret'), 's');
    await expectRefused(apply([{ name: 'h', type: 'link', linkname: '../outside/secret' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'h');
    await expectRefused(apply([{ name: 'h', type: 'link', linkname: path.join(outside, 'secret') }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'h');
    await apply([{ name: 'esc', type: 'symlink', linkname: '../outside' }]);
    await expectRefused(apply([{ name: 'h', type: 'link', linkname: 'esc/secret' }]), 'IMAGE_LAYER_UNSAFE_ENTRY', 'h');
    await expect(fsp.lstat(path.join(root, 'h'))).rejects.toThrow();
    expect((await fsp.stat(path.join(outside, 'secret'))).nlink).toBe(1);
  });

  it('refuses a hard link to a path that does not exist', async () => {
    await expectRefused(apply([{ name: 'h', type: 'link', linkname: 'missing' }]), 'IMAGE_LAYER_INVALID_ENTRY', 'h');
  });
});

describe('applyLayerFile and unpackImage', () => {
  const entries: TarEntrySpec[] = [
    { name: 'etc/', type: 'directory' },
    { name: 'etc/os-release', content: 'ID=test\n' },
  ];

  it('reads gzip, zstd and plain tar layers alike', async () => {
    const tar = await buildTar(entries);
    for (const [kind, bytes] of [
      ['gzip', gzip(tar)],
      ['zstd', await zstd(tar)],
      ['none', tar],
    ] as const) {
      const file = path.join(work, `layer.${kind}`);
      await fsp.writeFile(file, bytes);
      const dest = path.join(work, `dest-${kind}`);
      await fsp.mkdir(dest);
      const stats = await applyLayerFile(dest, file, { layer: LAYER, expectedDiffId: sha256Digest(tar) });
      expect(stats.compression).toBe(kind);
      expect(await fsp.readFile(path.join(dest, 'etc/os-release'), 'utf8')).toBe('ID=test\n');
    }
  });

  it('reports a corrupt compressed layer as IMAGE_LAYER_CORRUPT', async () => {
    const bytes = gzip(await buildTar(entries));
    bytes[bytes.length - 12] = (bytes[bytes.length - 12] ?? 0) ^ 0xff;
    bytes[20] = (bytes[20] ?? 0) ^ 0xff;
    const file = path.join(work, 'bad.gz');
    await fsp.writeFile(file, bytes);
    const err = await applyLayerFile(root, file, { layer: LAYER }).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_LAYER_CORRUPT' });
  });

  it('builds the rootfs under a temp name and leaves nothing behind when a layer is refused', async () => {
    const good = await buildTar(entries);
    const bad = await buildTar([{ name: '../escape', content: 'x' }]);
    await fsp.writeFile(path.join(work, 'good'), gzip(good));
    await fsp.writeFile(path.join(work, 'bad'), bad);
    const parent = path.join(work, 'rootfs');
    const ok = await unpackImage(parent, 'img1', [{ digest: LAYER, diffId: sha256Digest(good), file: path.join(work, 'good') }], {});
    expect(ok.path).toBe(path.join(parent, 'img1'));
    const err = await unpackImage(
      parent,
      'img2',
      [
        { digest: LAYER, diffId: sha256Digest(good), file: path.join(work, 'good') },
        { digest: LAYER, diffId: sha256Digest(bad), file: path.join(work, 'bad') },
      ],
      {},
    ).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_LAYER_UNSAFE_ENTRY' });
    expect(await fsp.readdir(parent)).toEqual(['img1']);
  });
});
