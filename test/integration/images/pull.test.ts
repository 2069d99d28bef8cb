import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ImageService } from '../../../src/images/service.js';
import {
  buildTestImages,
  listFiles,
  publishTestImages,
  type ServiceHarness,
  startImageService,
  type TestImages,
} from '../../helpers/images-fixtures.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

// Pulls from a real docker-registry (distribution 2.8) on 127.0.0.1, images built and pushed here.
let registry: RegistryHandle;
let images: TestImages;
let harness: ServiceHarness;
let svc: ImageService;

beforeAll(async () => {
  images = await buildTestImages();
  registry = await startRegistry();
  await publishTestImages(registry, images);
  harness = await startImageService();
  svc = harness.service;
});

afterAll(async () => {
  await harness?.cleanup();
  await registry?.stop();
});

const hex = (digest: string): string => digest.slice('sha256:'.length);

describe('PullImage from a real registry', () => {
  it('pulls by tag: id is the config digest, names and size are reported, the rootfs is unpacked', async () => {
    const ref = `${registry.host}/kata/busybox:1.0`;
    const res = await svc.pullImage({ image: { image: ref } });
    expect(res.image_ref).toBe(images.busybox.id);

    const { images: listed } = await svc.listImages({});
    expect(listed).toHaveLength(1);
    const img = listed[0];
    expect(img?.id).toBe(images.busybox.id);
    expect(img?.repo_tags).toEqual([ref]);
    expect(img?.repo_digests).toEqual([`${registry.host}/kata/busybox@${images.busybox.manifest.digest}`]);
    const expectedSize = images.busybox.manifest.size + images.busybox.config.size + images.busybox.layers.reduce((n, l) => n + l.size, 0);
    expect(img?.size).toBe(String(expectedSize));
    expect(img?.uid).toBeNull();
    expect(img?.username).toBe('');
    expect(img?.pinned).toBe(false);

    const rootfs = svc.rootfsFor(images.busybox.id);
    expect(rootfs).toBe(path.join(harness.stateDir, 'images', 'rootfs', hex(images.busybox.id)));
    const busybox = await fsp.stat(path.join(rootfs, 'bin/busybox'));
    expect(busybox.mode & 0o777).toBe(0o755);
    expect(await fsp.readlink(path.join(rootfs, 'bin/sh'))).toBe('busybox');
    expect(await fsp.readFile(path.join(rootfs, 'app/hello.txt'), 'utf8')).toBe('hello from a zstd layer\n');
    expect((await fsp.stat(path.join(rootfs, 'tmp'))).mode & 0o7777).toBe(0o1777);

    // Blobs are stored by digest: manifest, config, both layers.
    const blobs = await listFiles(path.join(harness.stateDir, 'images', 'blobs', 'sha256'));
    expect(blobs).toEqual([images.busybox.manifest, images.busybox.config, ...images.busybox.layers].map((b) => hex(b.digest)).sort());
  });

  it('answers ImageStatus by tag, short name, id and id prefix, with the config when verbose', async () => {
    for (const name of [
      `${registry.host}/kata/busybox:1.0`,
      images.busybox.id,
      hex(images.busybox.id),
      hex(images.busybox.id).slice(0, 12),
    ]) {
      const st = await svc.imageStatus({ image: { image: name } });
      expect(st.image?.id, name).toBe(images.busybox.id);
      expect(st.info).toEqual({});
    }
    const verbose = await svc.imageStatus({ image: { image: images.busybox.id }, verbose: true });
    const info = JSON.parse(verbose.info.info ?? '{}') as { imageSpec: { config: { Cmd: string[] } }; manifestDigest: string };
    expect(info.imageSpec.config.Cmd).toEqual(['/bin/sh', '-c', 'cat /app/hello.txt']);
    expect(info.manifestDigest).toBe(images.busybox.manifest.digest);
    const missing = await svc.imageStatus({ image: { image: `${registry.host}/kata/busybox:nope` } });
    expect(missing).toEqual({ image: null, info: {} });
  });

  it('adds a second tag of the same image to the same record and resolves it', async () => {
    const alias = `${registry.host}/kata/busybox:1.1-alias`;
    expect((await svc.pullImage({ image: { image: alias } })).image_ref).toBe(images.busybox.id);
    const st = await svc.imageStatus({ image: { image: alias } });
    expect(st.image?.repo_tags).toEqual([`${registry.host}/kata/busybox:1.0`, alias]);
    expect(svc.resolveImage(alias)?.id).toBe(images.busybox.id);
    expect((await svc.listImages({})).images).toHaveLength(1);
  });

  it('pulls by digest: a repo digest, no new tag', async () => {
    const ref = `${registry.host}/kata/sibling@${images.sibling.manifest.digest}`;
    const res = await svc.pullImage({ image: { image: ref } });
    expect(res.image_ref).toBe(images.sibling.id);
    const st = await svc.imageStatus({ image: { image: ref } });
    expect(st.image?.repo_tags).toEqual([]);
    expect(st.image?.repo_digests).toEqual([ref]);
  });

  it('stores a layer shared by two images once', async () => {
    const base = images.busybox.layers[0];
    expect(images.sibling.layers[0]?.digest).toBe(base?.digest);
    const blobs = await listFiles(path.join(harness.stateDir, 'images', 'blobs', 'sha256'));
    expect(blobs.filter((b) => b === hex(base?.digest ?? ''))).toHaveLength(1);
    // The sibling pull added only its own manifest, config and top layer.
    expect(blobs).toHaveLength(4 + 3);
  });

  it('resolves a multi-arch OCI index to linux/amd64 and reports the index digest', async () => {
    const ref = `${registry.host}/kata/multiarch:latest`;
    const res = await svc.pullImage({ image: { image: ref } });
    expect(res.image_ref).toBe(images.multiarchAmd64.id);
    const st = await svc.imageStatus({ image: { image: ref } });
    expect(st.image?.repo_digests).toEqual([`${registry.host}/kata/multiarch@${images.multiarchIndex.digest}`]);
    expect(await fsp.readFile(path.join(svc.rootfsFor(res.image_ref), 'etc/arch'), 'utf8')).toBe('amd64\n');
  });

  it('applies whiteouts, opaque directories, hard links, symlinks, modes and owners across layers', async () => {
    const res = await svc.pullImage({ image: { image: `${registry.host}/kata/layered:latest` } });
    const root = svc.rootfsFor(res.image_ref);
    expect((await fsp.readdir(path.join(root, 'data'))).sort()).toEqual(['keep.txt']);
    expect((await fsp.readdir(path.join(root, 'opt'))).sort()).toEqual(['upper.txt']);
    expect((await fsp.stat(path.join(root, 'opt'))).mode & 0o777).toBe(0o750);
    const suid = await fsp.stat(path.join(root, 'usr/local/bin/suid-tool'));
    expect(suid.mode & 0o7777).toBe(0o4755);
    expect((await fsp.stat(path.join(root, 'usr/local/bin/tool-link'))).ino).toBe(suid.ino);
    expect(await fsp.readlink(path.join(root, 'usr/local/bin/tool-sym'))).toBe('suid-tool');
    const home = await fsp.stat(path.join(root, 'home/app'));
    expect([home.uid, home.gid, home.mode & 0o777]).toEqual([1000, 1000, 0o700]);
    const profile = await fsp.stat(path.join(root, 'home/app/.profile'));
    expect([profile.uid, profile.gid, profile.mode & 0o777]).toEqual([1000, 1000, 0o640]);
  });

  it('reports the config USER as uid (numeric, Docker schema 2 pushed in chunks) or username', async () => {
    const nonroot = await svc.pullImage({ image: { image: `${registry.host}/kata/nonroot:latest` } });
    const st = await svc.imageStatus({ image: { image: nonroot.image_ref } });
    expect(st.image?.uid).toEqual({ value: '1000' });
    expect(st.image?.username).toBe('');
    const named = await svc.pullImage({ image: { image: `${registry.host}/kata/named-user:latest` } });
    const st2 = await svc.imageStatus({ image: { image: named.image_ref } });
    expect(st2.image?.uid).toBeNull();
    expect(st2.image?.username).toBe('app');
  });

  it('filters ListImages by reference, by bare repository and by id', async () => {
    const byTag = await svc.listImages({ filter: { image: { image: `${registry.host}/kata/nonroot:latest` } } });
    expect(byTag.images.map((i) => i.id)).toEqual([images.nonroot.id]);
    const byRepo = await svc.listImages({ filter: { image: { image: `${registry.host}/kata/busybox` } } });
    expect(byRepo.images.map((i) => i.id)).toEqual([images.busybox.id]);
    const byId = await svc.listImages({ filter: { image: { image: images.layered.id } } });
    expect(byId.images.map((i) => i.id)).toEqual([images.layered.id]);
    const none = await svc.listImages({ filter: { image: { image: `${registry.host}/kata/absent:1` } } });
    expect(none.images).toEqual([]);
  });

  it('answers NOT_FOUND for a missing tag and a missing repository', async () => {
    for (const ref of [`${registry.host}/kata/busybox:missing`, `${registry.host}/kata/no-such-repo:1`]) {
      await expect(svc.pullImage({ image: { image: ref } })).rejects.toMatchObject({ kind: 'not_found', reason: 'IMAGE_NOT_FOUND' });
    }
  });

  it('refuses an empty or malformed reference with INVALID naming image.image', async () => {
    await expect(svc.pullImage({ image: { image: '' } })).rejects.toMatchObject({ kind: 'invalid', reason: 'IMAGE_SPEC_EMPTY' });
    await expect(svc.pullImage({ image: null })).rejects.toMatchObject({ kind: 'invalid', reason: 'IMAGE_SPEC_EMPTY' });
    const err = await svc.pullImage({ image: { image: `${registry.host}/Kata/UPPER:1` } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_REFERENCE_INVALID' });
    expect((err as Error).message).toContain('image.image');
  });

  it('reports images named in pinnedImages as pinned', async () => {
    const pinnedRef = `${registry.host}/kata/sibling:latest`;
    const other = await startImageService({ pinnedImages: [pinnedRef] });
    try {
      await other.service.pullImage({ image: { image: pinnedRef } });
      await other.service.pullImage({ image: { image: `${registry.host}/kata/nonroot:latest` } });
      const pinned = (await other.service.listImages({})).images.map((i) => [i.id, i.pinned]);
      expect(pinned).toEqual([
        [images.sibling.id, true],
        [images.nonroot.id, false],
      ]);
    } finally {
      await other.cleanup();
    }
  });

  it('reports bytes and inodes used by the store in ImageFsInfo', async () => {
    const info = await svc.imageFsInfo();
    expect(info.container_filesystems).toEqual([]);
    const fs = info.image_filesystems[0];
    expect(fs?.fs_id?.mountpoint).toBe(path.join(harness.stateDir, 'images'));
    // At least the compressed blobs are on disk, and every unpacked file is an inode.
    const blobBytes = images.busybox.layers[0]?.size ?? 0;
    expect(Number(fs?.used_bytes?.value)).toBeGreaterThan(blobBytes);
    expect(Number(fs?.inodes_used?.value)).toBeGreaterThan(50);
    expect(BigInt(fs?.timestamp ?? '0')).toBeGreaterThan(0n);
  });
});
