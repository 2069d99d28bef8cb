import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type BuiltImage, buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type ServiceHarness, startImageService } from '../../helpers/images-fixtures.js';
import { startProxy } from '../../helpers/images-proxy.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

// A real docker-registry that requires credentials: htpasswd (HTTP Basic) and Docker token auth
// (Bearer JWTs from a token server the registry trusts).
const user = { username: 'kata', password: 's3cret:with-colon' };
let image: BuiltImage;
let basicRegistry: RegistryHandle;
let tokenRegistry: RegistryHandle;
let h: ServiceHarness;

beforeAll(async () => {
  image = await buildImage({ layers: [{ entries: busyboxBaseEntries(), compression: 'gzip' }], label: 'private' });
  basicRegistry = await startRegistry({ kind: 'htpasswd', users: [user] });
  await new RegistryPusher(basicRegistry.url, basicRegistry.pushAuthorization).pushImage('kata/private', '1', image);
  tokenRegistry = await startRegistry({ kind: 'token', users: [user] });
  await new RegistryPusher(tokenRegistry.url, tokenRegistry.pushAuthorization).pushImage('kata/private', '1', image);
});

afterAll(async () => {
  await basicRegistry?.stop();
  await tokenRegistry?.stop();
});

afterEach(async () => {
  await h?.cleanup();
});

async function fresh(): Promise<ServiceHarness> {
  h = await startImageService();
  return h;
}

describe('registry with htpasswd (Basic) auth', () => {
  it('answers UNAUTHENTICATED without credentials and stores nothing', async () => {
    const { service } = await fresh();
    await expect(service.pullImage({ image: { image: `${basicRegistry.host}/kata/private:1` } })).rejects.toMatchObject({
      kind: 'unauthenticated',
      reason: 'IMAGE_REGISTRY_AUTH_REQUIRED',
    });
    expect((await service.listImages({})).images).toEqual([]);
  });

  it('answers UNAUTHENTICATED when the password is wrong', async () => {
    const { service } = await fresh();
    await expect(
      service.pullImage({ image: { image: `${basicRegistry.host}/kata/private:1` }, auth: { username: user.username, password: 'wrong' } }),
    ).rejects.toMatchObject({ kind: 'unauthenticated', reason: 'IMAGE_REGISTRY_UNAUTHORIZED' });
  });

  it('pulls with username/password and with the base64 auth field', async () => {
    const { service } = await fresh();
    const ref = `${basicRegistry.host}/kata/private:1`;
    const res = await service.pullImage({
      image: { image: ref },
      auth: { username: user.username, password: user.password, server_address: basicRegistry.host },
    });
    expect(res.image_ref).toBe(image.id);
    await service.removeImage({ image: { image: ref } });
    const auth = Buffer.from(`${user.username}:${user.password}`).toString('base64');
    expect((await service.pullImage({ image: { image: ref }, auth: { auth } })).image_ref).toBe(image.id);
  });

  it('follows blob redirects to another origin without forwarding the credentials there', async () => {
    const proxy = await startProxy(basicRegistry.url, {
      redirectBlobs: { authorization: await basicRegistry.pushAuthorization('kata/private') },
    });
    try {
      const { service } = await fresh();
      const res = await service.pullImage({
        image: { image: `${proxy.host}/kata/private:1` },
        auth: { username: user.username, password: user.password },
      });
      expect(res.image_ref).toBe(image.id);
      // Config and the one layer came through the redirect, and no Authorization header went along.
      expect(proxy.storageRequests.map((r) => r.url.split('/blobs/')[1]?.split('?')[0]).sort()).toEqual(
        [image.config.digest, image.layers[0]?.digest].sort(),
      );
      expect(proxy.storageRequests.every((r) => r.authorization === undefined)).toBe(true);
    } finally {
      await proxy.stop();
    }
  });

  it('does not send credentials issued for another registry', async () => {
    const { service } = await fresh();
    await expect(
      service.pullImage({
        image: { image: `${basicRegistry.host}/kata/private:1` },
        auth: { username: user.username, password: user.password, server_address: 'other.example.com' },
      }),
    ).rejects.toMatchObject({ kind: 'unauthenticated', reason: 'IMAGE_REGISTRY_AUTH_REQUIRED' });
  });

  it('refuses an auth field that is not base64 of user:password with INVALID naming auth.auth', async () => {
    const { service } = await fresh();
    const err = await service
      .pullImage({ image: { image: `${basicRegistry.host}/kata/private:1` }, auth: { auth: 'bm9jb2xvbg==' } })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_AUTH_INVALID' });
    expect((err as Error).message).toContain('auth.auth');
  });
});

describe('registry with Docker token (Bearer) auth', () => {
  it('answers UNAUTHENTICATED when the token service refuses anonymous access', async () => {
    const { service } = await fresh();
    await expect(service.pullImage({ image: { image: `${tokenRegistry.host}/kata/private:1` } })).rejects.toMatchObject({
      kind: 'unauthenticated',
      reason: 'IMAGE_REGISTRY_UNAUTHORIZED',
    });
  });

  it('gets a pull-scoped token with the credentials and pulls', async () => {
    const { service } = await fresh();
    tokenRegistry.tokenRequests.length = 0;
    const res = await service.pullImage({
      image: { image: `${tokenRegistry.host}/kata/private:1` },
      auth: { username: user.username, password: user.password },
    });
    expect(res.image_ref).toBe(image.id);
    // One token for the whole pull (manifest, config, layer), scoped to pulling this repository.
    expect(tokenRegistry.tokenRequests).toEqual([{ scope: 'repository:kata/private:pull', user: user.username }]);
  });

  it('answers UNAUTHENTICATED when the token service refuses the password', async () => {
    const { service } = await fresh();
    await expect(
      service.pullImage({ image: { image: `${tokenRegistry.host}/kata/private:1` }, auth: { username: user.username, password: 'nope' } }),
    ).rejects.toMatchObject({ kind: 'unauthenticated', reason: 'IMAGE_REGISTRY_UNAUTHORIZED' });
  });

  it('exchanges an identity_token at the token service (OAuth2 refresh-token grant)', async () => {
    const { service } = await fresh();
    tokenRegistry.tokenRequests.length = 0;
    const res = await service.pullImage({
      image: { image: `${tokenRegistry.host}/kata/private:1` },
      auth: { identity_token: `refresh-${user.username}` },
    });
    expect(res.image_ref).toBe(image.id);
    expect(tokenRegistry.tokenRequests).toEqual([{ scope: 'repository:kata/private:pull', user: `oauth:${user.username}` }]);
    await service.removeImage({ image: { image: image.id } });
    await expect(
      service.pullImage({ image: { image: `${tokenRegistry.host}/kata/private:1` }, auth: { identity_token: 'refresh-nobody' } }),
    ).rejects.toMatchObject({ kind: 'unauthenticated', reason: 'IMAGE_REGISTRY_UNAUTHORIZED' });
  });

  it('sends a registry_token as the bearer token without asking the token service', async () => {
    const { service } = await fresh();
    const bearer = (await tokenRegistry.pushAuthorization('kata/private'))?.slice('Bearer '.length) ?? '';
    tokenRegistry.tokenRequests.length = 0;
    const res = await service.pullImage({ image: { image: `${tokenRegistry.host}/kata/private:1` }, auth: { registry_token: bearer } });
    expect(res.image_ref).toBe(image.id);
    expect(tokenRegistry.tokenRequests).toEqual([]);
  });
});
