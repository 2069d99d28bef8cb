import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type BuiltImage, buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type ServiceHarness, startImageService } from '../../helpers/images-fixtures.js';
import { freePort, type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

// Mirrors from the registries file, with two real docker-registry instances: a mirror and an upstream.
let mirror: RegistryHandle;
let upstream: RegistryHandle;
let onlyInMirror: BuiltImage;
let onlyUpstream: BuiltImage;
let h: ServiceHarness | undefined;

beforeAll(async () => {
  const base = { entries: busyboxBaseEntries(), compression: 'gzip' as const };
  onlyInMirror = await buildImage({ layers: [base], label: 'mirror' });
  onlyUpstream = await buildImage({ layers: [base], label: 'upstream' });
  mirror = await startRegistry();
  upstream = await startRegistry();
  const toMirror = new RegistryPusher(mirror.url);
  await toMirror.pushImage('kata/mirrored', '1', onlyInMirror);
  await toMirror.pushImage('library/hub-image', '2', onlyInMirror);
  await new RegistryPusher(upstream.url).pushImage('kata/upstream-only', '1', onlyUpstream);
});

afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

afterAll(async () => {
  await mirror?.stop();
  await upstream?.stop();
});

describe('registry mirrors', () => {
  it('pulls through the mirror first, naming the image after the upstream registry', async () => {
    h = await startImageService({
      registries: { [upstream.host]: { plainHttp: true, mirrors: [mirror.host] }, '127.0.0.1:*': { plainHttp: true } },
    });
    const ref = `${upstream.host}/kata/mirrored:1`;
    expect((await h.service.pullImage({ image: { image: ref } })).image_ref).toBe(onlyInMirror.id);
    expect((await h.service.imageStatus({ image: { image: ref } })).image?.repo_tags).toEqual([ref]);
  });

  it('falls back to the registry itself when the mirror lacks the image or is down', async () => {
    const dead = `127.0.0.1:${await freePort()}`;
    h = await startImageService({
      registries: { [upstream.host]: { plainHttp: true, mirrors: [dead, `http://${mirror.host}`] }, '127.0.0.1:*': { plainHttp: true } },
    });
    expect((await h.service.pullImage({ image: { image: `${upstream.host}/kata/upstream-only:1` } })).image_ref).toBe(onlyUpstream.id);
  });

  it("reports the registry's own answer when neither mirror nor registry has the image", async () => {
    h = await startImageService({
      registries: { [upstream.host]: { plainHttp: true, mirrors: [mirror.host] }, '127.0.0.1:*': { plainHttp: true } },
    });
    await expect(h.service.pullImage({ image: { image: `${upstream.host}/kata/nowhere:1` } })).rejects.toMatchObject({
      kind: 'not_found',
      reason: 'IMAGE_NOT_FOUND',
    });
  });

  it('serves docker.io short names from a configured mirror without contacting Docker Hub', async () => {
    h = await startImageService({ registries: { 'docker.io': { mirrors: [mirror.host] }, '127.0.0.1:*': { plainHttp: true } } });
    const res = await h.service.pullImage({ image: { image: 'hub-image:2' } });
    expect(res.image_ref).toBe(onlyInMirror.id);
    const st = await h.service.imageStatus({ image: { image: 'hub-image:2' } });
    expect(st.image?.repo_tags).toEqual(['docker.io/library/hub-image:2']);
    expect(h.service.resolveImage('docker.io/library/hub-image:2')?.id).toBe(onlyInMirror.id);
  });

  it('refuses to start with an invalid registries file, naming the bad key', async () => {
    const err = await startImageService({ registries: { '127.0.0.1:*': { plainHTTP: true } } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'REGISTRIES_CONFIG_INVALID' });
    expect((err as Error).message).toContain('plainHTTP is not a known key');
  });
});
