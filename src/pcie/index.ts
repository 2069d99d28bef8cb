/**
 * kata-ts PCIe planning: one read of the host (inventory.ts), then pure functions from the pod's
 * devices to a PcieTopology, its QEMU arguments and hot-plug commands.
 */

export {
  type CdiDeviceEntry,
  type CdiNameRequest,
  type CdiRegistry,
  type CdiResolution,
  type CdiWarning,
  cdiNamesFromAnnotations,
  loadCdiSpecs,
  parseQualifiedName,
  resolveCdiDevices,
} from './cdi.js';
export { describeTopology, describeTopologyText, type PcieDescription } from './describe.js';
export { type DeviceNumberLookup, type DeviceNumbers, decodeDevT, deviceNumbersFromFile, statDeviceNumbers } from './devnodes.js';
export {
  announcedHotplugRequest,
  type DeviceAddArguments,
  type DeviceAddCommand,
  type DeviceDelCommand,
  type HotplugDevice,
  type HotplugPlan,
  type HotplugRequest,
  hotplugRequestForDevices,
  planHotplug,
  planHotUnplug,
  type QmpCommandPlan,
} from './hotplug.js';
export { classifyCharLink, type HostInventoryOptions, parseResource, readHostInventory } from './inventory.js';
export {
  inventoryOptionsForRoot,
  type PcieHostFacts,
  type PodPcieInput,
  type PodPciePlan,
  planPodPcie,
  readPcieHostFacts,
} from './plan.js';
export {
  cdiNamesFromKubelet,
  type DiscoverOptions,
  discoverPodVfioDevices,
  type PodDeviceInputs,
  type PodDeviceSource,
  type PodResourceConfigLike,
  type PodVfioDevices,
  podVfioDevices,
} from './pod-devices.js';
export { getKubeletPodResources, type KubeletPodResources, loadPodResourcesApi } from './podresources.js';
export { pciAddr, pcieQemuArgs, pcieQemuArgsWithoutVfio } from './qemu-args.js';
export { barNeeds, capacityFor, fitsCapacity } from './reserve.js';
export { findFunction, selectVfioGroups, VFIO_PCI_DRIVER } from './resolve.js';
export { MMIO32_BUDGET_BYTES, type PcieTopologyInput, planPcieTopology, ROOT_PORT_FIRST_SLOT, ROOT_PORT_LAST_SLOT } from './topology.js';
export * from './topology-types.js';
export * from './types.js';
