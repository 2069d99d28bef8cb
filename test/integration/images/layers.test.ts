/**
 * Layers unpacked once, shared by images, against a real docker-registry: two images sharing a
 * base layer take it once on disk; a container root filesystem is an overlay of the layers whose
 * writes go to its own upper directory; RemoveImage removes the layers no image holds and keeps
 * those a container stacks; a store unpacked flat by an older kata-ts keeps working (copied); a
 * restart finds everything. No VM (test/integration/containers/overlay-rootfs.test.ts boots one).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createContainerRootfs, isMountPoint, removeContainerRootfs } from '../../../src/images/rootfs.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { listFiles, type ServiceHarness, startImageService } from '../../helpers/images-fixtures.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

let registry: RegistryHandle;
let h: ServiceHarness;
const hex = (d: string): string => d.slice('sha256:'.length);
const layersDir = (): string => path.join(h.stateDir, 'images', 'layers');
const mounted: string[] = [];

const base = { entries: [...busyboxBaseEntries(), { name: 'etc/doomed', content: 'from the base\n' }], compression: 'gzip' as const };
let appA: Awaited<ReturnType<typeof buildImage>>;
let appB: Awaited<ReturnType<typeof buildImage>>;

beforeAll(async () => {
  registry = await startRegistry();
  appA = await buildImage({
    layers: [base, { entries: [{ name: 'etc/.wh.doomed' }, { name: 'app/a.txt', content: 'a\n' }], compression: 'gzip' }],
    label: 'a',
  });
  appB = await buildImage({ layers: [base, { entries: [{ name: 'app/b.txt', content: 'b\n' }], compression: 'zstd' }], label: 'b' });
  const pusher = new RegistryPusher(registry.url);
  await pusher.pushImage('kata/app-a', '1', appA);
  await pusher.pushImage('kata/app-b', '1', appB);
  h = await startImageService({ rootfsMode: 'auto' });
});

afterAll(async () => {
  for (const dir of mounted) await removeContainerRootfs({ dir, lowerDirs: [] }).catch(() => undefined);
  await h?.cleanup();
  await registry?.stop();
});

describe('layers unpacked once, shared by images', () => {
  it('probes overlayfs once and unpacks layers, not flat trees', () => {
    expect(h.service.rootfsMode).toEqual({ mode: 'overlay', reason: '' });
  });

  it('two images sharing a base layer: the base layer is on disk once', async () => {
    await h.service.pullImage({ image: { image: `${registry.host}/kata/app-a:1` } });
    await h.service.pullImage({ image: { image: `${registry.host}/kata/app-b:1` } });
    const [baseDiff, aDiff] = appA.diffIds as [string, string];
    const bDiff = appB.diffIds[1] as string;
    expect(appB.diffIds[0]).toBe(baseDiff);
    expect(await listFiles(layersDir())).toEqual([hex(baseDiff), hex(aDiff), hex(bDiff)].sort());
    expect(await listFiles(path.join(h.stateDir, 'images', 'rootfs'))).toEqual([]);
    // The whiteout is an overlay whiteout in the top layer; the base layer keeps the file.
    expect((await fsp.lstat(path.join(layersDir(), hex(aDiff), 'etc/doomed'))).isCharacterDevice()).toBe(true);
    expect(await fsp.readFile(path.join(layersDir(), hex(baseDiff), 'etc/doomed'), 'utf8')).toBe('from the base\n');
  });

  it('a container root filesystem is an overlay: image files seen, whited-out file absent, writes only in its upper', async () => {
    const dir = path.join(h.stateDir, 'rootfs', 'c1');
    mounted.push(dir);
    const made = await createContainerRootfs(h.service.rootfsSourceFor(appA.id), dir);
    expect(made.path).toBe(path.join(dir, 'merged'));
    expect(await isMountPoint(made.path)).toBe(true);
    expect(await fsp.readFile(path.join(made.path, 'app/a.txt'), 'utf8')).toBe('a\n');
    await expect(fsp.stat(path.join(made.path, 'etc/doomed'))).rejects.toMatchObject({ code: 'ENOENT' });
    await fsp.writeFile(path.join(made.path, 'etc/passwd'), 'changed\n');
    await fsp.rm(path.join(made.path, 'bin/ls'));
    const baseDir = path.join(layersDir(), hex(appA.diffIds[0] as string));
    expect(await fsp.readFile(path.join(baseDir, 'etc/passwd'), 'utf8')).toContain('root:x:0:0');
    expect((await fsp.lstat(path.join(baseDir, 'bin/ls'))).isSymbolicLink()).toBe(true);
    expect(await fsp.readFile(path.join(dir, 'upper/etc/passwd'), 'utf8')).toBe('changed\n');

    // RemoveImage of that image while a container stacks its layers: refused for the image
    // record (in use), and even without that guard the GC keeps the stacked layers.
    h.inUse.add(appA.id);
    await expect(h.service.removeImage({ image: { image: appA.id } })).rejects.toMatchObject({ reason: 'IMAGE_IN_USE' });
    h.inUse.delete(appA.id);

    await removeContainerRootfs(made.overlay!);
    expect(await isMountPoint(made.path)).toBe(false);
    await expect(fsp.stat(dir)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('a failed overlay create rolls back: a missing layer leaves no directory, link or mount; an existing dir is refused', async () => {
    const dir = path.join(h.stateDir, 'rootfs', 'c2');
    const source = h.service.rootfsSourceFor(appA.id);
    if (source.kind !== 'layers') throw new Error('expected a layered image');
    await expect(
      createContainerRootfs({ kind: 'layers', lowerDirs: [...source.lowerDirs, path.join(layersDir(), 'f'.repeat(64))] }, dir),
    ).rejects.toMatchObject({
      reason: 'IMAGE_LAYER_MISSING',
    });
    await expect(fsp.stat(dir)).rejects.toMatchObject({ code: 'ENOENT' });
    await fsp.mkdir(dir, { recursive: true });
    await expect(createContainerRootfs(source, dir)).rejects.toMatchObject({ kind: 'exists', reason: 'SNAPSHOT_EXISTS' });
    expect(await isMountPoint(path.join(dir, 'merged'))).toBe(false);
    await fsp.rmdir(dir);
  });

  it('a restart finds the layered images; RemoveImage removes the layers no image holds and keeps the shared one', async () => {
    h.service = await h.restart();
    expect(h.service.rootfsSourceFor(appB.id)).toEqual({
      kind: 'layers',
      lowerDirs: [...appB.diffIds].reverse().map((d) => path.join(layersDir(), hex(d))),
    });
    await h.service.removeImage({ image: { image: appA.id } });
    expect(await listFiles(layersDir())).toEqual([hex(appB.diffIds[0] as string), hex(appB.diffIds[1] as string)].sort());
    await h.service.removeImage({ image: { image: appB.id } });
    expect(await listFiles(layersDir())).toEqual([]);
  });

  it('an index of format 1 (flat trees) keeps working, copied; pulled again it becomes layered and its flat tree goes', async () => {
    const flat = await startImageService({ rootfsMode: 'copy' });
    try {
      await flat.service.pullImage({ image: { image: `${registry.host}/kata/app-a:1` } });
      // What a kata-ts before layers wrote: format 1, no `unpacked`.
      const indexFile = path.join(flat.stateDir, 'images', 'index.json');
      const doc = JSON.parse(await fsp.readFile(indexFile, 'utf8')) as { version: number; images: Array<Record<string, unknown>> };
      await fsp.writeFile(indexFile, JSON.stringify({ version: 1, images: doc.images.map(({ unpacked: _u, ...rest }) => rest) }));
      const upgraded = await openStore(flat);
      expect(upgraded.rootfsMode.mode).toBe('overlay');
      expect(upgraded.rootfsSourceFor(appA.id)).toEqual({ kind: 'flat', dir: upgraded.rootfsFor(appA.id) });
      await upgraded.pullImage({ image: { image: `${registry.host}/kata/app-a:1` } });
      expect(upgraded.rootfsSourceFor(appA.id).kind).toBe('layers');
      upgraded.close();
      // The next start's collection removes the flat tree no record needs any more.
      const next = await openStore(flat);
      expect(next.rootfsSourceFor(appA.id).kind).toBe('layers');
      expect(await listFiles(path.join(flat.stateDir, 'images', 'rootfs'))).toEqual([]);
      expect(JSON.parse(await fsp.readFile(indexFile, 'utf8')).version).toBe(2);
      next.close();
    } finally {
      await flat.cleanup();
    }
  });
});

/** The same state dir opened by a kata-ts that probes overlayfs (an upgrade). */
async function openStore(prev: ServiceHarness) {
  const { ImageService } = await import('../../../src/images/service.js');
  const { silentLogger } = await import('../../../src/common/logger.js');
  const svc = new ImageService({
    stateDir: prev.stateDir,
    registriesConfigPath: prev.registriesFile,
    logger: silentLogger(),
    isImageInUse: () => false,
  });
  await svc.init();
  return svc;
}
