import { describe, expect, it } from 'vitest';
import {
  containerRootfsDirs,
  MOUNT_OPTIONS_MAX_BYTES,
  OVERLAY_MAX_LOWER_LAYERS,
  planOverlayMount,
} from '../../../src/images/overlay-plan.js';

const layer = (n: number): string => `/var/lib/kata-ts/images/layers/${n.toString(16).padStart(64, '0')}`;

describe('planOverlayMount (layer chain -> mount)', () => {
  it('stacks the layers top first as short relative links, upper and work relative to the container dir', () => {
    const plan = planOverlayMount([layer(3), layer(2), layer(1)], '/s/rootfs/c1');
    expect(plan.links).toEqual([
      { name: 'l/0', target: layer(3) },
      { name: 'l/1', target: layer(2) },
      { name: 'l/2', target: layer(1) },
    ]);
    expect(plan.options).toBe('lowerdir=l/0:l/1:l/2,upperdir=upper,workdir=work');
    expect(plan.argv).toEqual(['mount', '-t', 'overlay', '-o', plan.options, '--', 'overlay', 'merged']);
    expect(plan.cwd).toBe('/s/rootfs/c1');
    expect(containerRootfsDirs('/s/rootfs/c1')).toEqual({
      dir: '/s/rootfs/c1',
      upper: '/s/rootfs/c1/upper',
      work: '/s/rootfs/c1/work',
      merged: '/s/rootfs/c1/merged',
      links: '/s/rootfs/c1/l',
    });
  });

  it("fits overlayfs's 500 layers in one page, where absolute digest paths would not fit 50", () => {
    const many = Array.from({ length: OVERLAY_MAX_LOWER_LAYERS }, (_, i) => layer(i));
    const plan = planOverlayMount(many, '/s/rootfs/c1');
    expect(Buffer.byteLength(plan.options)).toBeLessThanOrEqual(MOUNT_OPTIONS_MAX_BYTES);
    const absolute = `lowerdir=${many.slice(0, 50).join(':')}`;
    expect(Buffer.byteLength(absolute)).toBeGreaterThan(MOUNT_OPTIONS_MAX_BYTES);
  });

  it('refuses more layers than overlayfs stacks, no layers, and unusable paths, with coded errors', () => {
    const tooMany = Array.from({ length: OVERLAY_MAX_LOWER_LAYERS + 1 }, (_, i) => layer(i));
    expect(() => planOverlayMount(tooMany, '/s/rootfs/c1')).toThrow(expect.objectContaining({ reason: 'ROOTFS_TOO_MANY_LAYERS' }));
    expect(() => planOverlayMount([], '/s/rootfs/c1')).toThrow(expect.objectContaining({ reason: 'ROOTFS_NO_LAYERS' }));
    for (const bad of ['relative/layer', '/a,b', '/a:b']) {
      expect(() => planOverlayMount([bad], '/s/rootfs/c1')).toThrow(
        expect.objectContaining({ kind: 'invalid', reason: 'ROOTFS_LAYER_PATH_INVALID' }),
      );
    }
  });
});
