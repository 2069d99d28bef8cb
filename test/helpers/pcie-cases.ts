/**
 * The PCIe plan cases shared by the golden unit tests and the real-QEMU integration tests: each
 * names a fixtures/sysfs tree, the devices a pod brings and a handler profile.
 */
import { confidentialHandlerProfile, defaultHandlerProfile } from '../../src/config/defaults.js';
import type { HandlerPcieConfig } from '../../src/config/types.js';
import type { VfioDeviceRequest } from '../../src/pcie/index.js';

export interface PcieCase {
  name: string;
  tree: string;
  devices: VfioDeviceRequest[];
  profile: HandlerPcieConfig & { confidential: boolean };
}

const hotplug = (over: Partial<HandlerPcieConfig> = {}): PcieCase['profile'] => ({
  ...defaultHandlerProfile().pcie,
  confidential: false,
  ...over,
});
const confidential = (): PcieCase['profile'] => ({ ...confidentialHandlerProfile().pcie, confidential: true });
const dev = (hostPath: string): VfioDeviceRequest => ({ hostPath, origin: 'test' });
const vfs = (n: number): VfioDeviceRequest[] => Array.from({ length: n }, (_, i) => dev(`/dev/vfio/devices/vfio${i}`));
const hgx = [20, 21, 22, 23, 24, 25, 26, 27, 30, 31, 32, 33].map((g) => dev(`/dev/vfio/${g}`));

export const PCIE_CASES: PcieCase[] = [
  { name: 'gpu-audio-hotplug-root', tree: 'gpu-audio', devices: [dev('/dev/vfio/12')], profile: hotplug() },
  { name: 'gpu-audio-coldplug-confidential', tree: 'gpu-audio', devices: [dev('/dev/vfio/12')], profile: confidential() },
  {
    name: 'bridge-group-coldplug-root',
    tree: 'bridge-group',
    devices: [dev('/dev/vfio/8')],
    profile: hotplug({ vfioPolicy: 'cold-plug', sparePorts: 1 }),
  },
  { name: 'hgx-8gpu-hotplug-root', tree: 'hgx-8gpu', devices: hgx, profile: hotplug() },
  { name: 'hgx-8gpu-hotplug-switch', tree: 'hgx-8gpu', devices: hgx, profile: hotplug({ portType: 'switch-port' }) },
  { name: 'hgx-8gpu-coldplug-confidential', tree: 'hgx-8gpu', devices: hgx, profile: confidential() },
  { name: 'sriov-40vf-hotplug-root', tree: 'sriov-nic', devices: vfs(40), profile: hotplug() },
  { name: 'sriov-40vf-hotplug-switch', tree: 'sriov-nic', devices: vfs(40), profile: hotplug({ portType: 'switch-port' }) },
  { name: 'sriov-20vf-coldplug-root', tree: 'sriov-nic', devices: vfs(20), profile: hotplug({ vfioPolicy: 'cold-plug', sparePorts: 4 }) },
];
