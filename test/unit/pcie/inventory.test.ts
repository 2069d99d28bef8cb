import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { classifyCharLink, decodeDevT, type HostInventory, parseResource, readHostInventory } from '../../../src/pcie/index.js';
import { GiB, MiB } from '../../../src/pcie/pci.js';
import { buildSysfsTree, fixtureInventoryOptions, fixtureTreeNames, readTreeSpec, SYSFS_FIXTURES } from '../../helpers/pcie-sysfs.js';

const fn = (inv: HostInventory, bdf: string) => {
  const f = inv.functions.find((x) => x.bdf === bdf);
  if (f === undefined) throw new Error(`${bdf} missing`);
  return f;
};

const tmpDirs: string[] = [];
afterEach(async () => {
  for (const d of tmpDirs.splice(0)) await fsp.rm(d, { recursive: true, force: true });
});

/** Every file, link target and content under a tree, for comparing two trees. */
async function snapshot(root: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const walk = async (dir: string): Promise<void> => {
    for (const e of await fsp.readdir(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      const rel = path.relative(root, p);
      if (e.isSymbolicLink()) out.set(rel, `-> ${await fsp.readlink(p)}`);
      else if (e.isDirectory()) await walk(p);
      else out.set(rel, (await fsp.readFile(p)).toString('base64'));
    }
  };
  await walk(root);
  return out;
}

describe('readHostInventory on fixtures/sysfs trees', () => {
  it('gpu-audio: decodes class, ids, driver, NUMA, PCIe config size, BARs with flags, ROM, groups and VFIO nodes', async () => {
    const inv = await readHostInventory(fixtureInventoryOptions('gpu-audio'));
    expect(inv.iommuEnabled).toBe(true);
    expect(inv.warnings).toEqual([]);
    expect(inv.functions.map((f) => f.bdf)).toEqual(['0000:00:00.0', '0000:00:01.0', '0000:01:00.0', '0000:01:00.1']);
    const gpu = fn(inv, '0000:01:00.0');
    expect(gpu).toMatchObject({
      classCode: 0x030200,
      vendorId: 0x10de,
      deviceId: 0x2230,
      driver: 'vfio-pci',
      numaNode: 0,
      configSpaceBytes: 4096,
      isPcie: true,
      iommuGroup: 12,
      parentBdf: '0000:00:01.0',
      physfn: null,
      romBytes: 512 * 1024,
      vfioCdevPath: '/dev/vfio/devices/vfio0',
    });
    expect(gpu.bars).toEqual([
      { index: 0, barBytes: 16 * MiB, kind: 'mem', prefetchable: false, is64bit: false },
      { index: 1, barBytes: 32 * GiB, kind: 'mem', prefetchable: true, is64bit: true },
      { index: 3, barBytes: 32 * MiB, kind: 'mem', prefetchable: true, is64bit: true },
      { index: 5, barBytes: 128, kind: 'io', prefetchable: false, is64bit: false },
    ]);
    expect(fn(inv, '0000:00:00.0')).toMatchObject({ driver: null, isPcie: false, configSpaceBytes: 256, bars: [] });
    expect(fn(inv, '0000:00:01.0').driver).toBe('pcieport');
    expect(inv.groups.find((g) => g.id === 12)?.members).toEqual(['0000:01:00.0', '0000:01:00.1']);
    expect(inv.vfioNodes.map((n) => [n.path, `${n.major}:${n.minor}`, n.target])).toEqual([
      ['/dev/vfio/12', '243:0', { kind: 'group', group: 12 }],
      ['/dev/vfio/devices/vfio0', '511:0', { kind: 'cdev', bdf: '0000:01:00.0' }],
      ['/dev/vfio/devices/vfio1', '511:1', { kind: 'cdev', bdf: '0000:01:00.1' }],
      ['/dev/vfio/vfio', '10:196', { kind: 'container' }],
    ]);
  });

  it('bridge-group: conventional PCI functions (256-byte config) behind a PCIe-to-PCI bridge', async () => {
    const inv = await readHostInventory(fixtureInventoryOptions('bridge-group'));
    expect(fn(inv, '0000:03:00.0')).toMatchObject({ isPcie: false, configSpaceBytes: 256, parentBdf: '0000:02:00.0', iommuGroup: 8 });
    expect(fn(inv, '0000:02:00.0')).toMatchObject({ classCode: 0x060401, driver: null, isPcie: true, parentBdf: '0000:00:1c.0' });
    expect(inv.groups.find((g) => g.id === 8)?.members).toEqual(['0000:02:00.0', '0000:03:00.0', '0000:03:01.0']);
  });

  it('sriov-nic: 48 VFs with their physfn, each in its own group with an iommufd node', async () => {
    const inv = await readHostInventory(fixtureInventoryOptions('sriov-nic'));
    const vfs = inv.functions.filter((f) => f.physfn === '0000:3b:00.0');
    expect(vfs).toHaveLength(48);
    expect(vfs[0]).toMatchObject({ bdf: '0000:3b:00.2', iommuGroup: 41, vfioCdevPath: '/dev/vfio/devices/vfio0' });
    expect(vfs[47]).toMatchObject({ bdf: '0000:3b:06.1', iommuGroup: 88, vfioCdevPath: '/dev/vfio/devices/vfio47' });
    expect(fn(inv, '0000:3b:00.0')).toMatchObject({ driver: 'mlx5_core', physfn: null });
    expect(inv.vfioNodes.filter((n) => n.target.kind === 'cdev')).toHaveLength(48);
  });

  it('no-iommu: reports no IOMMU without failing the read, and the no-IOMMU group node', async () => {
    const inv = await readHostInventory(fixtureInventoryOptions('no-iommu'));
    expect(inv.iommuEnabled).toBe(false);
    expect(inv.groups).toEqual([]);
    expect(fn(inv, '0000:65:00.0')).toMatchObject({ driver: 'vfio-pci', iommuGroup: null });
    expect(inv.vfioNodes.find((n) => n.path === '/dev/vfio/noiommu-0')?.target).toEqual({ kind: 'noiommu-group', group: 0 });
  });

  it('reads the same inventory twice byte for byte (ordering does not depend on readdir order)', async () => {
    const a = await readHostInventory(fixtureInventoryOptions('hgx-8gpu'));
    const b = await readHostInventory(fixtureInventoryOptions('hgx-8gpu'));
    expect(JSON.stringify(a)).toBe(JSON.stringify(b));
    expect(a.functions.filter((f) => f.numaNode === 1).map((f) => f.bdf)).toEqual([
      '0000:99:00.0',
      '0000:9a:00.0',
      '0000:aa:00.0',
      '0000:ab:00.0',
      '0000:b9:00.0',
      '0000:ba:00.0',
      '0000:da:00.0',
      '0000:db:00.0',
    ]);
  });

  it('refuses a sysfs root that does not exist (NOT_FOUND naming it)', async () => {
    const err = await readHostInventory({ sysfsRoot: '/nonexistent/sys', devRoot: '/nonexistent/dev' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KataError);
    expect(err).toMatchObject({ kind: 'not_found', reason: 'PCIE_SYSFS_ROOT_MISSING' });
  });

  it('without the device-number file, fixture nodes are regular files: ignored with a warning (stat(2) path)', async () => {
    const opts = fixtureInventoryOptions('gpu-audio');
    const inv = await readHostInventory({ sysfsRoot: opts.sysfsRoot, devRoot: opts.devRoot });
    expect(inv.vfioNodes).toEqual([]);
    expect(inv.warnings.some((w) => w.includes('/dev/vfio/12 is not a character device'))).toBe(true);
  });

  it('reads real character devices through stat(2): /dev/null is 1:3', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-pcie-dev-'));
    tmpDirs.push(dir);
    await fsp.mkdir(path.join(dir, 'sys/dev/char'), { recursive: true });
    await fsp.mkdir(path.join(dir, 'dev/vfio'), { recursive: true });
    await fsp.symlink('../../devices/virtual/vfio/7', path.join(dir, 'sys/dev/char/1:3'));
    // A real char device node under devRoot: a symlink to /dev/null stats as 1:3.
    await fsp.symlink('/dev/null', path.join(dir, 'dev/vfio/7'));
    const inv = await readHostInventory({ sysfsRoot: path.join(dir, 'sys'), devRoot: path.join(dir, 'dev') });
    expect(inv.vfioNodes).toEqual([
      { path: '/dev/vfio/7', major: 1, minor: 3, sysfsLink: '../../devices/virtual/vfio/7', target: { kind: 'group', group: 7 } },
    ]);
  });

  it('committed fixture trees are exactly what their .tree.json specs generate', async () => {
    const names = await fixtureTreeNames();
    expect(names).toEqual(['bridge-group', 'gpu-audio', 'hgx-8gpu', 'no-iommu', 'no-vfio', 'sriov-nic']);
    for (const name of names) {
      const out = path.join(await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-pcie-tree-')), name);
      tmpDirs.push(path.dirname(out));
      await buildSysfsTree(await readTreeSpec(name), out);
      expect(await snapshot(path.join(SYSFS_FIXTURES, name)), name).toEqual(await snapshot(out));
    }
  });
});

describe('sysfs decoding helpers', () => {
  it('parseResource: flag bits from include/linux/ioport.h, empty lines skipped, ROM separate, addresses above 2^53', () => {
    const text = [
      '0x00000000fb000000 0x00000000fbffffff 0x0000000000040200',
      '0x0000380000000000 0x0000381fffffffff 0x000000000014220c', // 128 GiB, 64-bit prefetchable
      '0x0000000000000000 0x0000000000000000 0x0000000000000000',
      '0x00000000fc000000 0x00000000fc0fffff 0x0000000000042208', // 32-bit prefetchable
      '0x0000000000000000 0x0000000000000000 0x0000000000000000',
      '0x000000000000e000 0x000000000000e07f 0x0000000000040101',
      '0x00000000fd000000 0x00000000fd07ffff 0x0000000000046200',
      '0x0000000000000000 0x0000000000000000 0x0000000000000000',
    ].join('\n');
    const { bars, romBytes } = parseResource(text, '0000:01:00.0');
    expect(bars).toEqual([
      { index: 0, barBytes: 16 * MiB, kind: 'mem', prefetchable: false, is64bit: false },
      { index: 1, barBytes: 128 * GiB, kind: 'mem', prefetchable: true, is64bit: true },
      { index: 3, barBytes: MiB, kind: 'mem', prefetchable: true, is64bit: false },
      { index: 5, barBytes: 128, kind: 'io', prefetchable: false, is64bit: false },
    ]);
    expect(romBytes).toBe(512 * 1024);
  });

  it('parseResource: a malformed line becomes a warning, not a crash', () => {
    const warnings: string[] = [];
    expect(parseResource('garbage here\n', '0000:01:00.0', warnings).bars).toEqual([]);
    expect(warnings[0]).toContain('resource line 0 is malformed');
  });

  it('decodeDevT splits dev_t as glibc does (old 8-bit and new wide encodings)', () => {
    expect(decodeDevT(0x0103n)).toEqual({ major: 1, minor: 3 });
    // major 511, minor 0x12345: minor low 8 bits at 0-7, high bits at 20-31; major at 8-19.
    const rdev = (0x12345n & 0xffn) | ((0x12345n & ~0xffn) << 12n) | (511n << 8n);
    expect(decodeDevT(rdev)).toEqual({ major: 511, minor: 0x12345 });
  });

  it('classifyCharLink recognises group, iommufd, container and no-IOMMU nodes', () => {
    expect(classifyCharLink('../../devices/virtual/vfio/42')).toEqual({ kind: 'group', group: 42 });
    expect(classifyCharLink('../../devices/virtual/vfio/noiommu-3')).toEqual({ kind: 'noiommu-group', group: 3 });
    expect(classifyCharLink('../../devices/pci0000:00/0000:00:02.0/0000:01:00.0/vfio-dev/vfio5')).toEqual({
      kind: 'cdev',
      bdf: '0000:01:00.0',
    });
    expect(classifyCharLink('../../devices/virtual/misc/vfio')).toEqual({ kind: 'container' });
    expect(classifyCharLink('../../devices/virtual/tty/tty0')).toEqual({ kind: 'unknown' });
    expect(classifyCharLink(null)).toEqual({ kind: 'unknown' });
  });
});
