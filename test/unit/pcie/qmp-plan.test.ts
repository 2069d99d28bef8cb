/**
 * QMP command plans are a union keyed by `execute`, with typed arguments: what planHotplug and
 * planHotUnplug return is executed without casts. Checked by `tsc` (test/ is in tsconfig.json).
 */
import { describe, expect, it } from 'vitest';
import { defaultHandlerProfile } from '../../../src/config/defaults.js';
import {
  type DeviceAddCommand,
  type DeviceDelCommand,
  planHotplug,
  planHotUnplug,
  planPcieTopology,
  type QmpCommandPlan,
} from '../../../src/pcie/index.js';
import { KiB } from '../../../src/pcie/pci.js';
import { fixtureInventory } from '../../helpers/pcie-golden.js';

const NEEDS = { ioBytes: 0, mem32Bytes: 256 * KiB, mem32LargestBytes: 128 * KiB, pref64Bytes: 0, pref64LargestBytes: 0 };

/** What an executor does with a plan: branch on `execute`, read the arguments as typed. */
function wire(cmd: QmpCommandPlan): string {
  switch (cmd.execute) {
    case 'device_add':
      return `${cmd.execute} ${cmd.arguments.driver} ${cmd.arguments.id} on ${cmd.arguments.bus}`;
    case 'device_del':
      // @ts-expect-error device_del carries only the id
      return `${cmd.execute} ${cmd.arguments.id} ${cmd.arguments.driver}`;
  }
}

describe('QMP command plans', () => {
  it('hot-plug plans carry device_add commands and hot-unplug plans device_del, typed by command', async () => {
    const t = await planPcieTopology({
      inventory: await fixtureInventory('gpu-audio'),
      devices: [],
      profile: { ...defaultHandlerProfile().pcie, confidential: false },
    });
    const added = planHotplug(t, { devices: [{ driver: 'e1000e', qemuId: 'nic0', needs: NEEDS }] });
    const adds: DeviceAddCommand[] = added.commands;
    const removed = planHotUnplug(added.topology, ['nic0']);
    const dels: DeviceDelCommand[] = removed.commands;
    // @ts-expect-error a hot-unplug plan holds no device_add
    const wrong: DeviceAddCommand[] = removed.commands;
    expect([...adds, ...dels].map(wire)).toEqual([`device_add e1000e nic0 on ${added.placements[0]!.portId}`, 'device_del nic0 undefined']);
    expect(wrong).toBe(removed.commands);
  });
});
