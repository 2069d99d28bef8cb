/**
 * The host's PCI and VFIO facts as read once from sysfs and /dev (see inventory.ts), and what a
 * pod asks for. Everything here is plain JSON data so plans can print and persist it.
 */

/** One BAR (or the expansion ROM) of a function, decoded from sysfs `resource`. */
export interface PciBar {
  /** 0-5 for BARs, 6 for the expansion ROM. */
  index: number;
  barBytes: number;
  kind: 'io' | 'mem';
  prefetchable: boolean;
  /** A 64-bit memory BAR: it can live above 4 GiB. */
  is64bit: boolean;
}

/** One PCI function under `bus/pci/devices/<bdf>`. */
export interface PciFunction {
  /** `0000:3b:00.0` */
  bdf: string;
  /** 24-bit class code (`0x030200`: 3D controller). */
  classCode: number;
  vendorId: number;
  deviceId: number;
  /** Basename of the `driver` link (`vfio-pci`, `nvidia`, `pcieport`), null when unbound. */
  driver: string | null;
  /** null when the platform reports -1 (no NUMA affinity). */
  numaNode: number | null;
  configSpaceBytes: number;
  /** Extended (4 KiB) config space: a PCIe function, not conventional PCI. */
  isPcie: boolean;
  /** BARs with a size, index order; ROM not included (see romBytes). */
  bars: PciBar[];
  romBytes: number;
  /** Basename of the `iommu_group` link; null without an IOMMU. */
  iommuGroup: number | null;
  /** The bridge this function sits behind (parent directory in /sys/devices), if any. */
  parentBdf: string | null;
  /** For an SR-IOV virtual function: its physical function (`physfn` link). */
  physfn: string | null;
  /** iommufd character device of this function (`/dev/vfio/devices/vfio3`), when bound to vfio-pci. */
  vfioCdevPath: string | null;
}

export interface IommuGroup {
  id: number;
  /** BDFs of every member, sorted. */
  members: string[];
}

/** What a VFIO device node under /dev/vfio stands for, as resolved through /sys/dev/char. */
export type VfioNodeTarget =
  | { kind: 'group'; group: number }
  | { kind: 'cdev'; bdf: string }
  | { kind: 'container' }
  | { kind: 'noiommu-group'; group: number }
  | { kind: 'unknown' };

export interface VfioDevNode {
  /** Host path as CDI specs and pod_resources spell it (`/dev/vfio/12`), whatever devRoot was. */
  path: string;
  major: number;
  minor: number;
  /** Target of `<sysfs>/dev/char/<major>:<minor>`, relative spelling as the kernel gives it. */
  sysfsLink: string | null;
  target: VfioNodeTarget;
}

export interface HostInventory {
  sysfsRoot: string;
  devRoot: string;
  /** True when `kernel/iommu_groups` has at least one group. */
  iommuEnabled: boolean;
  /** Every PCI function, sorted by BDF. */
  functions: PciFunction[];
  /** Every IOMMU group, sorted by id. */
  groups: IommuGroup[];
  /** Character devices found under `<devRoot>/vfio` and `<devRoot>/vfio/devices`, sorted by path. */
  vfioNodes: VfioDevNode[];
  /** Things that looked odd but did not stop the read (unreadable optional files, ...). */
  warnings: string[];
}

/**
 * One VFIO device a pod brings: a VFIO node path (`/dev/vfio/<group>`,
 * `/dev/vfio/devices/vfioN`) or a PCI address. `origin` says who asked, for messages.
 */
export interface VfioDeviceRequest {
  hostPath?: string;
  bdf?: string;
  /** e.g. `container "train" device /dev/vfio/12` or `CDI nvidia.com/gpu=0 (annotation cdi.k8s.io/gpu)` */
  origin: string;
}

/** Why a member of a requested IOMMU group stays on the host. */
export type LeftOutReason = 'bridge' | 'unbound' | 'pci-stub';

/** A requested IOMMU group after expansion and the viability checks. */
export interface SelectedVfioGroup {
  group: number;
  /** Members that go to the VM (bound to vfio-pci), sorted by BDF. */
  functions: string[];
  leftOut: Array<{ bdf: string; reason: LeftOutReason }>;
  /** Every request that named this group, in request order. */
  origins: string[];
}
