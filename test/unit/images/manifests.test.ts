import { describe, expect, it } from 'vitest';
import { imageUser, MEDIA_TYPES, parseImageConfig, parseManifestDocument, selectPlatform } from '../../../src/images/registry/manifests.js';

const d = (c: string): string => `sha256:${c.repeat(64)}`;
const json = (v: unknown): Buffer => Buffer.from(JSON.stringify(v));

const manifest = {
  schemaVersion: 2,
  mediaType: MEDIA_TYPES.ociManifest,
  config: { mediaType: MEDIA_TYPES.ociConfig, digest: d('c'), size: 10 },
  layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd', digest: d('1'), size: 5 }],
  annotations: { 'unknown.fields': 'are tolerated' },
  subject: { mediaType: MEDIA_TYPES.ociManifest, digest: d('9'), size: 1 },
};

describe('manifest documents', () => {
  it('classifies OCI and Docker manifests and indexes, by mediaType or Content-Type', () => {
    expect(parseManifestDocument(json(manifest), '', 'm')).toMatchObject({ kind: 'manifest', manifest: { layers: [{ digest: d('1') }] } });
    const { mediaType: _m, ...untyped } = manifest;
    expect(parseManifestDocument(json(untyped), `${MEDIA_TYPES.dockerManifest}; charset=utf-8`, 'm')).toMatchObject({
      kind: 'manifest',
      manifest: { mediaType: MEDIA_TYPES.dockerManifest },
    });
    const index = {
      schemaVersion: 2,
      manifests: [{ mediaType: MEDIA_TYPES.ociManifest, digest: d('a'), size: 3, platform: { os: 'linux', architecture: 'amd64' } }],
    };
    expect(parseManifestDocument(json(index), MEDIA_TYPES.dockerManifestList, 'i')).toMatchObject({ kind: 'index' });
    expect(parseManifestDocument(json(index), '', 'i')).toMatchObject({ kind: 'index' });
  });

  it('refuses schema 1, artifacts, non-filesystem layers, bad digests and non-JSON', () => {
    expect(() => parseManifestDocument(json({ schemaVersion: 1, name: 'x' }), MEDIA_TYPES.dockerSchema1Signed, 'm')).toThrow(
      expect.objectContaining({ kind: 'unimplemented', reason: 'IMAGE_MANIFEST_UNSUPPORTED' }),
    );
    const artifact = { ...manifest, config: { ...manifest.config, mediaType: 'application/vnd.cncf.helm.config.v1+json' } };
    expect(() => parseManifestDocument(json(artifact), '', 'm')).toThrow(
      expect.objectContaining({ reason: 'IMAGE_NOT_A_CONTAINER_IMAGE' }),
    );
    const helmLayer = {
      ...manifest,
      layers: [{ mediaType: 'application/vnd.cncf.helm.chart.content.v1.tar+gzip', digest: d('1'), size: 1 }],
    };
    expect(() => parseManifestDocument(json(helmLayer), '', 'm')).toThrow(expect.objectContaining({ reason: 'IMAGE_LAYER_UNSUPPORTED' }));
    const sha512 = { ...manifest, layers: [{ ...manifest.layers[0], digest: `sha512:${'a'.repeat(128)}` }] };
    expect(() => parseManifestDocument(json(sha512), '', 'm')).toThrow(expect.objectContaining({ reason: 'IMAGE_DIGEST_UNSUPPORTED' }));
    expect(() => parseManifestDocument(Buffer.from('<html>'), 'text/html', 'm')).toThrow(
      expect.objectContaining({ reason: 'IMAGE_MANIFEST_INVALID' }),
    );
    expect(() => parseManifestDocument(json({ ...manifest, layers: 'x' }), '', 'm')).toThrow(
      expect.objectContaining({ reason: 'IMAGE_MANIFEST_INVALID' }),
    );
  });

  it('selects linux/amd64 from an index, skipping attestations, and says what is offered otherwise', () => {
    const index = {
      mediaType: MEDIA_TYPES.ociIndex,
      manifests: [
        {
          mediaType: MEDIA_TYPES.ociManifest,
          digest: d('0') as `sha256:${string}`,
          size: 1,
          platform: { os: 'unknown', architecture: 'unknown' },
        },
        {
          mediaType: MEDIA_TYPES.ociManifest,
          digest: d('1') as `sha256:${string}`,
          size: 1,
          platform: { os: 'linux', architecture: 'arm64', variant: 'v8' },
        },
        {
          mediaType: MEDIA_TYPES.ociManifest,
          digest: d('2') as `sha256:${string}`,
          size: 1,
          platform: { os: 'linux', architecture: 'amd64' },
        },
      ],
    };
    expect(selectPlatform(index, { os: 'linux', architecture: 'amd64' }, 'idx').digest).toBe(d('2'));
    expect(selectPlatform(index, { os: 'linux', architecture: 'arm64', variant: 'v8' }, 'idx').digest).toBe(d('1'));
    expect(() => selectPlatform(index, { os: 'linux', architecture: 's390x' }, 'idx')).toThrow(
      /unknown\/unknown, linux\/arm64, linux\/amd64/,
    );
  });
});

describe('image config', () => {
  it('checks diff_ids against the layer count', () => {
    const cfg = { architecture: 'amd64', os: 'linux', rootfs: { type: 'layers', diff_ids: [d('e')] }, config: { User: '1000' } };
    expect(parseImageConfig(json(cfg), 1, 'c').diffIds).toEqual([d('e')]);
    expect(() => parseImageConfig(json(cfg), 2, 'c')).toThrow(expect.objectContaining({ reason: 'IMAGE_CONFIG_INVALID' }));
    expect(() => parseImageConfig(json({ config: null }), 0, 'c')).toThrow(expect.objectContaining({ reason: 'IMAGE_CONFIG_INVALID' }));
  });

  it.each([
    ['', null, ''],
    ['1000', 1000, ''],
    ['1000:1000', 1000, ''],
    ['0', 0, ''],
    ['app', null, 'app'],
    ['app:staff', null, 'app'],
  ])('USER %j is uid %j / username %j', (user, uid, username) => {
    expect(imageUser({ rootfs: { type: 'layers', diff_ids: [] }, config: { User: user } })).toEqual({ uid, username });
  });
});
