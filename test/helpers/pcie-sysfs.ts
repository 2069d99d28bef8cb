/**
 * Builds sysfs + /dev fixture trees for the PCIe inventory from small JSON specs
 * (fixtures/sysfs/<name>.tree.json), laid out as Linux does:
 *   sys/devices/pci<dom>:<bus>/<bridge>/<bdf>/{class,vendor,device,config,resource,numa_node}
 *   sys/devices/.../<bdf>/{driver,iommu_group,physfn} links, vfio-dev/vfioN/dev
 *   sys/bus/pci/devices/<bdf> -> ../../../devices/...
 *   sys/kernel/iommu_groups/<g>/devices/<bdf> -> ../../../../devices/...
 *   sys/dev/char/<major>:<minor> -> ../../devices/virtual/vfio/<g> | .../vfio-dev/vfioN | .../misc/vfio
 *   dev/vfio/{vfio,<g>,devices/vfioN}: empty files (git cannot hold device nodes) whose numbers
 *   are in dev-numbers.json: the documented indirection readHostInventory's devNumbersFile takes.
 *
 * Run `npx tsx test/helpers/pcie-sysfs.ts` to regenerate fixtures/sysfs/<name>/ from the specs.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export interface FixtureBar {
  index: number;
  bytes: number;
  kind: 'io' | 'mem';
  pref?: boolean;
  is64?: boolean;
}

export interface FixtureFunction {
  bdf: string;
  class: string; // "0x030200"
  vendor: string; // "0x10de"
  device: string;
  driver?: string | null;
  numa?: number;
  /** Conventional PCI (256-byte config space) when false. Default true. */
  pcie?: boolean;
  bars?: FixtureBar[];
  romBytes?: number;
  group?: number | null;
  parent?: string | null;
  physfn?: string;
  /** N of /dev/vfio/devices/vfioN (iommufd character device); only for vfio-pci functions. */
  vfioCdev?: number;
}

export interface FixtureSriov {
  pf: string;
  count: number;
  /** First VF routing-id offset and stride from the PF (SR-IOV capability). */
  offset: number;
  stride: number;
  vendor: string;
  device: string;
  class: string;
  driver: string | null;
  firstGroup: number;
  firstCdev?: number;
  numa?: number;
  bars: FixtureBar[];
}

export interface FixtureTreeSpec {
  description: string;
  iommu: boolean;
  functions: FixtureFunction[];
  sriov?: FixtureSriov[];
  /** Legacy group nodes to create even though no member is bound to vfio-pci (stale nodes). */
  extraGroupNodes?: number[];
  /** No-IOMMU group nodes (/dev/vfio/noiommu-N). */
  noiommuGroups?: number[];
}

const VFIO_GROUP_MAJOR = 243;
const VFIO_CDEV_MAJOR = 511;

function hex(n: bigint | number, width = 16): string {
  return `0x${n.toString(16).padStart(width, '0')}`;
}

function parseBdf(bdf: string): { domain: number; bus: number; devfn: number } {
  const m = /^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$/.exec(bdf);
  if (!m) throw new Error(`bad BDF ${bdf}`);
  return { domain: parseInt(m[1]!, 16), bus: parseInt(m[2]!, 16), devfn: (parseInt(m[3]!, 16) << 3) | parseInt(m[4]!, 16) };
}

function bdfOf(domain: number, bus: number, devfn: number): string {
  return `${domain.toString(16).padStart(4, '0')}:${bus.toString(16).padStart(2, '0')}:${(devfn >> 3).toString(16).padStart(2, '0')}.${devfn & 7}`;
}

/** Expand SR-IOV shorthands into explicit VF functions. */
export function expandSpec(spec: FixtureTreeSpec): FixtureFunction[] {
  const fns = [...spec.functions];
  for (const s of spec.sriov ?? []) {
    const pf = parseBdf(s.pf);
    for (let i = 0; i < s.count; i++) {
      const rid = (pf.bus << 8) + pf.devfn + s.offset + i * s.stride;
      fns.push({
        bdf: bdfOf(pf.domain, rid >> 8, rid & 0xff),
        class: s.class,
        vendor: s.vendor,
        device: s.device,
        driver: s.driver,
        numa: s.numa ?? -1,
        bars: s.bars,
        group: s.firstGroup + i,
        parent: spec.functions.find((f) => f.bdf === s.pf)?.parent ?? null,
        physfn: s.pf,
        ...(s.firstCdev === undefined ? {} : { vfioCdev: s.firstCdev + i }),
      });
    }
  }
  return fns;
}

/** sysfs `resource`: 13 lines for endpoints (BARs, ROM, SR-IOV), 17 for bridges (+ windows). */
function resourceText(f: FixtureFunction, alloc: { mem32: bigint; mem64: bigint; io: bigint }): string {
  const isBridge = f.class.startsWith('0x0604');
  const lines: string[] = [];
  const total = isBridge ? 17 : 13;
  const take = (kind: 'mem32' | 'mem64' | 'io', bytes: bigint): bigint => {
    const start = ((alloc[kind] + bytes - 1n) / bytes) * bytes;
    alloc[kind] = start + bytes;
    return start;
  };
  for (let i = 0; i < total; i++) {
    const bar = f.bars?.find((b) => b.index === i);
    if (i === 6 && f.romBytes) {
      const size = BigInt(f.romBytes);
      const start = take('mem32', size);
      lines.push(`${hex(start)} ${hex(start + size - 1n)} ${hex(0x46200)}`);
    } else if (bar !== undefined && i < 6) {
      const size = BigInt(bar.bytes);
      let flags: number;
      let start: bigint;
      if (bar.kind === 'io') {
        flags = 0x40101;
        start = take('io', size);
      } else {
        flags = 0x40200 | (bar.pref ? 0x2000 | 0x08 : 0) | (bar.is64 ? 0x100000 | 0x04 : 0);
        start = take(bar.is64 && bar.pref ? 'mem64' : 'mem32', size);
      }
      lines.push(`${hex(start)} ${hex(start + size - 1n)} ${hex(flags)}`);
    } else {
      lines.push(`${hex(0)} ${hex(0)} ${hex(0)}`);
    }
  }
  return `${lines.join('\n')}\n`;
}

function configBytes(f: FixtureFunction): Buffer {
  const buf = Buffer.alloc(f.pcie === false ? 256 : 4096);
  buf.writeUInt16LE(parseInt(f.vendor, 16), 0);
  buf.writeUInt16LE(parseInt(f.device, 16), 2);
  const cls = parseInt(f.class, 16);
  buf.writeUInt8(cls & 0xff, 9);
  buf.writeUInt8((cls >> 8) & 0xff, 10);
  buf.writeUInt8((cls >> 16) & 0xff, 11);
  return buf;
}

async function link(target: string, at: string): Promise<void> {
  await fsp.mkdir(path.dirname(at), { recursive: true });
  await fsp.symlink(path.relative(path.dirname(at), target), at);
}

async function write(file: string, data: string | Buffer): Promise<void> {
  await fsp.mkdir(path.dirname(file), { recursive: true });
  await fsp.writeFile(file, data);
}

/** Build `<out>/sys`, `<out>/dev` and `<out>/dev-numbers.json` for a spec. `out` must not exist. */
export async function buildSysfsTree(spec: FixtureTreeSpec, out: string): Promise<void> {
  const sys = path.join(out, 'sys');
  const dev = path.join(out, 'dev');
  await fsp.mkdir(path.join(sys, 'bus/pci/devices'), { recursive: true });
  await fsp.mkdir(path.join(dev, 'vfio'), { recursive: true });
  const fns = expandSpec(spec);
  const byBdf = new Map(fns.map((f) => [f.bdf, f]));
  const numbers: Record<string, string> = {};
  const dirOf = (f: FixtureFunction): string => {
    const chain: FixtureFunction[] = [f];
    for (let p = f.parent; p; p = byBdf.get(p)?.parent) {
      const pf = byBdf.get(p);
      if (!pf) throw new Error(`parent ${p} of ${f.bdf} is not in the spec`);
      chain.unshift(pf);
    }
    const top = parseBdf(chain[0]!.bdf);
    const root = `pci${top.domain.toString(16).padStart(4, '0')}:${top.bus.toString(16).padStart(2, '0')}`;
    return path.join(sys, 'devices', root, ...chain.map((c) => c.bdf));
  };
  const alloc = { mem32: 0xe000_0000n, mem64: 0x2000_0000_0000n, io: 0x3000n };
  const groups = new Map<number, FixtureFunction[]>();
  for (const f of fns) {
    const dir = dirOf(f);
    await write(path.join(dir, 'class'), `${f.class}\n`);
    await write(path.join(dir, 'vendor'), `${f.vendor}\n`);
    await write(path.join(dir, 'device'), `${f.device}\n`);
    await write(path.join(dir, 'numa_node'), `${f.numa ?? -1}\n`);
    await write(path.join(dir, 'config'), configBytes(f));
    await write(path.join(dir, 'resource'), resourceText(f, alloc));
    await link(dir, path.join(sys, 'bus/pci/devices', f.bdf));
    if (f.driver) {
      const drv = path.join(sys, 'bus/pci/drivers', f.driver);
      await write(path.join(drv, 'bind'), '');
      await link(drv, path.join(dir, 'driver'));
    }
    if (f.physfn) await link(dirOf(byBdf.get(f.physfn)!), path.join(dir, 'physfn'));
    if (spec.iommu && f.group !== undefined && f.group !== null) {
      const g = path.join(sys, 'kernel/iommu_groups', String(f.group));
      await link(g, path.join(dir, 'iommu_group'));
      await link(dir, path.join(g, 'devices', f.bdf));
      await write(path.join(g, 'type'), 'DMA\n');
      groups.set(f.group, [...(groups.get(f.group) ?? []), f]);
    }
    if (f.vfioCdev !== undefined) {
      const cdevDir = path.join(dir, 'vfio-dev', `vfio${f.vfioCdev}`);
      const num = `${VFIO_CDEV_MAJOR}:${f.vfioCdev}`;
      await write(path.join(cdevDir, 'dev'), `${num}\n`);
      await link(cdevDir, path.join(sys, 'dev/char', num));
      await write(path.join(dev, 'vfio/devices', `vfio${f.vfioCdev}`), '');
      numbers[`vfio/devices/vfio${f.vfioCdev}`] = num;
    }
  }
  // The VFIO container node exists once vfio is loaded, IOMMU or not.
  const misc = path.join(sys, 'devices/virtual/misc/vfio');
  await write(path.join(misc, 'dev'), '10:196\n');
  await link(misc, path.join(sys, 'dev/char/10:196'));
  await write(path.join(dev, 'vfio/vfio'), '');
  numbers['vfio/vfio'] = '10:196';
  // A legacy group node exists while a member is bound to vfio-pci; minors follow creation order.
  const nodeGroups = [...groups.entries()]
    .filter(([, members]) => members.some((m) => m.driver === 'vfio-pci'))
    .map(([g]) => g)
    .concat(spec.extraGroupNodes ?? [])
    .sort((a, b) => a - b);
  let minor = 0;
  for (const g of nodeGroups) {
    const num = `${VFIO_GROUP_MAJOR}:${minor++}`;
    const v = path.join(sys, 'devices/virtual/vfio', String(g));
    await write(path.join(v, 'dev'), `${num}\n`);
    await link(v, path.join(sys, 'dev/char', num));
    await write(path.join(dev, 'vfio', String(g)), '');
    numbers[`vfio/${g}`] = num;
  }
  for (const g of spec.noiommuGroups ?? []) {
    const num = `${VFIO_GROUP_MAJOR}:${minor++}`;
    const v = path.join(sys, 'devices/virtual/vfio', `noiommu-${g}`);
    await write(path.join(v, 'dev'), `${num}\n`);
    await link(v, path.join(sys, 'dev/char', num));
    await write(path.join(dev, 'vfio', `noiommu-${g}`), '');
    numbers[`vfio/noiommu-${g}`] = num;
  }
  const sorted = Object.fromEntries(Object.entries(numbers).sort(([a], [b]) => (a < b ? -1 : 1)));
  await fsp.writeFile(path.join(out, 'dev-numbers.json'), `${JSON.stringify(sorted, null, 2)}\n`);
}

export const FIXTURES_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../fixtures');
export const SYSFS_FIXTURES = path.join(FIXTURES_DIR, 'sysfs');

/** Names of the committed trees (fixtures/sysfs/<name>.tree.json). */
export async function fixtureTreeNames(): Promise<string[]> {
  return (await fsp.readdir(SYSFS_FIXTURES))
    .filter((n) => n.endsWith('.tree.json'))
    .map((n) => n.slice(0, -'.tree.json'.length))
    .sort();
}

export async function readTreeSpec(name: string): Promise<FixtureTreeSpec> {
  return JSON.parse(await fsp.readFile(path.join(SYSFS_FIXTURES, `${name}.tree.json`), 'utf8')) as FixtureTreeSpec;
}

/** readHostInventory options for a committed tree. */
export function fixtureInventoryOptions(name: string): { sysfsRoot: string; devRoot: string; devNumbersFile: string } {
  const root = path.join(SYSFS_FIXTURES, name);
  return { sysfsRoot: path.join(root, 'sys'), devRoot: path.join(root, 'dev'), devNumbersFile: path.join(root, 'dev-numbers.json') };
}

async function regenerate(): Promise<void> {
  for (const name of await fixtureTreeNames()) {
    const out = path.join(SYSFS_FIXTURES, name);
    await fsp.rm(out, { recursive: true, force: true });
    await buildSysfsTree(await readTreeSpec(name), out);
    console.log(`fixtures/sysfs/${name}/ regenerated`);
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  await regenerate();
}
