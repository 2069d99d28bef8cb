import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, internal, notFound } from '../common/errors.js';
import { isDirectory } from '../common/fsutil.js';
import { type DeviceNumberLookup, deviceNumbersFromFile, statDeviceNumbers } from './devnodes.js';
import {
  CONVENTIONAL_CONFIG_BYTES,
  compareBdf,
  IORESOURCE_IO,
  IORESOURCE_MEM,
  IORESOURCE_MEM_64,
  IORESOURCE_PREFETCH,
  isBdf,
} from './pci.js';
import type { HostInventory, IommuGroup, PciBar, PciFunction, VfioDevNode, VfioNodeTarget } from './types.js';

export interface HostInventoryOptions {
  /** Default `/sys`. */
  sysfsRoot?: string;
  /** Default `/dev`. */
  devRoot?: string;
  /**
   * Fixture indirection (see devnodes.ts): a JSON file giving major:minor for each node under
   * devRoot, because git cannot store device nodes. Null/absent = stat(2) the nodes (real hosts).
   */
  devNumbersFile?: string | null;
  /** Overrides devNumbersFile; for tests that build trees in code. */
  deviceNumbers?: DeviceNumberLookup;
}

/**
 * The ONE read of the host's PCI/VFIO state; everything after it is pure. Reads every function
 * under `bus/pci/devices`, the IOMMU groups under `kernel/iommu_groups`, and resolves the VFIO
 * nodes under `<devRoot>/vfio` through `<sysfsRoot>/dev/char/<major>:<minor>`.
 *
 * A missing IOMMU is not an error here (a pod without devices runs fine on such a host); the
 * planners refuse when a device is actually requested.
 */
export async function readHostInventory(options: HostInventoryOptions = {}): Promise<HostInventory> {
  const sysfsRoot = options.sysfsRoot ?? '/sys';
  const devRoot = options.devRoot ?? '/dev';
  if (!(await isDirectory(sysfsRoot))) {
    throw notFound('PCIE_SYSFS_ROOT_MISSING', `sysfs root ${sysfsRoot} is not a directory`);
  }
  const lookup =
    options.deviceNumbers ?? (options.devNumbersFile ? await deviceNumbersFromFile(options.devNumbersFile) : statDeviceNumbers);
  const warnings: string[] = [];

  const devicesDir = path.join(sysfsRoot, 'bus/pci/devices');
  const bdfs = (await listDir(devicesDir)).filter(isBdf);
  if (bdfs.length === 0) warnings.push(`no PCI functions under ${devicesDir}`);
  const functions = (await Promise.all(bdfs.map((bdf) => readFunction(devicesDir, bdf, warnings)))).filter(
    (f): f is PciFunction => f !== undefined,
  );
  functions.sort((a, b) => compareBdf(a.bdf, b.bdf));

  const groups = await readGroups(sysfsRoot);
  const vfioNodes = await readVfioNodes(sysfsRoot, devRoot, lookup, warnings);
  return { sysfsRoot, devRoot, iommuEnabled: groups.length > 0, functions, groups, vfioNodes, warnings };
}

async function listDir(dir: string): Promise<string[]> {
  try {
    return (await fsp.readdir(dir)).sort();
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'ENOTDIR') return [];
    throw internal('PCIE_SYSFS_UNREADABLE', `cannot list ${dir}`, { cause: err });
  }
}

async function readTrimmed(file: string): Promise<string | undefined> {
  try {
    return (await fsp.readFile(file, 'utf8')).trim();
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw internal('PCIE_SYSFS_UNREADABLE', `cannot read ${file}`, { cause: err });
  }
}

async function linkBase(link: string): Promise<string | null> {
  try {
    return path.basename(await fsp.readlink(link));
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'EINVAL') return null;
    throw internal('PCIE_SYSFS_UNREADABLE', `cannot read link ${link}`, { cause: err });
  }
}

function parseHex(text: string | undefined): number | undefined {
  if (text === undefined || !/^0x[0-9a-fA-F]+$/.test(text)) return undefined;
  return Number.parseInt(text.slice(2), 16);
}

async function readFunction(devicesDir: string, bdf: string, warnings: string[]): Promise<PciFunction | undefined> {
  const dir = path.join(devicesDir, bdf);
  const [classText, vendorText, deviceText] = await Promise.all(['class', 'vendor', 'device'].map((f) => readTrimmed(path.join(dir, f))));
  const classCode = parseHex(classText);
  const vendorId = parseHex(vendorText);
  const deviceId = parseHex(deviceText);
  if (classCode === undefined || vendorId === undefined || deviceId === undefined) {
    warnings.push(`PCI function ${bdf} skipped: class/vendor/device unreadable under ${dir}`);
    return undefined;
  }
  const [driver, group, physfn, numaText, resourceText, configBytes, parentBdf, cdevs] = await Promise.all([
    linkBase(path.join(dir, 'driver')),
    linkBase(path.join(dir, 'iommu_group')),
    linkBase(path.join(dir, 'physfn')),
    readTrimmed(path.join(dir, 'numa_node')),
    readTrimmed(path.join(dir, 'resource')),
    configSize(path.join(dir, 'config')),
    parentOf(dir),
    listDir(path.join(dir, 'vfio-dev')),
  ]);
  if (configBytes === undefined) warnings.push(`PCI function ${bdf} has no readable config file`);
  const numa = numaText === undefined ? -1 : Number.parseInt(numaText, 10);
  const { bars, romBytes } = parseResource(resourceText ?? '', bdf, warnings);
  const cdev = cdevs.find((n) => /^vfio\d+$/.test(n));
  return {
    bdf,
    classCode,
    vendorId,
    deviceId,
    driver,
    numaNode: Number.isInteger(numa) && numa >= 0 ? numa : null,
    configSpaceBytes: configBytes ?? 0,
    isPcie: (configBytes ?? 0) > CONVENTIONAL_CONFIG_BYTES,
    bars,
    romBytes,
    iommuGroup: group !== null && /^\d+$/.test(group) ? Number(group) : null,
    parentBdf,
    physfn: physfn !== null && isBdf(physfn) ? physfn : null,
    vfioCdevPath: cdev === undefined ? null : `/dev/vfio/devices/${cdev}`,
  };
}

async function configSize(file: string): Promise<number | undefined> {
  try {
    return (await fsp.stat(file)).size;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw internal('PCIE_SYSFS_UNREADABLE', `cannot stat ${file}`, { cause: err });
  }
}

/** The upstream bridge: sysfs nests a function's directory inside its parent bridge's. */
async function parentOf(dir: string): Promise<string | null> {
  try {
    const parent = path.basename(path.dirname(await fsp.realpath(dir)));
    return isBdf(parent) ? parent : null;
  } catch {
    return null;
  }
}

/**
 * Parse sysfs `resource`: one `start end flags` line (hex) per resource; lines 0-5 are the BARs,
 * line 6 the expansion ROM, later lines bridge windows / SR-IOV BARs (not ours to size). The
 * addresses can exceed 2^53, so they are parsed as bigint; sizes always fit a number.
 */
export function parseResource(text: string, bdf: string, warnings: string[] = []): { bars: PciBar[]; romBytes: number } {
  const bars: PciBar[] = [];
  let romBytes = 0;
  const lines = text.split('\n').filter((l) => l.trim() !== '');
  for (const [index, line] of lines.slice(0, 7).entries()) {
    const cols = line.trim().split(/\s+/);
    if (cols.length !== 3 || !cols.every((c) => /^0x[0-9a-fA-F]+$/.test(c))) {
      warnings.push(`PCI function ${bdf}: resource line ${index} is malformed: "${line.trim()}"`);
      continue;
    }
    const [start, end, flags] = cols.map((c) => BigInt(c)) as [bigint, bigint, bigint];
    if (start === 0n && end === 0n) continue;
    const size = end - start + 1n;
    if (size <= 0n) continue;
    const f = Number(flags & 0xffffffffn);
    const barBytes = Number(size);
    if (index === 6) {
      romBytes = barBytes;
      continue;
    }
    if ((f & IORESOURCE_IO) !== 0) {
      bars.push({ index, barBytes, kind: 'io', prefetchable: false, is64bit: false });
    } else if ((f & IORESOURCE_MEM) !== 0) {
      bars.push({
        index,
        barBytes,
        kind: 'mem',
        prefetchable: (f & IORESOURCE_PREFETCH) !== 0,
        is64bit: (f & IORESOURCE_MEM_64) !== 0,
      });
    }
  }
  return { bars, romBytes };
}

async function readGroups(sysfsRoot: string): Promise<IommuGroup[]> {
  const base = path.join(sysfsRoot, 'kernel/iommu_groups');
  const ids = (await listDir(base)).filter((n) => /^\d+$/.test(n)).map(Number);
  const groups = await Promise.all(
    ids.map(async (id) => ({
      id,
      members: (await listDir(path.join(base, String(id), 'devices'))).filter(isBdf).sort(compareBdf),
    })),
  );
  return groups.sort((a, b) => a.id - b.id);
}

async function readVfioNodes(sysfsRoot: string, devRoot: string, lookup: DeviceNumberLookup, warnings: string[]): Promise<VfioDevNode[]> {
  const rels = [
    ...(await listDir(path.join(devRoot, 'vfio'))).filter((n) => n !== 'devices').map((n) => `vfio/${n}`),
    ...(await listDir(path.join(devRoot, 'vfio/devices'))).map((n) => `vfio/devices/${n}`),
  ];
  const nodes: VfioDevNode[] = [];
  for (const rel of rels) {
    const abs = path.join(devRoot, rel);
    const numbers = await lookup(abs, rel);
    if (numbers === undefined) {
      warnings.push(`${abs} is not a character device; ignored`);
      continue;
    }
    const linkPath = path.join(sysfsRoot, 'dev/char', `${numbers.major}:${numbers.minor}`);
    let sysfsLink: string | null = null;
    try {
      sysfsLink = await fsp.readlink(linkPath);
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw internal('PCIE_SYSFS_UNREADABLE', `cannot read link ${linkPath}`, { cause: err });
      warnings.push(`${abs} (${numbers.major}:${numbers.minor}) has no ${linkPath}`);
    }
    nodes.push({ path: `/dev/${rel}`, ...numbers, sysfsLink, target: classifyCharLink(sysfsLink) });
  }
  return nodes.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/**
 * What a `/sys/dev/char/M:m` link points at: `.../virtual/vfio/<group>` for a legacy group node,
 * `.../<bdf>/vfio-dev/vfioN` for an iommufd device node, `.../virtual/misc/vfio` for the container.
 */
export function classifyCharLink(link: string | null): VfioNodeTarget {
  if (link === null) return { kind: 'unknown' };
  const cdev = /\/([^/]+)\/vfio-dev\/vfio\d+$/.exec(link);
  if (cdev !== null && isBdf(cdev[1]!)) return { kind: 'cdev', bdf: cdev[1]! };
  const group = /\/vfio\/(noiommu-)?(\d+)$/.exec(link);
  if (group !== null) {
    return group[1] === undefined ? { kind: 'group', group: Number(group[2]) } : { kind: 'noiommu-group', group: Number(group[2]) };
  }
  if (/\/misc\/vfio$/.test(link)) return { kind: 'container' };
  return { kind: 'unknown' };
}
