import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { VmProcess } from '../../hypervisor/index.js';
import {
  announcedHotplugRequest,
  type HotplugPlan,
  hotplugRequestForDevices,
  type PcieHostFacts,
  type PcieTopology,
  planHotplug,
  planHotUnplug,
  podVfioDevices,
  selectVfioGroups,
} from '../../pcie/index.js';
import type { ContainerSpec } from '../spec/container.js';
import type { AttachedDevice } from './record.js';

/**
 * The hot-plug a container needs (pure, on a copy of the topology): its VFIO devices (device nodes
 * and CDI devices) expanded to whole IOMMU groups, minus functions already in the VM (cold-plugged
 * at boot), onto ports reserved for them at boot (announced) or spare ports (not announced).
 * Undefined when the container brings no VFIO device or everything is already attached.
 */
export function planContainerHotplug(
  topology: PcieTopology,
  config: Pick<ContainerSpec, 'metadata' | 'devices' | 'CDI_devices'>,
  facts: PcieHostFacts,
  simulateVfioWith: string | null,
): HotplugPlan | undefined {
  const { name } = config.metadata;
  const { requests } = podVfioDevices({
    podResources: { containers: [{ name, devices: config.devices, CDI_devices: config.CDI_devices }] },
    cdi: facts.cdi,
  });
  if (requests.length === 0) return undefined;
  const inVm = new Set(topology.ports.flatMap((p) => (p.occupant?.bdf ? [p.occupant.bdf] : [])));
  const wanted = selectVfioGroups(facts.inventory, requests)
    .flatMap((g) => g.functions)
    .filter((bdf) => !inVm.has(bdf));
  if (wanted.length === 0) return undefined;
  const announced = new Set(topology.functions.map((f) => f.bdf));
  const request = wanted.every((bdf) => announced.has(bdf))
    ? announcedHotplugRequest(topology, wanted)
    : hotplugRequestForDevices(facts.inventory, requests);
  if (simulateVfioWith !== null) {
    // No VFIO hardware on this host: the emulated model takes each function's port instead.
    request.devices = request.devices.map((d) => ({ ...d, driver: simulateVfioWith }));
  }
  return planHotplug(topology, request);
}

/**
 * host_path of each VFIO group node a container names -> the host functions of that group (the
 * ones the hot-plug placed), for planGuestDevices. `/dev/vfio/vfio` names no group.
 */
export function vfioGroupFunctions(
  inventory: PcieHostFacts['inventory'],
  devices: ReadonlyArray<{ host_path: string }>,
): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const d of devices) {
    if (!d.host_path.startsWith('/dev/vfio/') || d.host_path === '/dev/vfio/vfio') continue;
    out[d.host_path] = selectVfioGroups(inventory, [{ hostPath: d.host_path, origin: `device ${d.host_path}` }]).flatMap(
      (g) => g.functions,
    );
  }
  return out;
}

/**
 * Send a hot-plug plan's device_add commands. All or nothing: when one fails, the ones already
 * added are removed again (device_del, waiting for DEVICE_DELETED) before the error is rethrown.
 */
export async function applyHotplug(vm: VmProcess, plan: HotplugPlan, logger: Logger, unplugTimeoutMs: number): Promise<AttachedDevice[]> {
  const added: AttachedDevice[] = [];
  try {
    for (const cmd of plan.commands) {
      const args = cmd.arguments;
      await vm.qmp.deviceAdd(args);
      added.push({ qemuId: args.id, portId: args.bus, driver: args.driver, bdf: args.host ?? bdfOf(plan, args.id) });
    }
    return added;
  } catch (err) {
    for (const d of added.reverse()) {
      await vm.qmp
        .deviceDelAndWait(d.qemuId, unplugTimeoutMs)
        .catch((e: unknown) => logger.error({ device: d.qemuId, err: errorMessage(e) }, 'rollback of a hot-plugged device failed'));
    }
    throw err;
  }
}

function bdfOf(plan: HotplugPlan, qemuId: string): string | null {
  return plan.topology.ports.find((p) => p.occupant?.qemuId === qemuId)?.occupant?.bdf ?? null;
}

/** Detach a container's devices (device_del + DEVICE_DELETED each) and return the topology after. */
export async function detachDevices(
  vm: VmProcess,
  topology: PcieTopology,
  devices: AttachedDevice[],
  timeoutMs: number,
): Promise<PcieTopology> {
  const plan = planHotUnplug(
    topology,
    devices.map((d) => d.qemuId),
  );
  for (const cmd of plan.commands) await vm.qmp.deviceDelAndWait(cmd.arguments.id, timeoutMs);
  return plan.topology;
}
