/**
 * CRI devices -> the agent API's GuestDevice messages the agent resolves (planGuestDevices, pure), with
 * goldens in fixtures/guest-devices (UPDATE_GOLDENS=1 rewrites them). The VFIO cases plan real
 * topologies from the fixture sysfs trees (no VFIO hardware here): fakes, named so.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { defaultHandlerProfile } from '../../../src/config/defaults.js';
import type { HandlerPcieConfig } from '../../../src/config/types.js';
import { planPcieTopology } from '../../../src/pcie/index.js';
import { vfioGroupFunctions } from '../../../src/runtime/container/devices.js';
import { type GuestDevicesInput, planGuestDevices } from '../../../src/runtime/container/guest-devices.js';
import { thrown } from '../../helpers/kata-error.js';
import { fixtureInventory } from '../../helpers/pcie-golden.js';
import { FIXTURES_DIR } from '../../helpers/pcie-sysfs.js';

const dir = path.join(FIXTURES_DIR, 'guest-devices');
type Profile = HandlerPcieConfig & { confidential: boolean };
const profile = (over: Partial<Profile> = {}): Profile => ({ ...defaultHandlerProfile().pcie, confidential: false, ...over });

function compare(name: string, value: unknown): void {
  const file = path.join(dir, `${name}.json`);
  const actual = `${JSON.stringify(value, null, 2)}\n`;
  if (process.env.UPDATE_GOLDENS === '1') writeFileSync(file, actual);
  expect(actual).toBe(readFileSync(file, 'utf8'));
}

const device = (host_path: string, container_path = host_path, permissions = '') => ({ host_path, container_path, permissions });

async function vfioCase(tree: string, hostPaths: string[], over: Partial<Profile>) {
  const inventory = await fixtureInventory(tree);
  // Cold-plugged at boot: the topology's ports carry the functions, as after a hot-plug.
  const topology = planPcieTopology({
    inventory,
    devices: hostPaths.map((hostPath) => ({ hostPath, origin: 'test' })),
    profile: profile({ vfioPolicy: 'cold-plug', ...over }),
  });
  const devices = [device('/dev/vfio/vfio'), ...hostPaths.map((p) => device(p))];
  return { devices, topology, vfioFunctions: vfioGroupFunctions(inventory, devices), hostNodeTypes: {} } satisfies GuestDevicesInput;
}

describe('planGuestDevices goldens', () => {
  it('fake VFIO: a GPU with its audio function behind root ports', async () => {
    const input = await vfioCase('gpu-audio', ['/dev/vfio/12'], {});
    const requests = planGuestDevices(input);
    expect(requests[1]!.kind).toBe('GUEST_DEVICE_KIND_VFIO_GROUP');
    compare('gpu-audio-root', requests);
  });

  it('fake VFIO: eight GPUs behind switch downstream ports', async () => {
    const groups = [20, 21, 22, 23].map((g) => `/dev/vfio/${g}`);
    const input = await vfioCase('hgx-8gpu', groups, { portType: 'switch-port' });
    const requests = planGuestDevices(input);
    for (const r of requests.slice(1)) expect(r.kind).toBe('GUEST_DEVICE_KIND_VFIO_GROUP');
    compare('hgx-switch', requests);
  });

  it('guest nodes: character devices keep their path; permissions default to rwm', () => {
    const requests = planGuestDevices({
      devices: [device('/dev/fuse', '/dev/fuse', 'rw'), device('/dev/net/tun', '/dev/tun0')],
      topology: undefined,
      vfioFunctions: {},
      hostNodeTypes: { '/dev/fuse': 'char', '/dev/net/tun': 'char' },
    });
    compare('guest-nodes', requests);
  });
});

function expectKataError(fn: () => unknown, kind: string, reason: string, text = ''): void {
  const err = thrown(fn);
  expect([err.kind, err.reason]).toEqual([kind, reason]);
  expect(err.message).toContain(text);
}

describe('planGuestDevices refusals (INVALID_ARGUMENT naming the field)', () => {
  const plan =
    (d: ReturnType<typeof device>, type: 'char' | 'block' | 'other' | 'missing' = 'char') =>
    () =>
      planGuestDevices({ devices: [d], topology: undefined, vfioFunctions: {}, hostNodeTypes: { [d.host_path]: type } });

  it('a host block device: no block device is passed into the VM', () => {
    expectKataError(plan(device('/dev/sda'), 'block'), 'invalid', 'CONTAINER_DEVICE_UNSUPPORTED', 'container.devices[0].host_path');
  });
  it('a path that is no device, or missing', () => {
    expectKataError(plan(device('/etc/passwd'), 'other'), 'invalid', 'CONTAINER_DEVICE_INVALID', 'container.devices[0].host_path');
    expectKataError(plan(device('/dev/nope'), 'missing'), 'invalid', 'CONTAINER_DEVICE_INVALID');
  });
  it('bad permissions and a relative container path', () => {
    expectKataError(plan(device('/dev/fuse', '/dev/fuse', 'rx')), 'invalid', 'CONTAINER_DEVICE_INVALID', 'permissions');
    expectKataError(plan(device('/dev/fuse', '/dev/fuse', 'rr')), 'invalid', 'CONTAINER_DEVICE_INVALID', 'permissions');
    expectKataError(plan(device('/dev/fuse', 'dev/fuse')), 'invalid', 'CONTAINER_DEVICE_INVALID', 'container_path');
  });
  it('fake VFIO: a group none of whose functions is in the VM', () => {
    expectKataError(plan(device('/dev/vfio/12')), 'invalid', 'CONTAINER_DEVICE_UNSUPPORTED', 'no function of that group');
  });
});
