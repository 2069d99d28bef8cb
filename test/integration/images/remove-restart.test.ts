import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  buildTestImages,
  listFiles,
  publishTestImages,
  type ServiceHarness,
  startImageService,
  type TestImages,
} from '../../helpers/images-fixtures.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

// RemoveImage rules and daemon restarts, on images pulled from a real docker-registry.
let registry: RegistryHandle;
let images: TestImages;
let h: ServiceHarness;

beforeAll(async () => {
  images = await buildTestImages();
  registry = await startRegistry();
  await publishTestImages(registry, images);
  h = await startImageService({ pinnedImages: [] });
});

afterAll(async () => {
  await h?.cleanup();
  await registry?.stop();
});

const hex = (d: string): string => d.slice('sha256:'.length);
const blobsDir = (): string => path.join(h.stateDir, 'images', 'blobs', 'sha256');

describe('RemoveImage and restart', () => {
  it('keeps images, names and root filesystems across a restart', async () => {
    await h.service.pullImage({ image: { image: `${registry.host}/kata/busybox:1.0` }, auth: null });
    await h.service.pullImage({ image: { image: `${registry.host}/kata/busybox:1.1-alias` } });
    await h.service.pullImage({ image: { image: `${registry.host}/kata/sibling:latest` } });
    const before = await h.service.listImages({});
    const restarted = await h.restart();
    expect(await restarted.listImages({})).toEqual(before);
    expect(await fsp.readFile(path.join(restarted.rootfsFor(images.busybox.id), 'app/hello.txt'), 'utf8')).toBe(
      'hello from a zstd layer\n',
    );
    h.service = restarted;
  });

  it('refuses to remove an image a container uses, with FAILED_PRECONDITION, and changes nothing', async () => {
    h.inUse.add(images.busybox.id);
    try {
      await expect(h.service.removeImage({ image: { image: images.busybox.id } })).rejects.toMatchObject({
        kind: 'precondition',
        reason: 'IMAGE_IN_USE',
      });
    } finally {
      h.inUse.delete(images.busybox.id);
    }
    expect((await h.service.imageStatus({ image: { image: images.busybox.id } })).image?.repo_tags).toHaveLength(2);
  });

  it('RemoveImage by one tag of several removes only that tag and keeps the image', async () => {
    await h.service.removeImage({ image: { image: `${registry.host}/kata/busybox:1.1-alias` } });
    const st = await h.service.imageStatus({ image: { image: images.busybox.id } });
    expect(st.image?.repo_tags).toEqual([`${registry.host}/kata/busybox:1.0`]);
    expect(await fsp.readFile(path.join(h.service.rootfsFor(images.busybox.id), 'app/hello.txt'), 'utf8')).toBe(
      'hello from a zstd layer\n',
    );
  });

  it('RemoveImage by the last tag removes the whole image, keeping layers other images share', async () => {
    await h.service.removeImage({ image: { image: `${registry.host}/kata/busybox:1.0` } });
    expect((await h.service.imageStatus({ image: { image: `${registry.host}/kata/busybox:1.0` } })).image).toBeNull();
    expect(h.service.resolveImage(images.busybox.id)).toBeUndefined();
    const blobs = await listFiles(blobsDir());
    expect(blobs).toContain(hex(images.busybox.layers[0]?.digest ?? '')); // shared with sibling
    expect(blobs).not.toContain(hex(images.busybox.layers[1]?.digest ?? ''));
    expect(blobs).not.toContain(hex(images.busybox.config.digest));
    expect(await listFiles(path.join(h.stateDir, 'images', 'rootfs'))).toEqual([hex(images.sibling.id)]);
  });

  it('RemoveImage by id removes every name at once', async () => {
    await h.service.pullImage({ image: { image: `${registry.host}/kata/busybox:1.0` } });
    await h.service.pullImage({ image: { image: `${registry.host}/kata/busybox:1.1-alias` } });
    await h.service.removeImage({ image: { image: images.busybox.id } });
    expect(h.service.resolveImage(`${registry.host}/kata/busybox:1.0`)).toBeUndefined();
    expect(h.service.resolveImage(`${registry.host}/kata/busybox:1.1-alias`)).toBeUndefined();
  });

  it('is idempotent: removing a missing or already removed image succeeds', async () => {
    await expect(h.service.removeImage({ image: { image: `${registry.host}/kata/busybox:1.0` } })).resolves.toEqual({});
    await expect(h.service.removeImage({ image: { image: `sha256:${'0'.repeat(64)}` } })).resolves.toEqual({});
    await expect(h.service.removeImage({ image: { image: '' } })).rejects.toMatchObject({ kind: 'invalid', reason: 'IMAGE_SPEC_EMPTY' });
  });

  it('removes by id prefix and by repo digest, leaving an empty store', async () => {
    await h.service.pullImage({ image: { image: `${registry.host}/kata/nonroot:latest` } });
    await h.service.removeImage({ image: { image: hex(images.nonroot.id).slice(0, 12) } });
    expect(h.service.resolveImage(images.nonroot.id)).toBeUndefined();
    await h.service.removeImage({ image: { image: `${registry.host}/kata/sibling@${images.sibling.manifest.digest}` } });
    expect((await h.service.listImages({})).images).toEqual([]);
    expect(await listFiles(blobsDir())).toEqual([]);
    expect(await listFiles(path.join(h.stateDir, 'images', 'rootfs'))).toEqual([]);
    const restarted = await h.restart();
    expect((await restarted.listImages({})).images).toEqual([]);
  });

  it('moves a tag to the new image when it is pulled again after the registry retagged it', async () => {
    const tag = `${registry.host}/kata/moving:v1`;
    const { RegistryPusher } = await import('../../helpers/images-builder.js');
    const pusher = new RegistryPusher(registry.url);
    await pusher.pushImage('kata/moving', 'v1', images.namedUser);
    const first = await h.service.pullImage({ image: { image: tag } });
    await pusher.pushImage('kata/moving', 'v1', images.nonroot);
    const second = await h.service.pullImage({ image: { image: tag } });
    expect(second.image_ref).not.toBe(first.image_ref);
    const old = await h.service.imageStatus({ image: { image: first.image_ref } });
    expect(old.image?.repo_tags).toEqual([]);
    expect(old.image?.repo_digests).toEqual([`${registry.host}/kata/moving@${images.namedUser.manifest.digest}`]);
    expect((await h.service.imageStatus({ image: { image: tag } })).image?.id).toBe(images.nonroot.id);
  });
});
