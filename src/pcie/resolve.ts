import path from 'node:path';
import { invalid, notFound, precondition } from '../common/errors.js';
import { canonicalBdf, compareBdf, isBridgeClass } from './pci.js';
import type { HostInventory, LeftOutReason, PciFunction, SelectedVfioGroup, VfioDeviceRequest } from './types.js';

/** The only driver whose functions QEMU can open through VFIO. */
export const VFIO_PCI_DRIVER = 'vfio-pci';
/** Bound to pci-stub, a function is inert on the host: the kernel counts the group as viable. */
const INERT_DRIVERS = new Set(['pci-stub']);

/** Index of the inventory's functions by BDF, built once per inventory object. */
const indexCache = new WeakMap<HostInventory, Map<string, PciFunction>>();
export function functionIndex(inventory: HostInventory): Map<string, PciFunction> {
  let index = indexCache.get(inventory);
  if (index === undefined) {
    index = new Map(inventory.functions.map((f) => [f.bdf, f]));
    indexCache.set(inventory, index);
  }
  return index;
}

export function findFunction(inventory: HostInventory, bdf: string): PciFunction | undefined {
  return functionIndex(inventory).get(bdf);
}

type Target = { group: number; via: string } | { skip: true };

function describeRequest(r: VfioDeviceRequest): string {
  return `${r.hostPath ?? r.bdf ?? '(nothing)'} (from ${r.origin})`;
}

function iommuMissing(inventory: HostInventory, r: VfioDeviceRequest): never {
  throw precondition(
    'IOMMU_MISSING',
    `VFIO device ${describeRequest(r)} cannot be passed through: the host has no IOMMU groups under ${path.join(inventory.sysfsRoot, 'kernel/iommu_groups')}`,
    { details: { request: r } },
  );
}

function notVfio(f: PciFunction, r: VfioDeviceRequest, group: number | null): never {
  throw precondition(
    'DEVICE_NOT_VFIO',
    `PCI function ${f.bdf}${group === null ? '' : ` in IOMMU group ${group}`} for ${describeRequest(r)} is bound to ${f.driver ?? 'no driver'}, not ${VFIO_PCI_DRIVER}`,
    { details: { bdf: f.bdf, driver: f.driver, group, request: r } },
  );
}

/** Which IOMMU group a request names, or that it names nothing to pass (the VFIO container node). */
function targetOf(inventory: HostInventory, r: VfioDeviceRequest): Target {
  if (r.bdf !== undefined) {
    const bdf = canonicalBdf(r.bdf);
    if (bdf === undefined)
      throw invalid('PCI_ADDRESS_INVALID', `PCI address "${r.bdf}" (from ${r.origin}) is not of the form 0000:3b:00.0`);
    const f = findFunction(inventory, bdf);
    if (f === undefined) throw notFound('PCI_DEVICE_UNKNOWN', `PCI function ${bdf} (from ${r.origin}) does not exist on this host`);
    if (f.driver !== VFIO_PCI_DRIVER) notVfio(f, r, f.iommuGroup);
    if (f.iommuGroup === null) iommuMissing(inventory, r);
    return { group: f.iommuGroup, via: bdf };
  }
  const raw = r.hostPath ?? '';
  const hostPath = path.posix.normalize(raw);
  if (!hostPath.startsWith('/dev/vfio/')) {
    throw invalid('VFIO_PATH_INVALID', `device path "${raw}" (from ${r.origin}) is not under /dev/vfio`);
  }
  const node = inventory.vfioNodes.find((n) => n.path === hostPath);
  const target = node?.target;
  if (target?.kind === 'container' || hostPath === '/dev/vfio/vfio') return { skip: true };
  if (target?.kind === 'noiommu-group' || /^\/dev\/vfio\/noiommu-\d+$/.test(hostPath)) iommuMissing(inventory, r);
  if (target?.kind === 'group') return { group: target.group, via: hostPath };
  if (target?.kind === 'cdev') {
    const f = findFunction(inventory, target.bdf);
    if (f === undefined)
      throw notFound('PCI_DEVICE_UNKNOWN', `PCI function ${target.bdf} behind ${describeRequest(r)} is not in the inventory`);
    if (f.driver !== VFIO_PCI_DRIVER) notVfio(f, r, f.iommuGroup);
    if (f.iommuGroup === null) iommuMissing(inventory, r);
    return { group: f.iommuGroup, via: hostPath };
  }
  // No node (or one /sys/dev/char cannot explain): the kernel names legacy group nodes after the
  // group id and removes the node when no member is bound to vfio-pci, so a missing /dev/vfio/<n>
  // of an existing group is reported through that group's drivers below.
  const byName = /^\/dev\/vfio\/(\d+)$/.exec(hostPath);
  if (byName !== null && inventory.groups.some((g) => g.id === Number(byName[1]))) {
    return { group: Number(byName[1]), via: hostPath };
  }
  // Likewise an iommufd node is named in sysfs (<bdf>/vfio-dev/vfioN) even when /dev was not read.
  const cdevOwner = inventory.functions.find((f) => f.vfioCdevPath === hostPath);
  if (cdevOwner !== undefined && cdevOwner.iommuGroup !== null) return { group: cdevOwner.iommuGroup, via: hostPath };
  throw notFound('VFIO_NODE_UNKNOWN', `VFIO node ${describeRequest(r)} does not exist on this host or is not a VFIO device`, {
    details: { request: r, node },
  });
}

/** Expand one group: who goes to the VM, who stays, and refuse groups the kernel would refuse. */
function expandGroup(inventory: HostInventory, id: number, r: VfioDeviceRequest): SelectedVfioGroup {
  const group = inventory.groups.find((g) => g.id === id);
  if (group === undefined) {
    throw notFound('IOMMU_GROUP_UNKNOWN', `IOMMU group ${id} named by ${describeRequest(r)} does not exist on this host`);
  }
  const functions: string[] = [];
  const leftOut: SelectedVfioGroup['leftOut'] = [];
  const blockers: PciFunction[] = [];
  const idle: PciFunction[] = [];
  for (const bdf of group.members) {
    const f = findFunction(inventory, bdf);
    if (f === undefined) {
      leftOut.push({ bdf, reason: 'unbound' });
      continue;
    }
    let reason: LeftOutReason | undefined;
    if (isBridgeClass(f.classCode)) reason = 'bridge';
    else if (f.driver === VFIO_PCI_DRIVER) functions.push(bdf);
    else if (f.driver === null) reason = 'unbound';
    else if (INERT_DRIVERS.has(f.driver)) reason = 'pci-stub';
    else blockers.push(f);
    if (reason !== undefined) leftOut.push({ bdf, reason });
    if (reason === 'unbound' || reason === 'pci-stub') idle.push(f);
  }
  if (functions.length === 0) {
    const culprit = blockers[0] ?? idle[0];
    if (culprit !== undefined) notVfio(culprit, r, id);
    throw precondition('IOMMU_GROUP_EMPTY', `IOMMU group ${id} named by ${describeRequest(r)} holds only bridges, nothing to pass through`);
  }
  if (blockers.length > 0) {
    const list = blockers.map((f) => `${f.bdf} (${f.driver})`).join(', ');
    throw precondition(
      'IOMMU_GROUP_NOT_VIABLE',
      `IOMMU group ${id} for ${describeRequest(r)} is not viable: ${list} ${blockers.length === 1 ? 'is' : 'are'} bound to a host driver, and every member must be bound to ${VFIO_PCI_DRIVER} or unbound`,
      { details: { group: id, blockers: blockers.map((f) => ({ bdf: f.bdf, driver: f.driver })), request: r } },
    );
  }
  return { group: id, functions, leftOut, origins: [r.origin] };
}

/**
 * Pure: turn the pod's VFIO requests into whole IOMMU groups (every member goes to the same VM),
 * leaving bridges and idle members on the host, merging requests that name the same group.
 * Throws IOMMU_MISSING, DEVICE_NOT_VFIO, IOMMU_GROUP_NOT_VIABLE, VFIO_NODE_UNKNOWN, ...
 */
export function selectVfioGroups(inventory: HostInventory, requests: readonly VfioDeviceRequest[]): SelectedVfioGroup[] {
  const byGroup = new Map<number, SelectedVfioGroup>();
  for (const r of requests) {
    if (!inventory.iommuEnabled && !(r.hostPath !== undefined && path.posix.normalize(r.hostPath) === '/dev/vfio/vfio')) {
      iommuMissing(inventory, r);
    }
    const t = targetOf(inventory, r);
    if ('skip' in t) continue;
    const seen = byGroup.get(t.group);
    if (seen !== undefined) {
      if (!seen.origins.includes(r.origin)) seen.origins.push(r.origin);
      continue;
    }
    byGroup.set(t.group, expandGroup(inventory, t.group, r));
  }
  return [...byGroup.values()].sort((a, b) => compareBdf(a.functions[0]!, b.functions[0]!));
}
