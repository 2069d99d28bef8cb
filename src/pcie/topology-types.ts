import type { PciePortType, VfioPlugPolicy } from '../config/types.js';
import type { SelectedVfioGroup } from './types.js';

/** What a function's BARs need from the bridge window above it, summed per window kind. */
export interface BarNeeds {
  /** I/O BARs. Optional in practice: Linux drivers of PCIe devices work from MMIO. */
  ioBytes: number;
  /** Non-prefetchable BARs (any width: a bridge's non-prefetchable window is 32-bit only),
   *  32-bit prefetchable BARs and the expansion ROM. */
  mem32Bytes: number;
  /** 64-bit prefetchable BARs: the ones that grow to 32 GiB, 128 GiB on GPUs. */
  pref64Bytes: number;
  /** Largest single BAR of each kind: a window must hold it at a naturally aligned address. */
  mem32LargestBytes: number;
  pref64LargestBytes: number;
}

/** What a port can take behind it, used by the hot-plug planner to choose a port. */
export interface PortCapacity {
  ioBytes: number;
  memBytes: number;
  pref64Bytes: number;
}

/**
 * Resource-reserve properties passed to QEMU for a pcie-root-port; null = property left out
 * (QEMU/firmware default). xio3130-downstream ports have no such properties.
 */
export interface PortReserve {
  ioBytes: number | null;
  memBytes: number | null;
  pref64Bytes: number | null;
}

/** `cold-plug`: a device attached at boot; `hot-plug`: reserved for an announced device;
 *  `spare`: reserved for anything that fits; `switch`: a root port carrying a switch. */
export type PortUse = 'cold-plug' | 'hot-plug' | 'spare' | 'switch';

/** What sits behind a port right now. */
export interface PortOccupant {
  /** QEMU device id (`dev-rp0`). */
  qemuId: string;
  driver: string;
  /** Host function for vfio-pci; null for emulated devices. */
  bdf: string | null;
  /** Attached by the argv at boot, or by QMP device_add later. */
  attached: 'boot' | 'hotplug';
  needs: BarNeeds;
}

export interface PciePort {
  /** `rp<n>` (pcie-root-port) or `swdp<n>` (xio3130-downstream). Also the name of its secondary bus. */
  id: string;
  driver: 'pcie-root-port' | 'xio3130-downstream';
  /** `pcie.0` for root ports, the switch's upstream id for downstream ports. */
  bus: string;
  /** Device and function number on that bus. */
  slot: number;
  function: number;
  /** Set on function 0 of a root-bus slot shared by several root ports. */
  multifunction: boolean;
  /** PCIe slot identity; each (chassis, physicalSlot) pair is unique (QEMU refuses duplicates). */
  chassis: number;
  physicalSlot: number;
  /** PCIe port number (Link Capabilities). */
  portNumber: number;
  use: PortUse;
  reserve: PortReserve;
  capacity: PortCapacity;
  /** BDF announced for hot-plug onto this port. */
  reservedFor: string | null;
  occupant: PortOccupant | null;
}

export interface PcieSwitch {
  /** `swup<n>`: the x3130-upstream device; also the name of its internal bus. */
  id: string;
  /** Root port the upstream sits behind. */
  rootPortId: string;
  downstreamPortIds: string[];
}

/** A host function the plan passes to the VM. */
export interface PlannedFunction {
  bdf: string;
  group: number;
  vendorId: number;
  deviceId: number;
  classCode: number;
  numaNode: number | null;
  needs: BarNeeds;
  plug: VfioPlugPolicy;
  portId: string;
}

export interface PcieUsage {
  /** Bus numbers the layout consumes (root bus + one per bridge secondary bus). */
  busNumbers: number;
  busNumbersMax: number;
  /** Root-bus slots used by root ports, out of those reserved for them. */
  rootSlots: number;
  rootSlotsMax: number;
  /** Ports that open an I/O window (4 KiB each out of 64 KiB of I/O space). */
  ioWindows: number;
  /** 32-bit memory the root ports' windows ask for (below 4 GiB). */
  mmio32Bytes: number;
  mmio32BudgetBytes: number;
  /** 64-bit prefetchable memory the root ports' windows ask for. */
  mmio64Bytes: number;
}

/** The decided PCIe layout of one VM: what the argv creates and the hot-plug planner fills. */
export interface PcieTopology {
  version: 1;
  machine: 'q35';
  rootBus: 'pcie.0';
  policy: VfioPlugPolicy;
  portType: PciePortType;
  confidential: boolean;
  /** Root ports in address order, then downstream ports per switch: the argv order. */
  ports: PciePort[];
  switches: PcieSwitch[];
  functions: PlannedFunction[];
  groups: SelectedVfioGroup[];
  usage: PcieUsage;
  /** Facts worth a line in `kata-ts plan` (I/O windows skipped, large 64-bit windows, ...). */
  notes: string[];
}
