import { exhausted, precondition } from '../common/errors.js';
import type { HandlerPcieConfig } from '../config/types.js';
import { compareBdf, formatBytes, MiB, roundUpPow2 } from './pci.js';
import { barNeeds, capacityFor, MEM_WINDOW_GRANULE_BYTES, NO_NEEDS, type WindowFloors } from './reserve.js';
import { findFunction, selectVfioGroups } from './resolve.js';
import type {
  BarNeeds,
  PciePort,
  PcieSwitch,
  PcieTopology,
  PcieUsage,
  PlannedFunction,
  PortCapacity,
  PortReserve,
} from './topology-types.js';
import type { HostInventory, VfioDeviceRequest } from './types.js';

/**
 * q35 root-bus (pcie.0) address rules, agreed with the argv builder: slot 0 is the host bridge,
 * 0x1f the ICH9 LPC/SATA/SMBus functions, 0x01-0x07 the hypervisor's own devices
 * (virtio-serial, virtio-mem, rng...). Root ports take 0x08-0x1e, up to 8 per slot as functions.
 */
export const ROOT_PORT_FIRST_SLOT = 0x08;
export const ROOT_PORT_LAST_SLOT = 0x1e;
export const FUNCTIONS_PER_SLOT = 8;
export const ROOT_PORT_SLOTS = ROOT_PORT_LAST_SLOT - ROOT_PORT_FIRST_SLOT + 1;
/** A PCI segment has 8-bit bus numbers. */
export const BUS_NUMBERS_PER_SEGMENT = 256;
/** An xio3130 upstream's internal bus has 32 device numbers, one downstream port each. */
export const DOWNSTREAM_PORTS_PER_SWITCH = 32;
/** Chassis of the root ports; switch s uses chassis 2+s, so (chassis, slot) pairs never repeat. */
export const ROOT_PORT_CHASSIS = 1;
/**
 * 32-bit MMIO the firmware can hand to bridge windows on q35: the hole between the PCIe MMCONFIG
 * area (0xb0000000-0xbfffffff) and the IOAPIC at 0xfec00000 is 1004 MiB; 64 MiB of it is left
 * for the devices on pcie.0 itself (virtio, VGA, ICH9). Non-prefetchable windows cannot go above
 * 4 GiB, so this, not the I/O space, is what bounds the number of reserving ports.
 */
export const MMIO32_BUDGET_BYTES = 940 * MiB;
const DEFAULT_IO_WINDOW_NOTE_LIMIT = 12;

export interface PcieTopologyInput {
  inventory: HostInventory;
  /** The pod's VFIO devices (pod_resources, CDI, kubelet), see pod-devices.ts. */
  devices: readonly VfioDeviceRequest[];
  /** The handler's pcie section plus whether the handler is confidential. */
  profile: HandlerPcieConfig & { confidential: boolean };
}

type Item = { kind: 'device'; fn: PlannedFunction } | { kind: 'spare' };

/**
 * Pure: plan the VM's PCIe layout. Expands the requested devices to whole IOMMU groups, gives
 * every function its own port (cold-plugged at boot or reserved for hot-plug, per the handler),
 * adds spare hot-plug ports, sizes each hot-plug port's windows from the BARs announced for it,
 * and refuses only at real limits (root-bus slots, bus numbers, 32-bit MMIO) with the numbers.
 * The same input always gives the same topology (ordering by BDF, ids by position).
 */
export function planPcieTopology(input: PcieTopologyInput): PcieTopology {
  const { inventory, devices, profile } = input;
  if (profile.confidential && (profile.vfioPolicy !== 'cold-plug' || profile.sparePorts > 0)) {
    throw precondition(
      'PCIE_CONFIDENTIAL_HOTPLUG',
      `a confidential handler is never reconfigured after boot, so pcie.vfioPolicy must be "cold-plug" and pcie.sparePorts 0 (got "${profile.vfioPolicy}" and ${profile.sparePorts})`,
    );
  }
  const groups = selectVfioGroups(inventory, devices);
  const functions: PlannedFunction[] = groups
    .flatMap((g) => g.functions.map((bdf) => ({ bdf, group: g.group })))
    .sort((a, b) => compareBdf(a.bdf, b.bdf))
    .map(({ bdf, group }) => {
      const f = findFunction(inventory, bdf)!;
      return {
        bdf,
        group,
        vendorId: f.vendorId,
        deviceId: f.deviceId,
        classCode: f.classCode,
        numaNode: f.numaNode,
        needs: barNeeds(f.bars, f.romBytes),
        plug: profile.vfioPolicy,
        portId: '',
      };
    });
  const items: Item[] = [
    ...functions.map((fn): Item => ({ kind: 'device', fn })),
    ...Array.from({ length: profile.sparePorts }, (): Item => ({ kind: 'spare' })),
  ];
  const floors: WindowFloors = {
    memFloorBytes: profile.memReserveFloorMiB * MiB,
    pref64FloorBytes: profile.pref64ReserveFloorMiB * MiB,
  };
  const { ports, switches } = profile.portType === 'switch-port' ? switchLayout(items, floors) : rootPortLayout(items, floors);
  const usage = measure(ports, switches);
  checkLimits(usage, profile.portType, items.length, switches.length);
  return {
    version: 1,
    machine: 'q35',
    rootBus: 'pcie.0',
    policy: profile.vfioPolicy,
    portType: profile.portType,
    confidential: profile.confidential,
    ports,
    switches,
    functions,
    groups,
    usage,
    notes: notesFor(usage, groups),
  };
}

function rootAddress(i: number, total: number): Pick<PciePort, 'bus' | 'slot' | 'function' | 'multifunction'> {
  const slot = ROOT_PORT_FIRST_SLOT + Math.floor(i / FUNCTIONS_PER_SLOT);
  const fn = i % FUNCTIONS_PER_SLOT;
  const inSlot = Math.min(FUNCTIONS_PER_SLOT, total - (i - fn));
  return { bus: 'pcie.0', slot, function: fn, multifunction: fn === 0 && inSlot > 1 };
}

function rootPort(i: number, total: number): Omit<PciePort, 'use' | 'reserve' | 'capacity' | 'reservedFor' | 'occupant'> {
  return {
    id: `rp${i}`,
    driver: 'pcie-root-port',
    ...rootAddress(i, total),
    chassis: ROOT_PORT_CHASSIS,
    physicalSlot: i + 1,
    portNumber: i + 1,
  };
}

/** Attach an item to a port record: occupant for cold-plug, reservation for hot-plug. */
function fill(
  base: Omit<PciePort, 'use' | 'reserve' | 'capacity' | 'reservedFor' | 'occupant'>,
  item: Item,
  capacity: PortCapacity,
  reserve: PortReserve,
): PciePort {
  if (item.kind === 'spare') return { ...base, use: 'spare', reserve, capacity, reservedFor: null, occupant: null };
  item.fn.portId = base.id;
  if (item.fn.plug === 'cold-plug') {
    return {
      ...base,
      use: 'cold-plug',
      reserve,
      capacity,
      reservedFor: null,
      occupant: { qemuId: `dev-${base.id}`, driver: 'vfio-pci', bdf: item.fn.bdf, attached: 'boot', needs: item.fn.needs },
    };
  }
  return { ...base, use: 'hot-plug', reserve, capacity, reservedFor: item.fn.bdf, occupant: null };
}

function needsOf(item: Item): BarNeeds {
  return item.kind === 'device' ? item.fn.needs : NO_NEEDS;
}

function rootPortLayout(items: Item[], floors: WindowFloors): { ports: PciePort[]; switches: PcieSwitch[] } {
  const ports = items.map((item, i) => {
    const needs = needsOf(item);
    const cold = item.kind === 'device' && item.fn.plug === 'cold-plug';
    // A cold-plugged device is present when the firmware sizes the windows, so only I/O needs a
    // word (io-reserve=0 when it has no I/O BAR); hot-plug and spare ports reserve up front.
    const capacity = capacityFor(needs, cold ? { memFloorBytes: 0, pref64FloorBytes: 0 } : floors);
    const reserve: PortReserve = cold
      ? { ioBytes: needs.ioBytes > 0 ? null : 0, memBytes: null, pref64Bytes: null }
      : { ioBytes: capacity.ioBytes > 0 ? null : 0, memBytes: capacity.memBytes, pref64Bytes: capacity.pref64Bytes };
    return fill(rootPort(i, items.length), item, capacity, reserve);
  });
  return { ports, switches: [] };
}

/**
 * Switch layout: one root port per x3130 switch, up to 32 downstream ports each. Downstream ports
 * have no reserve properties; the root port above reserves for all of them. Linux hands a hot-plug
 * bridge's spare window out in equal shares to the hot-plug ports below it, so each share is the
 * largest single need and the root port reserves share x ports.
 */
function switchLayout(items: Item[], floors: WindowFloors): { ports: PciePort[]; switches: PcieSwitch[] } {
  const switchCount = Math.ceil(items.length / DOWNSTREAM_PORTS_PER_SWITCH);
  const roots: PciePort[] = [];
  const downs: PciePort[] = [];
  const switches: PcieSwitch[] = [];
  for (let s = 0; s < switchCount; s++) {
    const chunk = items.slice(s * DOWNSTREAM_PORTS_PER_SWITCH, (s + 1) * DOWNSTREAM_PORTS_PER_SWITCH);
    const caps = chunk.map((item) => capacityFor(needsOf(item), floors));
    const share: PortCapacity = {
      ioBytes: Math.max(...caps.map((c) => c.ioBytes)),
      memBytes: Math.max(...caps.map((c) => c.memBytes)),
      pref64Bytes: Math.max(...caps.map((c) => c.pref64Bytes)),
    };
    // Each share is already a power of two, so shares x ports stays aligned to the share.
    const rootCap: PortCapacity = {
      ioBytes: share.ioBytes,
      memBytes: share.memBytes * chunk.length,
      pref64Bytes: share.pref64Bytes * chunk.length,
    };
    const base = rootPort(s, switchCount);
    roots.push({
      ...base,
      use: 'switch',
      reserve: { ioBytes: rootCap.ioBytes > 0 ? null : 0, memBytes: rootCap.memBytes, pref64Bytes: rootCap.pref64Bytes },
      capacity: rootCap,
      reservedFor: null,
      occupant: null,
    });
    const sw: PcieSwitch = { id: `swup${s}`, rootPortId: base.id, downstreamPortIds: [] };
    chunk.forEach((item, j) => {
      const id = `swdp${downs.length}`;
      sw.downstreamPortIds.push(id);
      const port = fill(
        {
          id,
          driver: 'xio3130-downstream',
          bus: sw.id,
          slot: j,
          function: 0,
          multifunction: false,
          chassis: ROOT_PORT_CHASSIS + 1 + s,
          physicalSlot: j + 1,
          portNumber: j,
        },
        item,
        share,
        { ioBytes: null, memBytes: null, pref64Bytes: null },
      );
      downs.push(port);
    });
    switches.push(sw);
  }
  return { ports: [...roots, ...downs], switches };
}

function packedWindow(bytes: number): number {
  return bytes > 0 ? Math.max(roundUpPow2(bytes), MEM_WINDOW_GRANULE_BYTES) : 0;
}

function measure(ports: PciePort[], switches: PcieSwitch[]): PcieUsage {
  const roots = ports.filter((p) => p.driver === 'pcie-root-port');
  let mmio32Bytes = 0;
  let mmio64Bytes = 0;
  let ioWindows = 0;
  for (const p of roots) {
    // A cold-plugged device's window is sized and aligned by the firmware around the device.
    const needs = p.occupant?.needs ?? NO_NEEDS;
    mmio32Bytes += p.reserve.memBytes ?? packedWindow(needs.mem32Bytes);
    mmio64Bytes += p.reserve.pref64Bytes ?? packedWindow(needs.pref64Bytes);
    if (p.reserve.ioBytes !== 0) ioWindows++;
  }
  const downstream = ports.length - roots.length;
  return {
    busNumbers: 1 + roots.length + switches.length + downstream,
    busNumbersMax: BUS_NUMBERS_PER_SEGMENT,
    rootSlots: Math.ceil(roots.length / FUNCTIONS_PER_SLOT),
    rootSlotsMax: ROOT_PORT_SLOTS,
    ioWindows,
    mmio32Bytes,
    mmio32BudgetBytes: MMIO32_BUDGET_BYTES,
    mmio64Bytes,
  };
}

function checkLimits(u: PcieUsage, portType: string, portCount: number, switchCount: number): void {
  if (u.rootSlots > u.rootSlotsMax) {
    throw exhausted(
      'PCIE_ROOT_SLOTS_EXHAUSTED',
      `${portCount} root ports need ${u.rootSlots} slots on pcie.0 but only ${u.rootSlotsMax} (0x${ROOT_PORT_FIRST_SLOT.toString(16)}-0x${ROOT_PORT_LAST_SLOT.toString(16)}, ${FUNCTIONS_PER_SLOT} ports each) are free for root ports`,
      { details: { ...u, portCount } },
    );
  }
  if (u.busNumbers > u.busNumbersMax) {
    throw exhausted(
      'PCIE_BUS_NUMBERS_EXHAUSTED',
      `${portCount} ${portType === 'switch-port' ? 'switch' : 'root'} ports need ${u.busNumbers} PCI bus numbers (root bus, ${switchCount} root ports, ${switchCount} switch buses, ${portCount} downstream buses) but a PCI segment has ${u.busNumbersMax}`,
      { details: { ...u, portCount } },
    );
  }
  if (u.mmio32Bytes > u.mmio32BudgetBytes) {
    throw exhausted(
      'PCIE_MMIO32_EXHAUSTED',
      `the ${portCount} ports' 32-bit memory windows need ${formatBytes(u.mmio32Bytes)} but q35 has ${formatBytes(u.mmio32BudgetBytes)} below 4 GiB for them; lower pcie.memReserveFloorMiB or pcie.sparePorts`,
      { details: { ...u, portCount } },
    );
  }
}

function notesFor(u: PcieUsage, groups: PcieTopology['groups']): string[] {
  const notes: string[] = [];
  for (const g of groups) {
    for (const l of g.leftOut) notes.push(`IOMMU group ${g.group}: ${l.bdf} stays on the host (${l.reason})`);
  }
  if (u.ioWindows > DEFAULT_IO_WINDOW_NOTE_LIMIT) {
    notes.push(
      `${u.ioWindows} ports open 4 KiB I/O windows; past ~${DEFAULT_IO_WINDOW_NOTE_LIMIT} the firmware leaves some I/O BARs unassigned (drivers fall back to MMIO)`,
    );
  }
  if (u.mmio64Bytes > 512 * 1024 * MiB) {
    notes.push(`64-bit windows total ${formatBytes(u.mmio64Bytes)}: the guest needs more than 40 physical address bits (host-phys-bits)`);
  }
  return notes;
}
