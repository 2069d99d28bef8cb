import { describe, expect, it } from 'vitest';
import { submountRemounts } from '../../../src/runtime/container/shared-dir.js';

const line = (id: number, point: string, flags: string) => `${id} 1 0:5${id} / ${point} ${flags} shared:${id} - tmpfs tmpfs rw`;

describe('submountRemounts', () => {
  const at = '/s/containers/c1/mounts/0';
  const info = [
    line(20, '/', 'rw,relatime'),
    line(21, at, 'rw,nosuid,nodev,relatime'),
    line(22, `${at}/a`, 'rw,relatime'),
    line(23, `${at}/a/b`, 'ro,noexec,noatime'),
    line(24, `${at}/a`, 'rw,nosymfollow,strictatime'),
    line(25, '/s/containers/c1/mounts/01', 'rw'),
    line(26, `${at}/with\\040space`, 'rw,nodiratime'),
  ].join('\n');

  it('makes every mount below the bind nodev,nosuid, keeping its ro, noexec and atime flags, each point once (deepest first)', () => {
    expect(submountRemounts(info, at, false)).toEqual([
      { point: `${at}/a/b`, options: 'remount,bind,nodev,nosuid,ro,noexec,noatime' },
      { point: `${at}/with space`, options: 'remount,bind,nodev,nosuid,nodiratime' },
      { point: `${at}/a`, options: 'remount,bind,nodev,nosuid,nosymfollow,strictatime' },
    ]);
  });

  it('adds ro to each for a recursive read-only volume, once', () => {
    expect(submountRemounts(info, at, true).map((r) => r.options)).toEqual([
      'remount,bind,nodev,nosuid,ro,noexec,noatime',
      'remount,bind,nodev,nosuid,ro,nodiratime',
      'remount,bind,nodev,nosuid,ro,nosymfollow,strictatime',
    ]);
  });

  it('has nothing to do without mounts below the bind', () => {
    expect(submountRemounts(line(21, at, 'rw'), at, false)).toEqual([]);
  });
});
