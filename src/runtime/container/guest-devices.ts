/**
 * CRI devices -> what the guest agent must put into the container's spec (pure). The host cannot
 * write `linux.devices` itself: the device nodes a hot-plugged function gets in the guest (the
 * guest's `/dev/vfio/<group>`, its major and minor) exist only once the guest kernel has bound
 * it, and majors are allocated by that kernel. So the host names each device by something stable
 * (the guest PCI path of the port it plugged the function into), and the agent resolves it to a
 * node and adds the node and its device cgroup rule before `crun create`
 * (guest/agent/containers/devices.ts). The result is the agent API's own `GuestDevice` message,
 * sent in CreateContainerRequest.devices.
 */
import path from 'node:path';
import { invalid } from '../../common/errors.js';
import type { GuestDevice, GuestDeviceKind } from '../../generated/agent/agent.js';
import type { PciePort, PcieTopology } from '../../pcie/index.js';

/** What the host knows about a CRI device's host_path (lstat, read by the caller). */
export type HostNodeType = 'char' | 'block' | 'other' | 'missing';

export interface GuestDevicesInput {
  devices: ReadonlyArray<{ container_path: string; host_path: string; permissions: string }>;
  /** The VM's topology once the container's hot-plug is applied (planned topology is fine). */
  topology: PcieTopology | undefined;
  /** host_path of a VFIO group node -> the host functions (BDFs) of that group. */
  vfioFunctions: Readonly<Record<string, readonly string[]>>;
  /** host_path -> what it is on the host. */
  hostNodeTypes: Readonly<Record<string, HostNodeType>>;
}

const VFIO_CONTAINER = '/dev/vfio/vfio';

function fieldError(reason: 'CONTAINER_DEVICE_INVALID' | 'CONTAINER_DEVICE_UNSUPPORTED', field: string, text: string) {
  return invalid(reason, `${field} ${text}.`, { details: { field } });
}

/**
 * One agent device per CRI device, in order. Refused (INVALID_ARGUMENT, naming the field): a relative
 * container_path, permissions other than r/w/m, a host block device (kata-ts hot-plugs no block
 * devices: the guest node of that name would be one of the guest's own disks), a VFIO group with
 * no function in the VM, and a host path that is not a character device.
 */
export function planGuestDevices(input: GuestDevicesInput): GuestDevice[] {
  return input.devices.map((d, i): GuestDevice => {
    const field = `container.devices[${i}]`;
    const access = d.permissions === '' ? 'rwm' : d.permissions;
    if (!/^(?!.*(.).*\1)[rwm]{1,3}$/.test(access))
      throw fieldError('CONTAINER_DEVICE_INVALID', `${field}.permissions`, `is "${access}", not a combination of r, w and m`);
    if (!path.posix.isAbsolute(d.container_path))
      throw fieldError('CONTAINER_DEVICE_INVALID', `${field}.container_path`, `is "${d.container_path}", not an absolute path`);
    const hostPath = path.posix.normalize(d.host_path);
    const containerPath = path.posix.normalize(d.container_path);
    // Every field present, in the message's order: what the agent decodes, and what the goldens show.
    const device = (kind: GuestDeviceKind, pciPaths: string[] = [], guestPath = ''): GuestDevice => ({
      containerPath,
      access,
      kind,
      pciPaths,
      guestPath,
    });
    if (hostPath === VFIO_CONTAINER) return device('GUEST_DEVICE_KIND_VFIO_CONTAINER');
    if (hostPath.startsWith('/dev/vfio/')) {
      const functions = input.vfioFunctions[d.host_path] ?? input.vfioFunctions[hostPath] ?? [];
      const { topology } = input;
      const pciPaths = functions.flatMap((bdf) => {
        const port = topology?.ports.find((p) => p.occupant?.bdf === bdf);
        return topology === undefined || port === undefined ? [] : [`${portPath(topology, port)}/00.0`];
      });
      if (pciPaths.length === 0)
        throw fieldError(
          'CONTAINER_DEVICE_UNSUPPORTED',
          `${field}.host_path`,
          `is "${d.host_path}", but no function of that group is in the VM`,
        );
      return device('GUEST_DEVICE_KIND_VFIO_GROUP', pciPaths);
    }
    const type = input.hostNodeTypes[d.host_path] ?? 'missing';
    if (type === 'block')
      throw fieldError(
        'CONTAINER_DEVICE_UNSUPPORTED',
        `${field}.host_path`,
        `is "${d.host_path}", a host block device; kata-ts passes no block device into the pod VM`,
      );
    if (type !== 'char') throw fieldError('CONTAINER_DEVICE_INVALID', `${field}.host_path`, `is "${d.host_path}", not a character device`);
    return device('GUEST_DEVICE_KIND_GUEST_NODE', [], hostPath);
  });
}

/** `SS.F` hops from the root bus to a port: root port, or root port / switch upstream / downstream. */
export function portPath(topology: PcieTopology, port: PciePort): string {
  const hop = (p: PciePort) => `${p.slot.toString(16).padStart(2, '0')}.${p.function.toString(16)}`;
  if (port.bus === topology.rootBus) return hop(port);
  const sw = topology.switches.find((s) => s.id === port.bus);
  const root = sw === undefined ? undefined : topology.ports.find((p) => p.id === sw.rootPortId);
  if (root === undefined) return hop(port); // not a layout the planner makes; the agent will not find it
  // The switch's upstream port is the only device behind its root port: 00.0.
  return `${hop(root)}/00.0/${hop(port)}`;
}
