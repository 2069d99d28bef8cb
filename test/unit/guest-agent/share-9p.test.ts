/**
 * Which shared-directory device the guest has (guest/agent/share-9p.ts), from a sysfs-like tree:
 * virtio-fs, a 9p device with the share's tag (its mount_tag may end in a NUL), a 9p device of
 * another tag (not ours), none; and the mount arguments of each kind.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { findSharedDevice, NINEP_MOUNT_OPTIONS, sharedMountArgs } from '../../../guest/agent/share-9p.js';

describe('findSharedDevice', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-virtio-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function device(name: string, id: string, mountTag?: string): void {
    mkdirSync(path.join(dir, name));
    writeFileSync(path.join(dir, name, 'device'), `${id}\n`);
    if (mountTag !== undefined) writeFileSync(path.join(dir, name, 'mount_tag'), mountTag);
  }

  it('finds nothing in an empty or missing directory, or among other devices', async () => {
    expect(await findSharedDevice(dir, 'kata-ts-shared')).toBeUndefined();
    expect(await findSharedDevice(path.join(dir, 'missing'), 'kata-ts-shared')).toBeUndefined();
    device('virtio0', '0x0003');
    expect(await findSharedDevice(dir, 'kata-ts-shared')).toBeUndefined();
  });

  it('finds virtio-fs', async () => {
    device('virtio1', '0x001a');
    expect(await findSharedDevice(dir, 'kata-ts-shared')).toBe('virtiofs');
  });

  it('finds a 9p device with the tag only (NUL-terminated or not), not one of another tag or not bound yet', async () => {
    device('virtio2', '0x0009', 'other\0');
    device('virtio3', '0x0009');
    expect(await findSharedDevice(dir, 'kata-ts-shared')).toBeUndefined();
    device('virtio4', '0x0009', 'kata-ts-shared\0');
    expect(await findSharedDevice(dir, 'kata-ts-shared')).toBe('9p');
  });
});

describe('sharedMountArgs', () => {
  it('mounts 9p over virtio in the Linux dialect, and virtio-fs by its tag', () => {
    expect(sharedMountArgs('9p', 't', '/d')).toEqual(['-t', '9p', '-o', NINEP_MOUNT_OPTIONS, 't', '/d']);
    expect(NINEP_MOUNT_OPTIONS).toContain('trans=virtio');
    expect(NINEP_MOUNT_OPTIONS).toContain('version=9p2000.L');
    expect(sharedMountArgs('virtiofs', 't', '/d')).toEqual(['-t', 'virtiofs', 't', '/d']);
  });
});
