import { describe, expect, it } from 'vitest';
import type { Digest } from '../../../src/images/digest.js';
import { planGarbage } from '../../../src/images/store/gc.js';
import { type ImageRecord, migrateImageIndex } from '../../../src/images/store/records.js';

const d = (c: string): Digest => `sha256:${c.repeat(64 / c.length)}`;
const hex = (x: Digest): string => x.slice('sha256:'.length);

function image(id: string, layers: Array<{ blob: string; diff: string }>, unpacked: ImageRecord['unpacked'] = 'layers'): ImageRecord {
  return {
    id: d(id),
    repoTags: [],
    repoDigests: [],
    manifestDigest: d(`m${id}`),
    manifestMediaType: 'application/vnd.oci.image.manifest.v1+json',
    layers: layers.map((l) => ({ digest: d(l.blob), diffId: d(l.diff), sizeBytes: 1, mediaType: 'x' })),
    sizeBytes: 1,
    uid: null,
    username: '',
    pinned: false,
    annotations: {},
    pulledAt: '2024-01-01T00:00:00.000Z',
    unpacked,
  };
}

const none = { leased: () => false, layersInUse: new Set<string>(), includeTemp: false };

describe('planGarbage (GC decisions)', () => {
  const a = image('a', [
    { blob: '1', diff: '5' },
    { blob: '2', diff: '6' },
  ]);
  const b = image('b', [
    { blob: '1', diff: '5' },
    { blob: '3', diff: '7' },
  ]);
  const listing = {
    blobs: [d('a'), d('ma'), d('b'), d('mb'), d('1'), d('2'), d('3'), d('9')],
    rootfs: [hex(d('a')), hex(d('c'))],
    layers: [hex(d('5')), hex(d('6')), hex(d('7')), hex(d('8')), '.tmp-x', '.probe-y'],
  };

  it('keeps what an image references, a shared layer while any image has it, and removes the rest', () => {
    expect(planGarbage(listing, [a, b], none)).toEqual({
      blobs: [d('9')],
      // Layered images have no flat tree to keep.
      rootfs: [hex(d('a')), hex(d('c'))],
      layers: [hex(d('8'))],
    });
    // b removed: its own layer and blobs go, the shared base layer stays for a.
    expect(planGarbage(listing, [a], none)).toEqual({
      blobs: [d('b'), d('mb'), d('3'), d('9')],
      rootfs: [hex(d('a')), hex(d('c'))],
      layers: [hex(d('7')), hex(d('8'))],
    });
  });

  it('never removes a layer a container stacks, or anything a running pull leases', () => {
    const plan = planGarbage(listing, [], {
      leased: (k) => k === `layer:${hex(d('8'))}` || k === d('9'),
      layersInUse: new Set([hex(d('6'))]),
      includeTemp: false,
    });
    expect(plan.layers).toEqual([hex(d('5')), hex(d('7'))]);
    expect(plan.blobs).not.toContain(d('9'));
  });

  it("keeps a flat image's tree and not its layers; temp names only at start-up", () => {
    const flat = image('a', [{ blob: '1', diff: '5' }], 'flat');
    const plan = planGarbage(listing, [flat], { ...none, includeTemp: true });
    expect(plan.rootfs).toEqual([hex(d('c'))]);
    expect(plan.layers).toEqual([hex(d('5')), hex(d('6')), hex(d('7')), hex(d('8')), '.tmp-x', '.probe-y']);
    expect(planGarbage(listing, [flat], none).layers).not.toContain('.tmp-x');
  });
});

describe('image index format 1 -> 2', () => {
  it('marks every image of a format-1 index as unpacked flat and leaves the current format alone', () => {
    const v1 = { version: 1, images: [{ id: d('a'), repoTags: ['x'] }] };
    expect(migrateImageIndex(v1)).toEqual({ version: 2, images: [{ id: d('a'), repoTags: ['x'], unpacked: 'flat' }] });
    const v2 = { version: 2, images: [] };
    expect(migrateImageIndex(v2)).toBe(v2);
    expect(migrateImageIndex('junk')).toBe('junk');
  });
});
