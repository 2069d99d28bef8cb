/**
 * Wire shapes of the QMP messages and replies kata-ts uses, with QEMU's own (hyphenated) field
 * names, as QEMU 7.2 sends them. Only the fields we read are typed; QEMU may send more.
 */

/** The greeting QEMU sends first on every QMP connection. */
export interface QmpGreeting {
  version: {
    qemu: { major: number; minor: number; micro: number };
    package: string;
  };
  capabilities: string[];
}

/** An asynchronous event (SHUTDOWN, STOP, RESUME, DEVICE_DELETED, ...). */
export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
  timestamp: { seconds: number; microseconds: number };
}

/** `query-status`. */
export interface QmpStatusInfo {
  /** `prelaunch` (paused by -S before the first `cont`), `running`, `paused`, `shutdown`, ... */
  status: string;
  running: boolean;
  singlestep?: boolean;
}

/** One entry of `query-cpus-fast`. */
export interface QmpCpuInfoFast {
  'cpu-index': number;
  'qom-path': string;
  'thread-id': number;
  props?: QmpCpuInstanceProperties;
  target: string;
}

/** Topology coordinates of a CPU slot (`props` of query-cpus-fast / query-hotpluggable-cpus). */
export interface QmpCpuInstanceProperties {
  'node-id'?: number;
  'socket-id'?: number;
  'die-id'?: number;
  'cluster-id'?: number;
  'core-id'?: number;
  'thread-id'?: number;
}

/** One entry of `query-hotpluggable-cpus`; `qom-path` is present when the slot is occupied. */
export interface QmpHotpluggableCpu {
  type: string;
  'vcpus-count': number;
  props: QmpCpuInstanceProperties;
  'qom-path'?: string;
}

/** `query-memory-size-summary`: boot RAM and RAM added later (DIMMs, virtio-mem), in bytes. */
export interface QmpMemorySizeSummary {
  'base-memory': number;
  'plugged-memory'?: number;
}

/** A PCI bus as `query-pci` reports it. */
export interface QmpPciBus {
  bus: number;
  devices: QmpPciDevice[];
}

export interface QmpPciRange {
  base: number;
  limit: number;
}

export interface QmpPciDevice {
  bus: number;
  slot: number;
  function: number;
  class_info: { class: number; desc?: string };
  id: { device: number; vendor: number; subsystem?: number; 'subsystem-vendor'?: number };
  irq?: number;
  irq_pin?: number;
  qdev_id: string;
  pci_bridge?: {
    bus: {
      number: number;
      secondary: number;
      subordinate: number;
      io_range: QmpPciRange;
      memory_range: QmpPciRange;
      prefetchable_range: QmpPciRange;
    };
    devices?: QmpPciDevice[];
  };
  regions: Array<{ bar: number; type: string; address: number; size: number; prefetch?: boolean; mem_type_64?: boolean }>;
}

/** `device_add` arguments: the driver, an id we choose, and driver properties. */
export interface QmpDeviceAddArgs {
  driver: string;
  id: string;
  bus?: string;
  addr?: string;
  [property: string]: unknown;
}

/** `object-add` arguments: the QOM type, an id we choose, and the object's properties. */
export interface QmpObjectAddArgs {
  'qom-type': string;
  id: string;
  [property: string]: unknown;
}
