/**
 * Every planned topology starts in real QEMU (TCG, q35, no guest kernel), without the vfio-pci
 * devices themselves: there is no VFIO hardware here, so those stay argv-only (checked by the
 * goldens). QMP query-pci must show each port on its planned bus, slot and function, the
 * firmware's windows must honour the planned reserves, and an emulated PCIe NIC (e1000e) added
 * with device_add through the hot-plug planner must appear behind its reserved port.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { QmpPciBus } from '../../../src/hypervisor/qmp/types.js';
import {
  announcedHotplugRequest,
  barNeeds,
  type PcieTopology,
  pcieQemuArgsWithoutVfio,
  planHotplug,
  planPcieTopology,
} from '../../../src/pcie/index.js';
import { KiB } from '../../../src/pcie/pci.js';
import { PCIE_CASES } from '../../helpers/pcie-cases.js';
import { fixtureInventory } from '../../helpers/pcie-golden.js';
import { type BareQemu, flattenPci, type PciNode, startBareQemu } from '../../helpers/pcie-qemu.js';

/** e1000e as QEMU 7.2 exposes it (BAR0/1 128 KiB, BAR2 32 B I/O, BAR3 16 KiB, ROM 256 KiB). */
const E1000E = barNeeds(
  [
    { index: 0, barBytes: 128 * KiB, kind: 'mem', prefetchable: false, is64bit: false },
    { index: 1, barBytes: 128 * KiB, kind: 'mem', prefetchable: false, is64bit: false },
    { index: 2, barBytes: 32, kind: 'io', prefetchable: false, is64bit: false },
    { index: 3, barBytes: 16 * KiB, kind: 'mem', prefetchable: false, is64bit: false },
  ],
  256 * KiB,
);
const E1000E_ID = { vendor: 0x8086, device: 0x10d3 };

let vm: BareQemu | undefined;
afterEach(async () => {
  await vm?.stop();
  vm = undefined;
});

const size = (r: { base: number; limit: number }): number => (r.limit > r.base ? r.limit - r.base + 1 : 0);

function byId(nodes: PciNode[]): Map<string, PciNode> {
  return new Map(nodes.filter((n) => n.dev.qdev_id !== '').map((n) => [n.dev.qdev_id, n]));
}

/** Every port and switch where the plan put it: parent bus, slot, function. */
function expectPlacement(t: PcieTopology, nodes: Map<string, PciNode>): void {
  for (const p of t.ports) {
    const n = nodes.get(p.id);
    expect(n, `${p.id} missing from query-pci`).toBeDefined();
    expect({ parent: n!.parent, slot: n!.dev.slot, fn: n!.dev.function, cls: n!.dev.class_info.class }, p.id).toEqual({
      parent: p.bus,
      slot: p.slot,
      fn: p.function,
      cls: 0x0604,
    });
  }
  for (const s of t.switches) {
    const n = nodes.get(s.id);
    expect({ parent: n?.parent, slot: n?.dev.slot }, s.id).toEqual({ parent: s.rootPortId, slot: 0 });
  }
}

/**
 * The firmware's windows honour the plan: root ports with io-reserve=0 get no I/O window, and a
 * hot-plug root port's windows are at least the reserve and contain a naturally aligned slot
 * for the largest BAR announced for it (the 32 GiB / 128 GiB GPU case).
 */
function expectWindows(t: PcieTopology, nodes: Map<string, PciNode>): void {
  for (const p of t.ports.filter((x) => x.driver === 'pcie-root-port')) {
    const bus = nodes.get(p.id)!.dev.pci_bridge!.bus;
    if (p.reserve.ioBytes === 0 && p.use !== 'cold-plug') expect(size(bus.io_range), `${p.id} I/O window`).toBe(0);
    if (p.reserve.memBytes !== null) expect(size(bus.memory_range), `${p.id} memory window`).toBeGreaterThanOrEqual(p.reserve.memBytes);
    if (p.reserve.pref64Bytes !== null && p.reserve.pref64Bytes > 0) {
      const pref = bus.prefetchable_range;
      expect(size(pref), `${p.id} prefetchable window`).toBeGreaterThanOrEqual(p.reserve.pref64Bytes);
      const fn = t.functions.find((f) => f.portId === p.id);
      const largest = fn?.needs.pref64LargestBytes ?? 0;
      if (largest > 0) {
        const aligned = Math.ceil(pref.base / largest) * largest;
        expect(
          aligned + largest - 1,
          `${p.id}: aligned ${largest}-byte BAR inside [${pref.base.toString(16)}, ${pref.limit.toString(16)}]`,
        ).toBeLessThanOrEqual(pref.limit);
      }
    }
  }
}

async function queryTree(v: BareQemu): Promise<PciNode[]> {
  const buses: QmpPciBus[] = await v.qmp.queryPci();
  return flattenPci(buses[0]!.devices);
}

const REAL_CASES = [
  'gpu-audio-hotplug-root',
  'gpu-audio-coldplug-confidential',
  'bridge-group-coldplug-root',
  'hgx-8gpu-hotplug-root',
  'hgx-8gpu-hotplug-switch',
  'sriov-20vf-coldplug-root',
  'sriov-40vf-hotplug-root',
  'sriov-40vf-hotplug-switch',
];

describe('planned PCIe topologies in real QEMU (vfio-pci not started: no VFIO hardware)', () => {
  for (const name of REAL_CASES) {
    const c = PCIE_CASES.find((x) => x.name === name)!;
    it(`${name}: ports on the planned buses/slots, windows as reserved${c.profile.confidential ? '' : ', e1000e hot-plugged onto a reserved port'} (vfio-pci not started: no VFIO hardware)`, async () => {
      const t = planPcieTopology({ inventory: await fixtureInventory(c.tree), devices: c.devices, profile: c.profile });
      vm = await startBareQemu(pcieQemuArgsWithoutVfio(t));

      // Paused at reset (-S): the root ports are already on pcie.0 at their planned addresses.
      const atReset = byId(await queryTree(vm));
      for (const p of t.ports.filter((x) => x.bus === 'pcie.0')) {
        expect([atReset.get(p.id)?.dev.slot, atReset.get(p.id)?.dev.function], p.id).toEqual([p.slot, p.function]);
      }

      // query-pci lists what sits behind a bridge only once its secondary bus number is set, which
      // the firmware (SeaBIOS, no guest kernel) does after `cont`, with the windows.
      await vm.qmp.cont();
      expect(await vm.firmwarePciInit()).toBe('done');
      const bridges = t.ports.length + t.switches.length;
      const nodes = byId(await queryTree(vm));
      expectPlacement(t, nodes);
      expectWindows(t, nodes);
      const secondaries = [...nodes.values()].map((n) => n.dev.pci_bridge?.bus.secondary).filter((s) => s !== undefined);
      expect(new Set(secondaries).size, 'distinct bus numbers').toBe(bridges);
      expect(Math.max(...(secondaries as number[])) + 1).toBeLessThanOrEqual(t.usage.busNumbers);

      if (t.confidential) return;
      const plan = planHotplug(t, { devices: [{ driver: 'e1000e', qemuId: 'nic0', needs: E1000E }] });
      const target = plan.placements[0]!.portId;
      expect(t.ports.find((p) => p.id === target)!.use).toBe('spare');
      for (const cmd of plan.commands) await vm.qmp.deviceAdd(cmd.arguments);
      const after = byId(await queryTree(vm));
      const nic = after.get('nic0');
      expect(nic, 'nic0 in query-pci').toBeDefined();
      expect({ parent: nic!.parent, slot: nic!.dev.slot, vendor: nic!.dev.id.vendor, device: nic!.dev.id.device }).toEqual({
        parent: target,
        slot: 0,
        ...E1000E_ID,
      });
    });
  }

  it('a 32-bit MMIO layout just under the planner budget (58 x 16 MiB) gets every window from the firmware (vfio-pci not started: no VFIO hardware)', async () => {
    const inv = await fixtureInventory('gpu-audio');
    const t = planPcieTopology({ inventory: inv, devices: [], profile: { ...PCIE_CASES[0]!.profile, sparePorts: 58 } });
    expect(t.ports).toHaveLength(58);
    vm = await startBareQemu(pcieQemuArgsWithoutVfio(t));
    await vm.qmp.cont();
    expect(await vm.firmwarePciInit()).toBe('done');
    const nodes = byId(await queryTree(vm));
    expectPlacement(t, nodes);
    expectWindows(t, nodes);
  });

  it('past the budget (58 ports x 18 MiB = 1044 MiB below 4 GiB) SeaBIOS halts out of 32-bit space: why the planner refuses there (vfio-pci not started: no VFIO hardware)', async () => {
    const inv = await fixtureInventory('gpu-audio');
    const ok = planPcieTopology({ inventory: inv, devices: [], profile: { ...PCIE_CASES[0]!.profile, sparePorts: 58 } });
    // The planner would refuse this; build it by hand to show the limit is the firmware's.
    const over: PcieTopology = structuredClone(ok);
    for (const p of over.ports) p.reserve.memBytes = 18 * 1024 * 1024;
    vm = await startBareQemu(pcieQemuArgsWithoutVfio(over));
    await vm.qmp.cont();
    // SeaBIOS halts: this VM would never boot.
    expect(await vm.firmwarePciInit()).toBe('out-of-32bit');
  });

  it("the announced-device path: a VF's reserved port takes the device CreateContainer would add, e1000e standing in for vfio-pci (vfio-pci simulated: no VFIO hardware)", async () => {
    const c = PCIE_CASES.find((x) => x.name === 'sriov-40vf-hotplug-root')!;
    const t = planPcieTopology({ inventory: await fixtureInventory(c.tree), devices: c.devices, profile: c.profile });
    // The same request CreateContainer builds, with only the driver swapped (no VFIO hardware).
    // The last announced VF (vf39 = 0000:3b:05.1) has port rp39 reserved for it.
    const request = announcedHotplugRequest(t, ['0000:3b:05.1']);
    const plan = planHotplug(t, { devices: request.devices.map((d) => ({ ...d, driver: 'e1000e', needs: E1000E })) });
    expect(plan.placements).toEqual([{ qemuId: 'dev-rp39', portId: 'rp39' }]);
    expect(t.ports.find((p) => p.id === 'rp39')!.reservedFor).toBe('0000:3b:05.1');
    vm = await startBareQemu(pcieQemuArgsWithoutVfio(t));
    await vm.qmp.cont();
    expect(await vm.firmwarePciInit()).toBe('done');
    for (const cmd of plan.commands) await vm.qmp.deviceAdd(cmd.arguments);
    const dev = byId(await queryTree(vm)).get('dev-rp39');
    expect({ parent: dev?.parent, slot: dev?.dev.slot, vendor: dev?.dev.id.vendor }).toEqual({
      parent: 'rp39',
      slot: 0,
      vendor: E1000E_ID.vendor,
    });
  });
});
