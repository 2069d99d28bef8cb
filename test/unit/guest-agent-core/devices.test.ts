/**
 * The agent's half of device mapping: the host's devices resolved to guest nodes in a fake
 * /sys and /dev (VFIO is faked: no VFIO hardware or guest IOMMU here; the "device nodes" are
 * symlinks to /dev/null and /dev/zero, which stat() follows), and the spec they produce (golden).
 */

import { readFileSync, writeFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, symlink } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveGuestDevices, splitDev, withGuestDevices } from '../../../guest/agent/containers/devices.js';
import type { GuestDevice, GuestDeviceKind } from '../../../src/generated/agent/agent.js';
import { rejection } from '../../helpers/kata-error.js';
import { FIXTURES_DIR } from '../../helpers/pcie-sysfs.js';

let root: string;
const roots = () => ({ sysRoot: path.join(root, 'sys'), devRoot: path.join(root, 'dev') });

beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'guest-devices-'));
  // Root port 00:08.0 -> function 01:00.0 in guest IOMMU group 7; behind a switch:
  // 00:09.0 -> upstream 02:00.0 -> downstream 03:01.0 -> function 04:00.0 in group 9 (noiommu).
  const pci = path.join(root, 'sys/devices/pci0000:00');
  const f1 = path.join(pci, '0000:00:08.0/0000:01:00.0');
  const f2 = path.join(pci, '0000:00:09.0/0000:02:00.0/0000:03:00.0', '..', '0000:03:01.0/0000:04:00.0');
  await mkdir(f1, { recursive: true });
  await mkdir(path.join(pci, '0000:00:09.0/0000:02:00.0/0000:03:00.0'), { recursive: true });
  await mkdir(f2, { recursive: true });
  await symlink('../../../../kernel/iommu_groups/7', path.join(f1, 'iommu_group'));
  await symlink('../../../../../../kernel/iommu_groups/9', path.join(f2, 'iommu_group'));
  await mkdir(path.join(root, 'dev/vfio'), { recursive: true });
  await symlink('/dev/null', path.join(root, 'dev/vfio/7'));
  await symlink('/dev/zero', path.join(root, 'dev/vfio/noiommu-9'));
  await symlink('/dev/full', path.join(root, 'dev/vfio/vfio'));
  await symlink('/dev/null', path.join(root, 'dev/fuse'));
});

afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

const device = (containerPath: string, access: string, kind: GuestDeviceKind, pciPaths: string[] = [], guestPath = ''): GuestDevice => ({
  containerPath,
  access,
  kind,
  pciPaths,
  guestPath,
});

const requests: GuestDevice[] = [
  device('/dev/vfio/vfio', 'rwm', 'GUEST_DEVICE_KIND_VFIO_CONTAINER'),
  device('/dev/vfio/12', 'rw', 'GUEST_DEVICE_KIND_VFIO_GROUP', ['08.0/00.0']),
  device('/dev/vfio/20', 'rwm', 'GUEST_DEVICE_KIND_VFIO_GROUP', ['07.0/00.0', '09.0/00.0/01.0/00.0']),
  device('/dev/fuse', 'rwm', 'GUEST_DEVICE_KIND_GUEST_NODE', [], '/dev/fuse'),
];

describe('resolveGuestDevices (fake VFIO sysfs and /dev)', () => {
  it('finds the guest group of each hot-plugged function and the node numbers', async () => {
    const resolved = await resolveGuestDevices(requests, roots());
    // /dev/null is 1:3, /dev/zero 1:5, /dev/full 1:7 on Linux.
    expect(resolved.map((d) => [d.containerPath, d.type, d.major, d.minor, d.access])).toEqual([
      ['/dev/vfio/vfio', 'c', 1, 7, 'rwm'],
      ['/dev/vfio/12', 'c', 1, 3, 'rw'],
      ['/dev/vfio/20', 'c', 1, 5, 'rwm'],
      ['/dev/fuse', 'c', 1, 3, 'rwm'],
    ]);
  });

  it('a device the guest does not have: FAILED_PRECONDITION naming it', async () => {
    const err = await rejection(
      resolveGuestDevices([device('/dev/vfio/3', 'rwm', 'GUEST_DEVICE_KIND_VFIO_GROUP', ['0a.0/00.0'])], roots()),
    );
    expect([err.kind, err.reason]).toEqual(['precondition', 'DEVICE_NOT_IN_GUEST']);
    expect(err.message).toContain('/dev/vfio/3');
  });

  it('a device without a kind (a sender that left it out): INVALID_ARGUMENT naming it', async () => {
    const err = await rejection(resolveGuestDevices([device('/dev/fuse', 'rwm', 'GUEST_DEVICE_KIND_UNSPECIFIED')], roots()));
    expect([err.kind, err.reason]).toEqual(['invalid', 'DEVICE_KIND_UNKNOWN']);
    expect(err.message).toContain('/dev/fuse');
  });

  it('no devices: nothing to look up', async () => {
    expect(await resolveGuestDevices([], roots())).toEqual([]);
  });
});

describe('withGuestDevices (golden: fixtures/guest-devices/agent-spec.json)', () => {
  it('adds the nodes and their allow rules after the deny-all, keeps other devices', async () => {
    const spec = {
      process: { args: ['sh'], cwd: '/' },
      linux: {
        devices: [{ path: '/dev/fuse', type: 'c', major: 10, minor: 229 }],
        resources: { devices: [{ allow: false, access: 'rwm' }], memory: { limit: 1 } },
      },
    };
    const resolved = (await resolveGuestDevices(requests, roots())).map((d) => ({
      ...d,
      uid: 0,
      gid: 0,
      fileMode: 0o666,
    }));
    const out = withGuestDevices(spec, resolved);
    const file = path.join(FIXTURES_DIR, 'guest-devices', 'agent-spec.json');
    const actual = `${JSON.stringify(out.linux, null, 2)}\n`;
    if (process.env.UPDATE_GOLDENS === '1') writeFileSync(file, actual);
    expect(actual).toBe(readFileSync(file, 'utf8'));
    expect(withGuestDevices(spec, [])).toBe(spec);
  });

  it('splits dev_t as glibc does (large majors and minors)', () => {
    expect(splitDev(0x0103)).toEqual({ major: 1, minor: 3 });
    // major 0x123, minor 0x45678: minor low byte | (minor >> 8) << 20 | major << 8
    const major = 0x123;
    const minor = 0x45678;
    const dev = (minor & 0xff) + ((major & 0xfff) << 8) + (minor >> 8) * 2 ** 20;
    expect(splitDev(dev)).toEqual({ major, minor });
  });
});
