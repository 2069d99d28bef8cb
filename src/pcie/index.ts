/**
 * kata-ts PCIe planning: one read of the host (inventory.ts), then pure functions from the pod's
 * devices to a PcieTopology, its QEMU arguments and hot-plug commands.
 */
export * from './types.js';
export * from './topology-types.js';
export { readHostInventory, parseResource, classifyCharLink, type HostInventoryOptions } from './inventory.js';
export { deviceNumbersFromFile, statDeviceNumbers, decodeDevT, type DeviceNumberLookup, type DeviceNumbers } from './devnodes.js';
export { selectVfioGroups, findFunction, VFIO_PCI_DRIVER } from './resolve.js';
export {
  loadCdiSpecs,
  resolveCdiDevices,
  cdiNamesFromAnnotations,
  parseQualifiedName,
  type CdiRegistry,
  type CdiWarning,
  type CdiDeviceEntry,
  type CdiNameRequest,
  type CdiResolution,
} from './cdi.js';
export { podVfioDevices, discoverPodVfioDevices, cdiNamesFromKubelet, type PodVfioDevices, type PodDeviceInputs, type PodResourceConfigLike, type PodDeviceSource, type DiscoverOptions } from './pod-devices.js';
export { getKubeletPodResources, loadPodResourcesApi, type KubeletPodResources } from './podresources.js';
export { planPcieTopology, type PcieTopologyInput, ROOT_PORT_FIRST_SLOT, ROOT_PORT_LAST_SLOT, MMIO32_BUDGET_BYTES } from './topology.js';
export { barNeeds, capacityFor, fitsCapacity } from './reserve.js';
export { pcieQemuArgs, pcieQemuArgsWithoutVfio, pciAddr } from './qemu-args.js';
export { describeTopology, describeTopologyText, type PcieDescription } from './describe.js';
export {
  planHotplug,
  planHotUnplug,
  announcedHotplugRequest,
  hotplugRequestForDevices,
  type HotplugDevice,
  type HotplugRequest,
  type HotplugPlan,
  type QmpCommandPlan,
} from './hotplug.js';
export { planPodPcie, readPcieHostFacts, inventoryOptionsForRoot, type PcieHostFacts, type PodPcieInput, type PodPciePlan } from './plan.js';
