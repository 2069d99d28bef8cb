import { alreadyExists, exhausted, invalid, notFound, precondition } from '../common/errors.js';
import { formatBytes } from './pci.js';
import { barNeeds, fitsCapacity } from './reserve.js';
import { findFunction, selectVfioGroups, VFIO_PCI_DRIVER } from './resolve.js';
import type { BarNeeds, PciePort, PcieTopology } from './topology-types.js';
import type { HostInventory, VfioDeviceRequest } from './types.js';

/** One device to attach to a reserved port. */
export interface HotplugDevice {
  /** QEMU driver: `vfio-pci` for passthrough; an emulated one (`e1000e`) goes the same way. */
  driver: string;
  /** Host function (vfio-pci `host=`); a port reserved for this BDF is preferred. */
  bdf?: string | null;
  /** QEMU id; default `dev-<port id>`. */
  qemuId?: string;
  /** What the device's BARs need (see barNeeds / hotplugDeviceForFunction). */
  needs: BarNeeds;
  /** Extra device_add properties (`sysfsdev`, `iommufd`, `netdev`, `mac`, ...). */
  properties?: Record<string, string | number | boolean>;
}

/** Devices attached together or not at all (the functions of one IOMMU group). */
export interface HotplugRequest {
  devices: HotplugDevice[];
}

/** `device_add` arguments as planned: the driver, our id, the reserved port, driver properties. */
export interface DeviceAddArguments {
  driver: string;
  /** QEMU id, unique in the VM. */
  id: string;
  /** The planned port (`rpN`) the device goes onto. */
  bus: string;
  /** Host function of a vfio-pci device (unless `sysfsdev` names it). */
  host?: string;
  /** Extra driver properties (HotplugDevice.properties). */
  [property: string]: string | number | boolean | undefined;
}

/** A planned `device_add`, exactly as on the wire. */
export interface DeviceAddCommand {
  execute: 'device_add';
  arguments: DeviceAddArguments;
}

/** A planned `device_del`: the guest is asked to release device `id` (DEVICE_DELETED confirms). */
export interface DeviceDelCommand {
  execute: 'device_del';
  arguments: { id: string };
}

/** A QMP command to send, in order: `{ execute, arguments }` exactly as on the wire, keyed by `execute`. */
export type QmpCommandPlan = DeviceAddCommand | DeviceDelCommand;

/** A hot-plug plan (`device_add` commands) by default; planHotUnplug's carries `device_del` ones. */
export interface HotplugPlan<Command extends QmpCommandPlan = DeviceAddCommand> {
  /** The topology after the commands succeed: commit it only after QEMU confirms every one. */
  topology: PcieTopology;
  commands: Command[];
  placements: Array<{ qemuId: string; portId: string }>;
}

function label(d: HotplugDevice): string {
  return d.bdf ? `${d.driver} ${d.bdf}` : d.driver;
}

function refuseConfidential(t: PcieTopology, what: string): void {
  if (t.confidential) {
    throw precondition('PCIE_HOTPLUG_CONFIDENTIAL', `${what} refused: a confidential VM is never reconfigured after boot`);
  }
}

/** Ports a device may take: free hot-plug/spare ports, its own reservation first, then best fit. */
function choosePort(t: PcieTopology, d: HotplugDevice, taken: Set<string>): PciePort | undefined {
  const free = t.ports.filter((p) => (p.use === 'hot-plug' || p.use === 'spare') && p.occupant === null && !taken.has(p.id));
  const own = free.find((p) => d.bdf && p.reservedFor === d.bdf && fitsCapacity(d.needs, p.capacity));
  if (own !== undefined) return own;
  // Ports reserved for another announced device stay theirs; among the rest the smallest that
  // fits wins, so a small device does not take the port a 128 GiB BAR will need.
  const order = new Map(t.ports.map((p, i) => [p.id, i]));
  return free
    .filter((p) => p.reservedFor === null && fitsCapacity(d.needs, p.capacity))
    .sort(
      (a, b) =>
        a.capacity.pref64Bytes - b.capacity.pref64Bytes || a.capacity.memBytes - b.capacity.memBytes || order.get(a.id)! - order.get(b.id)!,
    )[0];
}

/**
 * Pure, on a copy: choose a reserved port for each device and return the QMP `device_add`
 * commands plus the topology as it will be once they succeed. Refuses (nothing changes) when
 * the VM is confidential, an id or host function is already attached, or no free reserved port
 * fits a device (RESOURCE_EXHAUSTED with the sizes).
 */
export function planHotplug(topology: PcieTopology, request: HotplugRequest): HotplugPlan {
  if (request.devices.length === 0) throw invalid('PCIE_HOTPLUG_EMPTY', 'hot-plug request names no device');
  refuseConfidential(topology, `hot-plug of ${request.devices.map(label).join(', ')}`);
  const next = structuredClone(topology);
  const ids = new Set(next.ports.flatMap((p) => (p.occupant ? [p.occupant.qemuId] : [])));
  const attached = new Set(next.ports.flatMap((p) => (p.occupant?.bdf ? [p.occupant.bdf] : [])));
  const taken = new Set<string>();
  const commands: DeviceAddCommand[] = [];
  const placements: HotplugPlan['placements'] = [];
  for (const d of request.devices) {
    if (d.driver.trim() === '') throw invalid('PCIE_HOTPLUG_DRIVER', 'hot-plug device driver must not be empty');
    if (d.bdf && attached.has(d.bdf)) throw alreadyExists('PCIE_DEVICE_ATTACHED', `PCI function ${d.bdf} is already attached to this VM`);
    const port = choosePort(next, d, taken);
    if (port === undefined) {
      const free = next.ports.filter((p) => (p.use === 'hot-plug' || p.use === 'spare') && p.occupant === null && !taken.has(p.id));
      const open = free.filter((p) => p.reservedFor === null || p.reservedFor === d.bdf);
      const bestMem = Math.max(0, ...open.map((p) => p.capacity.memBytes));
      const bestPref = Math.max(0, ...open.map((p) => p.capacity.pref64Bytes));
      throw exhausted(
        'PCIE_HOTPLUG_NO_PORT',
        `no free reserved port fits ${label(d)} (needs ${formatBytes(d.needs.mem32Bytes)} 32-bit and ${formatBytes(d.needs.pref64Bytes)} 64-bit prefetchable): ${open.length} of ${free.length} free ports are open to it, offering at most ${formatBytes(bestMem)} and ${formatBytes(bestPref)}`,
        { details: { device: d, freePorts: free.length, openPorts: open.length, bestMem, bestPref } },
      );
    }
    const qemuId = d.qemuId ?? `dev-${port.id}`;
    if (ids.has(qemuId)) throw alreadyExists('PCIE_DEVICE_ID_IN_USE', `QEMU device id "${qemuId}" is already in use in this VM`);
    ids.add(qemuId);
    taken.add(port.id);
    if (d.bdf) attached.add(d.bdf);
    const args: DeviceAddArguments = { driver: d.driver, id: qemuId, bus: port.id };
    if (d.driver === VFIO_PCI_DRIVER && d.bdf && d.properties?.sysfsdev === undefined) args.host = d.bdf;
    Object.assign(args, d.properties ?? {});
    commands.push({ execute: 'device_add', arguments: args });
    placements.push({ qemuId, portId: port.id });
    port.occupant = { qemuId, driver: d.driver, bdf: d.bdf ?? null, attached: 'hotplug', needs: { ...d.needs } };
  }
  return { topology: next, commands, placements };
}

/** Pure, on a copy: `device_del` for attached devices, and the topology once they are gone. */
export function planHotUnplug(topology: PcieTopology, qemuIds: readonly string[]): HotplugPlan<DeviceDelCommand> {
  if (qemuIds.length === 0) throw invalid('PCIE_HOTPLUG_EMPTY', 'hot-unplug request names no device');
  refuseConfidential(topology, `hot-unplug of ${qemuIds.join(', ')}`);
  const next = structuredClone(topology);
  const commands: DeviceDelCommand[] = [];
  const placements: HotplugPlan['placements'] = [];
  for (const id of qemuIds) {
    const port = next.ports.find((p) => p.occupant?.qemuId === id);
    if (port === undefined)
      throw notFound('PCIE_DEVICE_NOT_ATTACHED', `no device with QEMU id "${id}" is attached to this VM's PCIe ports`);
    port.occupant = null;
    commands.push({ execute: 'device_del', arguments: { id } });
    placements.push({ qemuId: id, portId: port.id });
  }
  return { topology: next, commands, placements };
}

/**
 * The request that attaches announced hot-plug functions (all not yet attached, or those
 * listed): what CreateContainer passes to planHotplug. Functions are grouped by IOMMU group by
 * construction, because the topology only holds whole groups.
 */
export function announcedHotplugRequest(topology: PcieTopology, bdfs?: readonly string[]): HotplugRequest {
  const attached = new Set(topology.ports.flatMap((p) => (p.occupant?.bdf ? [p.occupant.bdf] : [])));
  const wanted = bdfs === undefined ? undefined : new Set(bdfs);
  for (const b of wanted ?? []) {
    if (!topology.functions.some((f) => f.bdf === b)) {
      throw notFound('PCIE_DEVICE_NOT_ANNOUNCED', `PCI function ${b} was not announced when the sandbox was planned`);
    }
  }
  return {
    devices: topology.functions
      .filter((f) => f.plug === 'hot-plug' && !attached.has(f.bdf) && (wanted === undefined || wanted.has(f.bdf)))
      .map((f) => ({ driver: VFIO_PCI_DRIVER, bdf: f.bdf, needs: { ...f.needs } })),
  };
}

/**
 * A request attaching host devices that were NOT announced at sandbox time: the same group
 * expansion and refusals as at planning (selectVfioGroups), every passed member of each group.
 */
export function hotplugRequestForDevices(inventory: HostInventory, devices: readonly VfioDeviceRequest[]): HotplugRequest {
  const groups = selectVfioGroups(inventory, devices);
  return {
    devices: groups.flatMap((g) =>
      g.functions.map((bdf) => {
        const f = findFunction(inventory, bdf)!;
        return { driver: VFIO_PCI_DRIVER, bdf, needs: barNeeds(f.bars, f.romBytes) };
      }),
    ),
  };
}
