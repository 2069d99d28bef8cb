/**
 * Reason codes (`KataError.reason`) raised by host inventory, CDI, the kubelet PodResources client, topology and hot-plug planning.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type PcieReason =
  | 'CDI_DEVICE_CONFLICT'
  | 'CDI_DEVICE_UNKNOWN'
  | 'CDI_NAME_INVALID'
  | 'DEVICE_NOT_VFIO'
  | 'IOMMU_GROUP_EMPTY'
  | 'IOMMU_GROUP_NOT_VIABLE'
  | 'IOMMU_GROUP_UNKNOWN'
  | 'IOMMU_MISSING'
  | 'KUBELET_PODRESOURCES_TIMEOUT'
  | 'KUBELET_PODRESOURCES_UNAVAILABLE'
  | 'PCIE_BUS_NUMBERS_EXHAUSTED'
  | 'PCIE_CONFIDENTIAL_HOTPLUG'
  | 'PCIE_DEVICE_ATTACHED'
  | 'PCIE_DEVICE_ID_IN_USE'
  | 'PCIE_DEVICE_NOT_ANNOUNCED'
  | 'PCIE_DEVICE_NOT_ATTACHED'
  | 'PCIE_DEV_NUMBERS_FILE'
  | 'PCIE_HOTPLUG_CONFIDENTIAL'
  | 'PCIE_HOTPLUG_DRIVER'
  | 'PCIE_HOTPLUG_EMPTY'
  | 'PCIE_HOTPLUG_NO_PORT'
  | 'PCIE_MMIO32_EXHAUSTED'
  | 'PCIE_ROOT_SLOTS_EXHAUSTED'
  | 'PCIE_SYSFS_ROOT_MISSING'
  | 'PCIE_SYSFS_UNREADABLE'
  | 'PCI_ADDRESS_INVALID'
  | 'PCI_DEVICE_UNKNOWN'
  | 'VFIO_NODE_UNKNOWN'
  | 'VFIO_PATH_INVALID';

declare module '../common/errors.js' {
  interface KataReasons {
    pcie: PcieReason;
  }
}
