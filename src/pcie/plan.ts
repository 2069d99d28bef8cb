import path from 'node:path';
import { pathExists } from '../common/fsutil.js';
import type { HandlerPcieConfig, PcieHostConfig } from '../config/types.js';
import { type CdiRegistry, loadCdiSpecs } from './cdi.js';
import { describeTopology, describeTopologyText, type PcieDescription } from './describe.js';
import { type HostInventoryOptions, readHostInventory } from './inventory.js';
import { type PodDeviceInputs, type PodVfioDevices, podVfioDevices } from './pod-devices.js';
import { pcieQemuArgs } from './qemu-args.js';
import { planPcieTopology } from './topology.js';
import type { PcieTopology } from './topology-types.js';
import type { HostInventory } from './types.js';

/** Everything the PCIe planner reads from the host, read once. */
export interface PcieHostFacts {
  inventory: HostInventory;
  cdi: CdiRegistry;
}

/**
 * Inventory options for `--sysfs-root DIR`: a fixture tree (DIR/sys, DIR/dev and
 * DIR/dev-numbers.json, as fixtures/sysfs/<name>/ holds) uses all three; any other DIR is a sysfs
 * root and the host's /dev (or `devRoot`) holds the nodes.
 */
export async function inventoryOptionsForRoot(dir: string, devRoot = '/dev'): Promise<HostInventoryOptions> {
  const numbers = path.join(dir, 'dev-numbers.json');
  if ((await pathExists(path.join(dir, 'sys'))) && (await pathExists(numbers))) {
    return { sysfsRoot: path.join(dir, 'sys'), devRoot: path.join(dir, 'dev'), devNumbersFile: numbers };
  }
  return { sysfsRoot: dir, devRoot };
}

/** The one read: sysfs/dev inventory and the CDI specs of the configured directories. */
export async function readPcieHostFacts(config: PcieHostConfig, inventoryOptions?: HostInventoryOptions): Promise<PcieHostFacts> {
  const [inventory, cdi] = await Promise.all([
    readHostInventory(
      inventoryOptions ?? {
        sysfsRoot: config.sysfsRoot,
        devRoot: config.devRoot,
        ...(config.devNumbersFile === null ? {} : { devNumbersFile: config.devNumbersFile }),
      },
    ),
    loadCdiSpecs(config.cdiSpecDirs),
  ]);
  return { inventory, cdi };
}

export interface PodPcieInput extends Omit<PodDeviceInputs, 'cdi'> {
  facts: PcieHostFacts;
  profile: HandlerPcieConfig & { confidential: boolean };
  /** See PcieHostConfig.simulateVfioWith. */
  simulateVfioWith?: string | null;
}

/** The `pcie` part of a sandbox plan: devices found, topology, QEMU arguments, description. */
export interface PodPciePlan {
  devices: PodVfioDevices;
  topology: PcieTopology;
  /** `-device` pairs for the argv builder (QemuArgvSpec.pcieArgs). */
  qemuArgs: string[];
  description: PcieDescription;
  text: string[];
  /** CDI specs skipped as malformed and inventory oddities, for plan output and logs. */
  warnings: string[];
}

/** Pure: which VFIO devices the pod brings, and the VM's PCIe layout for them. */
export function planPodPcie(input: PodPcieInput): PodPciePlan {
  const devices = podVfioDevices({ ...input, cdi: input.facts.cdi });
  const topology = planPcieTopology({ inventory: input.facts.inventory, devices: devices.requests, profile: input.profile });
  return {
    devices,
    topology,
    qemuArgs: pcieQemuArgs(topology, { simulateVfioWith: input.simulateVfioWith ?? null }),
    description: describeTopology(topology),
    text: describeTopologyText(topology),
    warnings: [
      ...input.facts.cdi.warnings.map((w) => `CDI spec ${w.path} skipped: ${w.problems.join('; ')}`),
      ...input.facts.inventory.warnings,
      ...devices.warnings,
    ],
  };
}
