import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { defaultHandlerProfile } from '../../../src/config/defaults.js';
import type { HandlerPcieConfig } from '../../../src/config/types.js';
import {
  describeTopology,
  describeTopologyText,
  type HostInventory,
  type PcieTopology,
  pcieQemuArgs,
  pcieQemuArgsWithoutVfio,
  planPcieTopology,
  readHostInventory,
  type VfioDeviceRequest,
} from '../../../src/pcie/index.js';
import { GiB, MiB } from '../../../src/pcie/pci.js';
import { thrown } from '../../helpers/kata-error.js';
import { PCIE_CASES } from '../../helpers/pcie-cases.js';
import { argvToGolden, fixtureInventory, golden } from '../../helpers/pcie-golden.js';
import { fixtureInventoryOptions } from '../../helpers/pcie-sysfs.js';

type Profile = HandlerPcieConfig & { confidential: boolean };
const profile = (over: Partial<Profile> = {}): Profile => ({ ...defaultHandlerProfile().pcie, confidential: false, ...over });
const dev = (hostPath: string, origin = 'test'): VfioDeviceRequest => ({ hostPath, origin });

const empty = (): HostInventory => ({
  sysfsRoot: '/sys',
  devRoot: '/dev',
  iommuEnabled: true,
  functions: [],
  groups: [],
  vfioNodes: [],
  warnings: [],
});

describe('golden plans (fixtures/pcie/*.argv, *.plan.txt)', () => {
  for (const c of PCIE_CASES) {
    it(`${c.name}: argv and description match the reviewed goldens`, async () => {
      const t = planPcieTopology({ inventory: await fixtureInventory(c.tree), devices: c.devices, profile: c.profile });
      const argv = argvToGolden(pcieQemuArgs(t));
      expect(argv).toBe(await golden(`${c.name}.argv`, argv));
      const text = `${describeTopologyText(t).join('\n')}\n`;
      expect(text).toBe(await golden(`${c.name}.plan.txt`, text));
    });
  }
});

describe('planPcieTopology: expansion to IOMMU groups', () => {
  it('a GPU brings its audio function: one group, one port per function, both reserved for hot-plug', async () => {
    const t = planPcieTopology({ inventory: await fixtureInventory('gpu-audio'), devices: [dev('/dev/vfio/12')], profile: profile() });
    expect(t.functions.map((f) => [f.bdf, f.group, f.portId, f.plug])).toEqual([
      ['0000:01:00.0', 12, 'rp0', 'hot-plug'],
      ['0000:01:00.1', 12, 'rp1', 'hot-plug'],
    ]);
    expect(t.ports.map((p) => [p.id, p.use, p.reservedFor])).toEqual([
      ['rp0', 'hot-plug', '0000:01:00.0'],
      ['rp1', 'hot-plug', '0000:01:00.1'],
      ['rp2', 'spare', null],
      ['rp3', 'spare', null],
    ]);
    // 32 GiB + 32 MiB of 64-bit prefetchable BARs: twice the largest BAR, a power of two.
    expect(t.ports[0]!.reserve).toEqual({ ioBytes: null, memBytes: 32 * MiB, pref64Bytes: 64 * GiB });
    // The audio function has no I/O BAR and a 16 KiB BAR: io-reserve=0 and the floors.
    expect(t.ports[1]!.reserve).toEqual({ ioBytes: 0, memBytes: 16 * MiB, pref64Bytes: 256 * MiB });
    expect(t.ports[2]!.reserve).toEqual({ ioBytes: 0, memBytes: 16 * MiB, pref64Bytes: 256 * MiB });
  });

  it('naming one function by its iommufd node still brings the whole group', async () => {
    const t = planPcieTopology({
      inventory: await fixtureInventory('gpu-audio'),
      devices: [dev('/dev/vfio/devices/vfio1')],
      profile: profile({ sparePorts: 0 }),
    });
    expect(t.functions.map((f) => f.bdf)).toEqual(['0000:01:00.0', '0000:01:00.1']);
  });

  it('without /dev nodes (no device-number file), group and iommufd paths still resolve through sysfs names', async () => {
    const o = fixtureInventoryOptions('gpu-audio');
    const inv = await readHostInventory({ sysfsRoot: o.sysfsRoot, devRoot: o.devRoot });
    expect(inv.vfioNodes).toEqual([]);
    for (const p of ['/dev/vfio/12', '/dev/vfio/devices/vfio1']) {
      expect(planPcieTopology({ inventory: inv, devices: [dev(p)], profile: profile({ sparePorts: 0 }) }).functions).toHaveLength(2);
    }
  });

  it('two requests for the same group merge, keeping both origins; the VFIO container node is ignored', async () => {
    const t = planPcieTopology({
      inventory: await fixtureInventory('gpu-audio'),
      devices: [dev('/dev/vfio/12', 'a'), dev('/dev/vfio/devices/vfio0', 'b'), dev('/dev/vfio/vfio', 'c'), { bdf: '01:00.1', origin: 'd' }],
      profile: profile({ sparePorts: 0 }),
    });
    expect(t.groups).toEqual([{ group: 12, functions: ['0000:01:00.0', '0000:01:00.1'], leftOut: [], origins: ['a', 'b', 'd'] }]);
    expect(t.ports).toHaveLength(2);
  });

  it('a PCI bridge in the group stays on the host; the conventional PCI cards behind it each get a port', async () => {
    const t = planPcieTopology({
      inventory: await fixtureInventory('bridge-group'),
      devices: [dev('/dev/vfio/8')],
      profile: profile({ sparePorts: 0 }),
    });
    expect(t.groups[0]!.leftOut).toEqual([{ bdf: '0000:02:00.0', reason: 'bridge' }]);
    expect(t.functions.map((f) => f.bdf)).toEqual(['0000:03:00.0', '0000:03:01.0']);
    expect(t.notes).toContain('IOMMU group 8: 0000:02:00.0 stays on the host (bridge)');
    // The serial card has an I/O BAR: its port keeps the default I/O window.
    expect(t.ports[1]!.reserve.ioBytes).toBeNull();
  });

  it('NVSwitch functions (class 0x0680, "other bridge") are passed through, not left out as PCI bridges', async () => {
    const t = planPcieTopology({
      inventory: await fixtureInventory('hgx-8gpu'),
      devices: [dev('/dev/vfio/30')],
      profile: profile({ sparePorts: 0 }),
    });
    expect(t.functions.map((f) => [f.bdf, f.classCode])).toEqual([['0000:05:00.0', 0x068000]]);
  });

  it('sorts functions by BDF whatever the request order: shuffled requests give byte-identical argv', async () => {
    const inv = await fixtureInventory('hgx-8gpu');
    const groups = [20, 21, 22, 23, 24, 25, 26, 27, 30, 31, 32, 33];
    const base = pcieQemuArgs(planPcieTopology({ inventory: inv, devices: groups.map((g) => dev(`/dev/vfio/${g}`)), profile: profile() }));
    fc.assert(
      fc.property(fc.shuffledSubarray(groups, { minLength: groups.length, maxLength: groups.length }), (order) => {
        const args = pcieQemuArgs(
          planPcieTopology({ inventory: inv, devices: order.map((g) => dev(`/dev/vfio/${g}`)), profile: profile() }),
        );
        expect(args).toEqual(base);
      }),
      { numRuns: 25 },
    );
  });
});

describe('planPcieTopology: refusals name the device, the driver and the numbers', () => {
  it('a device bound to a host driver (node missing since no member is bound to vfio-pci): DEVICE_NOT_VFIO', async () => {
    const inv = await fixtureInventory('no-vfio');
    const err = thrown(() =>
      planPcieTopology({ inventory: inv, devices: [dev('/dev/vfio/31', 'pod_resources container "net"')], profile: profile() }),
    );
    expect(err).toMatchObject({ kind: 'precondition', reason: 'DEVICE_NOT_VFIO' });
    expect(err.message).toContain('0000:5e:00.0');
    expect(err.message).toContain('ixgbe');
    expect(err.message).toContain('pod_resources container "net"');
  });

  it('a stale group node whose only member is bound to nvme: DEVICE_NOT_VFIO through /sys/dev/char', async () => {
    const inv = await fixtureInventory('no-vfio');
    const e2 = thrown(() => planPcieTopology({ inventory: inv, devices: [dev('/dev/vfio/55')], profile: profile() }));
    expect(e2).toMatchObject({ kind: 'precondition', reason: 'DEVICE_NOT_VFIO' });
    expect(e2.message).toContain('0000:d8:00.0');
    expect(e2.message).toContain('nvme');
  });

  it('a PCI address bound to a host driver: DEVICE_NOT_VFIO', async () => {
    const inv = await fixtureInventory('no-vfio');
    const e = thrown(() => planPcieTopology({ inventory: inv, devices: [{ bdf: '0000:5e:00.0', origin: 'test' }], profile: profile() }));
    expect(e).toMatchObject({ kind: 'precondition', reason: 'DEVICE_NOT_VFIO' });
  });

  it('a group whose audio function is still bound to snd_hda_intel: IOMMU_GROUP_NOT_VIABLE naming it', async () => {
    const inv = await fixtureInventory('no-vfio');
    const e = thrown(() => planPcieTopology({ inventory: inv, devices: [dev('/dev/vfio/40')], profile: profile() }));
    expect(e).toMatchObject({ kind: 'precondition', reason: 'IOMMU_GROUP_NOT_VIABLE' });
    expect(e.message).toContain('0000:af:00.1 (snd_hda_intel)');
    expect(e.details).toMatchObject({ group: 40, blockers: [{ bdf: '0000:af:00.1', driver: 'snd_hda_intel' }] });
  });

  it('no IOMMU: IOMMU_MISSING for any device, but a pod without devices still gets its spare ports', async () => {
    const inv = await fixtureInventory('no-iommu');
    for (const d of [dev('/dev/vfio/noiommu-0'), { bdf: '0000:65:00.0', origin: 'test' }]) {
      expect(thrown(() => planPcieTopology({ inventory: inv, devices: [d], profile: profile() }))).toMatchObject({
        kind: 'precondition',
        reason: 'IOMMU_MISSING',
      });
    }
    expect(planPcieTopology({ inventory: inv, devices: [], profile: profile() }).ports.map((p) => p.use)).toEqual(['spare', 'spare']);
  });

  it('unknown nodes, paths outside /dev/vfio and bad addresses are refused precisely', async () => {
    const inv = await fixtureInventory('gpu-audio');
    const plan = (d: VfioDeviceRequest) => thrown(() => planPcieTopology({ inventory: inv, devices: [d], profile: profile() }));
    expect(plan(dev('/dev/vfio/999'))).toMatchObject({ kind: 'not_found', reason: 'VFIO_NODE_UNKNOWN' });
    expect(plan(dev('/dev/nvidia0'))).toMatchObject({ kind: 'invalid', reason: 'VFIO_PATH_INVALID' });
    expect(plan({ bdf: 'zz:00.0', origin: 't' })).toMatchObject({ kind: 'invalid', reason: 'PCI_ADDRESS_INVALID' });
    expect(plan({ bdf: '0000:99:00.0', origin: 't' })).toMatchObject({ kind: 'not_found', reason: 'PCI_DEVICE_UNKNOWN' });
  });

  it('a confidential handler may not hot-plug or keep spare ports', async () => {
    const inv = await fixtureInventory('gpu-audio');
    const e = thrown(() => planPcieTopology({ inventory: inv, devices: [], profile: profile({ confidential: true }) }));
    expect(e).toMatchObject({ kind: 'precondition', reason: 'PCIE_CONFIDENTIAL_HOTPLUG' });
  });

  it('root-bus slots: 184 root ports fit (23 slots x 8), 185 are refused with the numbers', () => {
    const p = profile({ memReserveFloorMiB: 0, pref64ReserveFloorMiB: 0 });
    const t = planPcieTopology({ inventory: empty(), devices: [], profile: { ...p, sparePorts: 184 } });
    expect(t.usage).toMatchObject({ rootSlots: 23, busNumbers: 185 });
    expect(t.ports.at(-1)).toMatchObject({ id: 'rp183', slot: 0x1e, function: 7 });
    const e = thrown(() => planPcieTopology({ inventory: empty(), devices: [], profile: { ...p, sparePorts: 185 } }));
    expect(e).toMatchObject({ kind: 'exhausted', reason: 'PCIE_ROOT_SLOTS_EXHAUSTED' });
    expect(e.message).toContain('185 root ports need 24 slots');
    expect(e.message).toContain('only 23');
  });

  it('bus numbers: 239 switch ports fit in 256 buses, 240 are refused with the count', () => {
    const p = profile({ portType: 'switch-port', memReserveFloorMiB: 0, pref64ReserveFloorMiB: 0 });
    const t = planPcieTopology({ inventory: empty(), devices: [], profile: { ...p, sparePorts: 239 } });
    expect(t.usage.busNumbers).toBe(256);
    expect(t.switches).toHaveLength(8);
    const e = thrown(() => planPcieTopology({ inventory: empty(), devices: [], profile: { ...p, sparePorts: 240 } }));
    expect(e).toMatchObject({ kind: 'exhausted', reason: 'PCIE_BUS_NUMBERS_EXHAUSTED' });
    expect(e.message).toContain('need 257 PCI bus numbers');
    expect(e.message).toContain('has 256');
  });

  it('32-bit MMIO: 58 spare ports x 16 MiB fit below 4 GiB, 59 are refused (SeaBIOS failed at 64 x 16 MiB)', () => {
    expect(planPcieTopology({ inventory: empty(), devices: [], profile: profile({ sparePorts: 58 }) }).usage.mmio32Bytes).toBe(928 * MiB);
    const e = thrown(() => planPcieTopology({ inventory: empty(), devices: [], profile: profile({ sparePorts: 59 }) }));
    expect(e).toMatchObject({ kind: 'exhausted', reason: 'PCIE_MMIO32_EXHAUSTED' });
    expect(e.message).toContain('944 MiB');
  });
});

describe('planPcieTopology: layouts past 16 ports', () => {
  it('42 root ports: multifunction slots 0x08-0x0d, io-reserve=0 everywhere, unique chassis/slot pairs', async () => {
    const inv = await fixtureInventory('sriov-nic');
    const devices = Array.from({ length: 40 }, (_, i) => dev(`/dev/vfio/devices/vfio${i}`));
    const t = planPcieTopology({ inventory: inv, devices, profile: profile() });
    expect(t.ports).toHaveLength(42);
    expect(new Set(t.ports.map((p) => p.slot))).toEqual(new Set([8, 9, 10, 11, 12, 13]));
    expect(t.ports.filter((p) => p.multifunction).map((p) => p.id)).toEqual(['rp0', 'rp8', 'rp16', 'rp24', 'rp32', 'rp40']);
    expect(t.ports.every((p) => p.reserve.ioBytes === 0)).toBe(true);
    expect(
      pcieQemuArgs(t)
        .filter((a) => a.startsWith('pcie-root-port'))
        .every((a) => a.includes('io-reserve=0')),
    ).toBe(true);
  });

  it('switch layout: 42 downstream ports over two switches, one root port each', async () => {
    const inv = await fixtureInventory('sriov-nic');
    const devices = Array.from({ length: 40 }, (_, i) => dev(`/dev/vfio/devices/vfio${i}`));
    const t = planPcieTopology({ inventory: inv, devices, profile: profile({ portType: 'switch-port' }) });
    expect(t.switches.map((s) => [s.id, s.rootPortId, s.downstreamPortIds.length])).toEqual([
      ['swup0', 'rp0', 32],
      ['swup1', 'rp1', 10],
    ]);
    expect(t.usage.busNumbers).toBe(1 + 2 + 2 + 42);
    const args = pcieQemuArgs(t);
    // Every bus exists before a device names it.
    const defined = new Set(['pcie.0']);
    for (let i = 1; i < args.length; i += 2) {
      const props = Object.fromEntries(
        args[i]!.split(',')
          .slice(1)
          .map((kv) => kv.split('=') as [string, string]),
      );
      expect(defined.has(props.bus!), args[i]).toBe(true);
      defined.add(props.id!);
    }
  });

  it('property: any layout has unique ids, addresses and chassis/slot pairs within the agreed root slots', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 120 }), fc.constantFrom('root-port', 'switch-port' as const), (spares, portType) => {
        const t = planPcieTopology({
          inventory: empty(),
          devices: [],
          profile: profile({ sparePorts: spares, portType: portType as 'root-port', memReserveFloorMiB: 1 }),
        });
        const ids = t.ports.map((p) => p.id).concat(t.switches.map((s) => s.id));
        expect(new Set(ids).size).toBe(ids.length);
        const addrs = t.ports.map((p) => `${p.bus}/${p.slot}.${p.function}`);
        expect(new Set(addrs).size).toBe(addrs.length);
        const pairs = t.ports.map((p) => `${p.chassis}/${p.physicalSlot}`);
        expect(new Set(pairs).size).toBe(pairs.length);
        for (const p of t.ports.filter((x) => x.bus === 'pcie.0')) {
          expect(p.slot).toBeGreaterThanOrEqual(0x08);
          expect(p.slot).toBeLessThanOrEqual(0x1e);
          const inSlot = t.ports.filter((x) => x.bus === 'pcie.0' && x.slot === p.slot).length;
          expect(p.multifunction).toBe(p.function === 0 && inSlot > 1);
        }
        expect(t.usage.busNumbers).toBeLessThanOrEqual(256);
      }),
      { numRuns: 60 },
    );
  });
});

describe('argv and description', () => {
  it('cold-plug puts vfio-pci host= on its port; the no-VFIO variant keeps every port and drops only them', async () => {
    const t: PcieTopology = planPcieTopology({
      inventory: await fixtureInventory('gpu-audio'),
      devices: [dev('/dev/vfio/12')],
      profile: profile({ vfioPolicy: 'cold-plug', sparePorts: 1 }),
    });
    const args = pcieQemuArgs(t);
    expect(args).toContain('vfio-pci,host=0000:01:00.0,bus=rp0,id=dev-rp0');
    expect(args).toContain('vfio-pci,host=0000:01:00.1,bus=rp1,id=dev-rp1');
    const noVfio = pcieQemuArgsWithoutVfio(t);
    expect(noVfio.filter((a) => a.startsWith('vfio-pci'))).toEqual([]);
    expect(noVfio.filter((a) => a.startsWith('pcie-root-port'))).toHaveLength(3);
  });

  it('describeTopology: which function goes where, and what is reserved', async () => {
    const d = describeTopology(
      planPcieTopology({ inventory: await fixtureInventory('gpu-audio'), devices: [dev('/dev/vfio/12')], profile: profile() }),
    );
    expect(d.ports[0]).toMatchObject({
      id: 'rp0',
      address: 'pcie.0:08.0',
      state: 'reserved',
      function: '0000:01:00.0',
      reserve: { io: 'default', mem: '32 MiB', pref64: '64 GiB' },
    });
    expect(d.ports[2]).toMatchObject({ state: 'free', function: null, reserve: { io: '0' } });
    expect(d.functions[1]).toMatchObject({ bdf: '0000:01:00.1', id: '10de:1aef', class: 'audio', group: 12, port: 'rp1' });
    expect(d.usage).toMatchObject({ busNumbers: '5/256', rootSlots: '1/23' });
    expect(JSON.parse(JSON.stringify(d))).toEqual(d);
  });
});
