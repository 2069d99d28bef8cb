import { describe, expect, it } from 'vitest';
import { confidentialHandlerProfile, defaultHandlerProfile } from '../../../src/config/defaults.js';
import type { HandlerPcieConfig } from '../../../src/config/types.js';
import {
  announcedHotplugRequest,
  type BarNeeds,
  barNeeds,
  hotplugRequestForDevices,
  type PcieTopology,
  planHotplug,
  planHotUnplug,
  planPcieTopology,
} from '../../../src/pcie/index.js';
import { GiB, KiB, MiB } from '../../../src/pcie/pci.js';
import { thrown } from '../../helpers/kata-error.js';
import { fixtureInventory } from '../../helpers/pcie-golden.js';

type Profile = HandlerPcieConfig & { confidential: boolean };
const profile = (over: Partial<Profile> = {}): Profile => ({ ...defaultHandlerProfile().pcie, confidential: false, ...over });

/** e1000e as QEMU 7.2 exposes it: BAR0/BAR1 128 KiB, BAR2 32 B I/O, BAR3 16 KiB (MSI-X), 256 KiB ROM. */
const E1000E: BarNeeds = barNeeds(
  [
    { index: 0, barBytes: 128 * KiB, kind: 'mem', prefetchable: false, is64bit: false },
    { index: 1, barBytes: 128 * KiB, kind: 'mem', prefetchable: false, is64bit: false },
    { index: 2, barBytes: 32, kind: 'io', prefetchable: false, is64bit: false },
    { index: 3, barBytes: 16 * KiB, kind: 'mem', prefetchable: false, is64bit: false },
  ],
  256 * KiB,
);

async function gpuTopology(over: Partial<Profile> = {}): Promise<PcieTopology> {
  return planPcieTopology({
    inventory: await fixtureInventory('gpu-audio'),
    devices: [{ hostPath: '/dev/vfio/12', origin: 't' }],
    profile: profile(over),
  });
}

describe('planHotplug', () => {
  it('announced GPU + audio go to the ports reserved for them, as vfio-pci host= device_add commands', async () => {
    const t = await gpuTopology();
    const before = JSON.stringify(t);
    const plan = planHotplug(t, announcedHotplugRequest(t));
    expect(plan.commands).toEqual([
      { execute: 'device_add', arguments: { driver: 'vfio-pci', id: 'dev-rp0', bus: 'rp0', host: '0000:01:00.0' } },
      { execute: 'device_add', arguments: { driver: 'vfio-pci', id: 'dev-rp1', bus: 'rp1', host: '0000:01:00.1' } },
    ]);
    expect(plan.topology.ports[0]!.occupant).toMatchObject({ qemuId: 'dev-rp0', bdf: '0000:01:00.0', attached: 'hotplug' });
    // Pure: the input topology is untouched until the caller commits the returned copy.
    expect(JSON.stringify(t)).toBe(before);
    // Once attached, the announced request is empty and a second attach is refused.
    expect(announcedHotplugRequest(plan.topology).devices).toEqual([]);
    const again = thrown(() => planHotplug(plan.topology, announcedHotplugRequest(t)));
    expect(again).toMatchObject({ kind: 'exists', reason: 'PCIE_DEVICE_ATTACHED' });
  });

  it('an emulated device (driver is a field) takes the smallest spare port that fits, never a port reserved for another device', async () => {
    const t = await gpuTopology();
    const plan = planHotplug(t, { devices: [{ driver: 'e1000e', qemuId: 'nic0', needs: E1000E }] });
    expect(plan.commands).toEqual([{ execute: 'device_add', arguments: { driver: 'e1000e', id: 'nic0', bus: 'rp2' } }]);
    expect(plan.placements).toEqual([{ qemuId: 'nic0', portId: 'rp2' }]);
  });

  it('refuses with numbers when no reserved port fits (RESOURCE_EXHAUSTED), and nothing changes', async () => {
    const t = await gpuTopology();
    const huge: BarNeeds = {
      ioBytes: 0,
      mem32Bytes: 16 * MiB,
      pref64Bytes: 128 * GiB,
      mem32LargestBytes: 16 * MiB,
      pref64LargestBytes: 128 * GiB,
    };
    const e = thrown(() => planHotplug(t, { devices: [{ driver: 'vfio-pci', bdf: '0000:99:00.0', needs: huge }] }));
    expect(e).toMatchObject({ kind: 'exhausted', reason: 'PCIE_HOTPLUG_NO_PORT' });
    expect(e.message).toContain('128 GiB');
    expect(e.message).toContain('2 of 4 free ports are open to it');
    expect(e.message).toContain('256 MiB');
  });

  it('spares run out: the third emulated NIC is refused; all-or-nothing within one request', async () => {
    const t = await gpuTopology();
    const nic = (id: string) => ({ driver: 'e1000e', qemuId: id, needs: E1000E });
    const two = planHotplug(t, { devices: [nic('a'), nic('b')] });
    expect(two.placements.map((p) => p.portId)).toEqual(['rp2', 'rp3']);
    expect(thrown(() => planHotplug(two.topology, { devices: [nic('c')] }))).toMatchObject({ reason: 'PCIE_HOTPLUG_NO_PORT' });
    expect(thrown(() => planHotplug(t, { devices: [nic('a'), nic('b'), nic('c')] }))).toMatchObject({ reason: 'PCIE_HOTPLUG_NO_PORT' });
  });

  it('a 128 GiB BAR device fits a port reserved from its announced BARs (hgx H100 -> 256 GiB window)', async () => {
    const inv = await fixtureInventory('hgx-8gpu');
    const t = planPcieTopology({
      inventory: inv,
      devices: [{ hostPath: '/dev/vfio/20', origin: 't' }],
      profile: profile({ sparePorts: 0 }),
    });
    expect(t.ports[0]!.capacity.pref64Bytes).toBe(256 * GiB);
    const plan = planHotplug(t, announcedHotplugRequest(t));
    expect(plan.commands[0]!.arguments).toEqual({ driver: 'vfio-pci', id: 'dev-rp0', bus: 'rp0', host: '0000:18:00.0' });
  });

  it('an unannounced VFIO device goes through the same group checks, then onto a spare port', async () => {
    const inv = await fixtureInventory('sriov-nic');
    const t = planPcieTopology({ inventory: inv, devices: [], profile: profile({ sparePorts: 1 }) });
    const req = hotplugRequestForDevices(inv, [{ hostPath: '/dev/vfio/devices/vfio3', origin: 'CreateContainer' }]);
    expect(req.devices.map((d) => d.bdf)).toEqual(['0000:3b:00.5']);
    const plan = planHotplug(t, {
      devices: req.devices.map((d) => ({ ...d, properties: { sysfsdev: '/sys/bus/pci/devices/0000:3b:00.5' } })),
    });
    // sysfsdev given: no host= (QEMU takes one or the other).
    expect(plan.commands[0]!.arguments).toEqual({
      driver: 'vfio-pci',
      id: 'dev-rp0',
      bus: 'rp0',
      sysfsdev: '/sys/bus/pci/devices/0000:3b:00.5',
    });
    const noVfio = await fixtureInventory('no-vfio');
    expect(thrown(() => hotplugRequestForDevices(noVfio, [{ hostPath: '/dev/vfio/40', origin: 't' }]))).toMatchObject({
      reason: 'IOMMU_GROUP_NOT_VIABLE',
    });
  });

  it('ids are unique: a taken QEMU id is ALREADY_EXISTS; an empty request or driver is INVALID_ARGUMENT', async () => {
    const t = await gpuTopology();
    const one = planHotplug(t, { devices: [{ driver: 'e1000e', qemuId: 'nic0', needs: E1000E }] });
    expect(thrown(() => planHotplug(one.topology, { devices: [{ driver: 'e1000e', qemuId: 'nic0', needs: E1000E }] }))).toMatchObject({
      kind: 'exists',
      reason: 'PCIE_DEVICE_ID_IN_USE',
    });
    expect(thrown(() => planHotplug(t, { devices: [] }))).toMatchObject({ kind: 'invalid', reason: 'PCIE_HOTPLUG_EMPTY' });
    expect(thrown(() => planHotplug(t, { devices: [{ driver: ' ', needs: E1000E }] }))).toMatchObject({
      kind: 'invalid',
      reason: 'PCIE_HOTPLUG_DRIVER',
    });
  });

  it('the confidential handler refuses every hot-plug and hot-unplug', async () => {
    const t = planPcieTopology({
      inventory: await fixtureInventory('gpu-audio'),
      devices: [{ hostPath: '/dev/vfio/12', origin: 't' }],
      profile: { ...confidentialHandlerProfile().pcie, confidential: true },
    });
    expect(thrown(() => planHotplug(t, { devices: [{ driver: 'e1000e', needs: E1000E }] }))).toMatchObject({
      kind: 'precondition',
      reason: 'PCIE_HOTPLUG_CONFIDENTIAL',
    });
    expect(thrown(() => planHotUnplug(t, ['dev-rp0']))).toMatchObject({ kind: 'precondition', reason: 'PCIE_HOTPLUG_CONFIDENTIAL' });
  });

  it('announcedHotplugRequest refuses a BDF that was never announced', async () => {
    const t = await gpuTopology();
    expect(thrown(() => announcedHotplugRequest(t, ['0000:3b:00.2']))).toMatchObject({
      kind: 'not_found',
      reason: 'PCIE_DEVICE_NOT_ANNOUNCED',
    });
    expect(announcedHotplugRequest(t, ['0000:01:00.1']).devices.map((d) => d.bdf)).toEqual(['0000:01:00.1']);
  });
});

describe('planHotUnplug', () => {
  it('device_del frees the port for the next device; unknown ids are NOT_FOUND', async () => {
    const t = await gpuTopology();
    const added = planHotplug(t, { devices: [{ driver: 'e1000e', qemuId: 'nic0', needs: E1000E }] });
    const removed = planHotUnplug(added.topology, ['nic0']);
    expect(removed.commands).toEqual([{ execute: 'device_del', arguments: { id: 'nic0' } }]);
    expect(removed.topology.ports.find((p) => p.id === 'rp2')!.occupant).toBeNull();
    expect(added.topology.ports.find((p) => p.id === 'rp2')!.occupant).not.toBeNull();
    expect(thrown(() => planHotUnplug(removed.topology, ['nic0']))).toMatchObject({
      kind: 'not_found',
      reason: 'PCIE_DEVICE_NOT_ATTACHED',
    });
    expect(planHotplug(removed.topology, { devices: [{ driver: 'e1000e', qemuId: 'nic1', needs: E1000E }] }).placements[0]!.portId).toBe(
      'rp2',
    );
  });
});
