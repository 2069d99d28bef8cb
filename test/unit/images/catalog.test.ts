import { describe, expect, it } from 'vitest';
import { filterImages, lookupImage, recordsAfterPull, toImageMessage } from '../../../src/images/catalog.js';
import type { Digest } from '../../../src/images/digest.js';
import type { ImageRecord } from '../../../src/images/store/records.js';

const id = (c: string): Digest => `sha256:${c.repeat(64 / c.length)}`;

function record(idChar: string, tags: string[], digests: string[], extra: Partial<ImageRecord> = {}): ImageRecord {
  return {
    id: id(idChar),
    repoTags: tags,
    repoDigests: digests,
    manifestDigest: id('f'),
    manifestMediaType: 'application/vnd.oci.image.manifest.v1+json',
    layers: [],
    sizeBytes: 1234,
    uid: null,
    username: '',
    pinned: false,
    annotations: {},
    pulledAt: '2024-01-01T00:00:00.000Z',
    unpacked: 'layers',
    ...extra,
  };
}

const busybox = record(
  'a',
  ['docker.io/library/busybox:latest', 'docker.io/library/busybox:1.36'],
  [`docker.io/library/busybox@${id('1')}`],
);
const app = record('b', ['localhost:5000/app:v1'], [`localhost:5000/app@${id('2')}`], { uid: 1000 });
const alsoA = record('ab', [], []);
const records = [busybox, app, alsoA];

describe('lookupImage', () => {
  it.each([
    ['busybox', 'a', 'tag'],
    ['busybox:1.36', 'a', 'tag'],
    ['docker.io/library/busybox:latest', 'a', 'tag'],
    [`busybox@${id('1')}`, 'a', 'digest'],
    [id('a'), 'a', 'id'],
    ['a'.repeat(64), 'a', 'id'],
    ['localhost:5000/app:v1', 'b', 'tag'],
    ['bbbbbbbbbbbb', 'b', 'id'],
    ['sha256:bbbb', 'b', 'id'],
  ])('%s -> image %s by %s', (input, idChar, by) => {
    const m = lookupImage(records, input);
    expect(m?.record.id).toBe(id(idChar));
    expect(m?.by).toBe(by);
  });

  it('finds nothing for unknown names, ambiguous prefixes and empty input', () => {
    expect(lookupImage(records, 'busybox:9')).toBeUndefined();
    expect(lookupImage(records, 'a')).toBeUndefined(); // prefix of both aaaa… and abab…
    expect(lookupImage(records, '')).toBeUndefined();
    expect(lookupImage(records, 'NOT A REF')).toBeUndefined();
  });
});

describe('filterImages', () => {
  it('lists all, every tag of a bare repository, or the one image named', () => {
    expect(filterImages(records, '')).toHaveLength(3);
    expect(filterImages(records, 'busybox').map((r) => r.id)).toEqual([id('a')]);
    expect(filterImages(records, 'localhost:5000/app').map((r) => r.id)).toEqual([id('b')]);
    expect(filterImages(records, 'localhost:5000/app:v2')).toEqual([]);
    expect(filterImages(records, id('ab')).map((r) => r.id)).toEqual([id('ab')]);
  });
});

describe('toImageMessage', () => {
  it('has the proto-loader shape: snake_case, uint64 as string, Int64Value uid, full spec', () => {
    expect(toImageMessage(app)).toEqual({
      id: id('b'),
      repo_tags: ['localhost:5000/app:v1'],
      repo_digests: [`localhost:5000/app@${id('2')}`],
      size: '1234',
      uid: { value: '1000' },
      username: '',
      spec: { image: id('b'), annotations: {}, user_specified_image: '', runtime_handler: '', image_ref: '' },
      pinned: false,
    });
    expect(toImageMessage(busybox).uid).toBeNull();
  });
});

describe('recordsAfterPull', () => {
  const facts = {
    id: id('c'),
    manifestDigest: id('d'),
    manifestMediaType: 'm',
    layers: [],
    sizeBytes: 9,
    uid: 0,
    username: '',
    unpacked: 'layers' as const,
  };
  const now = new Date('2024-02-02T00:00:00Z');

  it('adds a new image, moving the tag away from the image that held it', () => {
    const { records: next, record } = recordsAfterPull(
      records,
      facts,
      { tag: 'docker.io/library/busybox:latest', digest: `docker.io/library/busybox@${id('3')}` },
      { a: 'b' },
      new Set(['docker.io/library/busybox:latest']),
      now,
    );
    expect(record).toMatchObject({
      id: id('c'),
      repoTags: ['docker.io/library/busybox:latest'],
      pinned: true,
      annotations: { a: 'b' },
      pulledAt: now.toISOString(),
    });
    expect(next.find((r) => r.id === id('a'))?.repoTags).toEqual(['docker.io/library/busybox:1.36']);
    expect(records[0]?.repoTags).toHaveLength(2); // the input is not mutated
  });

  it('adds names to an existing image without duplicates', () => {
    const again = recordsAfterPull(
      records,
      { ...facts, id: id('a') },
      { tag: 'docker.io/library/busybox:1.36', digest: `docker.io/library/busybox@${id('1')}` },
      {},
      new Set(),
      now,
    );
    expect(again.records).toHaveLength(3);
    expect(again.record.repoTags).toEqual(busybox.repoTags);
    expect(again.record.repoDigests).toEqual(busybox.repoDigests);
    expect(again.record.pulledAt).toBe(busybox.pulledAt);
  });
});
