/**
 * Small PCI facts shared by the inventory reader and the planners: resource flag bits, class
 * codes, BDF parsing and ordering. Pure.
 */

/**
 * Flag bits of the third column of sysfs `resource` (the kernel's `struct resource` flags,
 * include/linux/ioport.h). Only these four matter for sizing bridge windows.
 */
export const IORESOURCE_IO = 0x0000_0100;
export const IORESOURCE_MEM = 0x0000_0200;
export const IORESOURCE_PREFETCH = 0x0000_2000;
export const IORESOURCE_MEM_64 = 0x0010_0000;

/** Base class 0x06 (bridge), subclass 0x00: a host bridge. Never passed through. */
export const CLASS_HOST_BRIDGE = 0x0600;
/** Base class 0x06, subclass 0x04: a PCI-to-PCI bridge (incl. PCIe ports). Never passed through. */
export const CLASS_PCI_BRIDGE = 0x0604;
/** Subtractive-decode PCI-to-PCI bridges report 0x0604 too; 0x0609 is the semi-transparent kind. */
export const CLASS_SEMI_TRANSPARENT_BRIDGE = 0x0609;

/** Conventional PCI config space is 256 bytes; PCIe functions expose 4096 (extended config). */
export const CONVENTIONAL_CONFIG_BYTES = 256;

export const KiB = 1024;
export const MiB = 1024 * KiB;
export const GiB = 1024 * MiB;

/** `dddd:bb:dd.f`, lower-case hex, as sysfs names functions. */
const BDF_RE = /^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])$/;

export interface ParsedBdf {
  domain: number;
  bus: number;
  device: number;
  fn: number;
}

export function parseBdf(bdf: string): ParsedBdf | undefined {
  const m = BDF_RE.exec(bdf);
  if (m === null) return undefined;
  return {
    domain: Number.parseInt(m[1]!, 16),
    bus: Number.parseInt(m[2]!, 16),
    device: Number.parseInt(m[3]!, 16),
    fn: Number.parseInt(m[4]!, 16),
  };
}

export function isBdf(s: string): boolean {
  return BDF_RE.test(s);
}

/** Accept `3b:00.0` or `0000:3b:00.0` (any case) and return the canonical sysfs spelling. */
export function canonicalBdf(s: string): string | undefined {
  const lower = s.trim().toLowerCase();
  const full = /^[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$/.test(lower) ? `0000:${lower}` : lower;
  return isBdf(full) ? full : undefined;
}

/** Numeric order of BDFs (domain, bus, device, function): the planners' one ordering. */
export function compareBdf(a: string, b: string): number {
  const pa = parseBdf(a);
  const pb = parseBdf(b);
  if (pa === undefined || pb === undefined) return a < b ? -1 : a > b ? 1 : 0;
  return pa.domain - pb.domain || pa.bus - pb.bus || pa.device - pb.device || pa.fn - pb.fn;
}

/** True for functions that route rather than do work: they stay on the host. */
export function isBridgeClass(classCode: number): boolean {
  const cls = classCode >> 8;
  return cls === CLASS_HOST_BRIDGE || cls === CLASS_PCI_BRIDGE || cls === CLASS_SEMI_TRANSPARENT_BRIDGE;
}

/** Smallest power of two >= n (n >= 1); 0 stays 0. Exact for every size below 2^53. */
export function roundUpPow2(n: number): number {
  if (n <= 0) return 0;
  let p = 1;
  while (p < n) p *= 2;
  return p;
}

/** QEMU size-property spelling: the largest unit that divides exactly (`32G`, `16M`, `4K`, `100`). */
export function qemuSize(bytes: number): string {
  if (bytes === 0) return '0';
  for (const [unit, scale] of [
    ['T', 1024 * GiB],
    ['G', GiB],
    ['M', MiB],
    ['K', KiB],
  ] as const) {
    if (bytes % scale === 0) return `${bytes / scale}${unit}`;
  }
  return String(bytes);
}

/** Human spelling for messages (`32 GiB`, `1.5 MiB`). */
export function formatBytes(bytes: number): string {
  for (const [unit, scale] of [
    ['TiB', 1024 * GiB],
    ['GiB', GiB],
    ['MiB', MiB],
    ['KiB', KiB],
  ] as const) {
    if (bytes >= scale) {
      const v = bytes / scale;
      return `${Number.isInteger(v) ? v : v.toFixed(1)} ${unit}`;
    }
  }
  return `${bytes} B`;
}

/** `0x030200` -> a short name for plan output; unknown classes print as hex. */
export function className(classCode: number): string {
  const names: Record<number, string> = {
    512: 'ethernet',
    519: 'infiniband',
    640: 'network',
    768: 'vga',
    770: '3d-controller',
    896: 'display',
    1027: 'audio',
    1152: 'multimedia',
    1536: 'host-bridge',
    1540: 'pci-bridge',
    1664: 'bridge-other',
    264: 'nvme',
    262: 'sata',
    3075: 'usb',
    4608: 'accelerator',
  };
  return names[classCode >> 8] ?? `class-0x${classCode.toString(16).padStart(6, '0')}`;
}

export function hex4(n: number): string {
  return n.toString(16).padStart(4, '0');
}
