import { describe, expect, it } from 'vitest';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';

const line = (id: number, point: string) => `${id} 1 0:5${id} / ${point} rw,nosuid,nodev shared:${id} - tmpfs tmpfs rw`;

describe('mountsUnder', () => {
  it('lists the dir and what is below it, deepest first, stacked mounts last-mounted first', () => {
    const info = [
      line(20, '/'),
      line(21, '/var/lib/kata-ts/vm/abc/shared'),
      line(22, '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs'),
      line(23, '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs/data'),
      line(24, '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs'),
      line(25, '/var/lib/kata-ts/vm/abc/shared-other'),
      line(26, '/var/lib/kata-ts/vm/abcdef/shared'),
    ].join('\n');
    expect(mountsUnder(info, '/var/lib/kata-ts/vm/abc')).toEqual([
      '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs/data',
      '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs',
      '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs',
      '/var/lib/kata-ts/vm/abc/shared-other',
      '/var/lib/kata-ts/vm/abc/shared',
    ]);
    expect(mountsUnder(info, '/var/lib/kata-ts/vm/abc/shared/')).toEqual([
      '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs/data',
      '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs',
      '/var/lib/kata-ts/vm/abc/shared/containers/c1/rootfs',
      '/var/lib/kata-ts/vm/abc/shared',
    ]);
  });

  it('decodes the octal escapes of mount points with spaces', () => {
    expect(mountsUnder(line(30, '/s/with\\040space/x'), '/s/with space')).toEqual(['/s/with space/x']);
    expect(mountsUnder('', '/s')).toEqual([]);
  });
});
