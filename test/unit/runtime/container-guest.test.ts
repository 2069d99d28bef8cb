/** The container layer's pure parts: exit reasons, signals, CPU rates, guest layout, reading files inside a root. */
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { criCpuUsage } from '../../../src/cri/views/stats.js';
import { guestLayout } from '../../../src/oci/index.js';
import { exitReason, signalNumber, timestampNs } from '../../../src/runtime/container/guest-ops.js';
import { readFileInRoot } from '../../../src/runtime/container/guest-spec.js';
import { CpuRates, nanoCores } from '../../../src/runtime/container/stats.js';

describe('exit reasons', () => {
  it('Completed for 0, Error with a message otherwise, OOMKilled whatever the code', () => {
    expect(exitReason({ exitCode: 0, signal: 0, oomKilled: false })).toEqual({ reason: 'Completed', message: '' });
    expect(exitReason({ exitCode: 3, signal: 0, oomKilled: false })).toEqual({
      reason: 'Error',
      message: 'the container exited with code 3',
    });
    expect(exitReason({ exitCode: 137, signal: 9, oomKilled: false }).message).toContain('signal 9');
    expect(exitReason({ exitCode: 137, signal: 9, oomKilled: true }).reason).toBe('OOMKilled');
  });
});

describe('signals', () => {
  it('names with and without SIG, numbers, real-time signals; an unknown name is INVALID_ARGUMENT', () => {
    expect(signalNumber('SIGTERM')).toBe(15);
    expect(signalNumber('KILL')).toBe(9);
    expect(signalNumber('sigquit')).toBe(3);
    expect(signalNumber('10')).toBe(10);
    expect(signalNumber('SIGRTMIN+3')).toBe(37);
    expect(() => signalNumber('SIGNOPE')).toThrow(expect.objectContaining({ kind: 'invalid', reason: 'CONTAINER_STOP_SIGNAL_UNKNOWN' }));
  });

  it('agent timestamps become decimal nanoseconds', () => {
    expect(timestampNs({ seconds: 2, nanos: 5 })).toBe('2000000005');
  });
});

describe('CPU nano-cores from two samples', () => {
  it('is the usage delta over the time delta; none for a first or a backwards sample', () => {
    expect(nanoCores(undefined, { atNs: 10n, usageNs: 5n })).toBeUndefined();
    expect(nanoCores({ atNs: 1_000_000_000n, usageNs: 0n }, { atNs: 2_000_000_000n, usageNs: 500_000_000n })).toBe(500_000_000n);
    expect(nanoCores({ atNs: 2n, usageNs: 0n }, { atNs: 1n, usageNs: 5n })).toBeUndefined();
    expect(nanoCores({ atNs: 1n, usageNs: 9n }, { atNs: 2n, usageNs: 5n })).toBeUndefined();
  });

  it('CpuRates keeps the previous sample per key', () => {
    const rates = new CpuRates();
    // Shaped as the CRI face answers it (the core's reading carries the same numbers).
    const a = criCpuUsage(rates.usage('c', { seconds: 1, nanos: 0 }, 100));
    expect(a.usage_nano_cores).toBeUndefined();
    const b = criCpuUsage(rates.usage('c', { seconds: 2, nanos: 0 }, 250_000_100));
    expect(b).toMatchObject({ usage_core_nano_seconds: { value: '250000100' }, usage_nano_cores: { value: '250000000' } });
    expect(criCpuUsage(rates.usage('other', { seconds: 2, nanos: 0 }, 1)).usage_nano_cores).toBeUndefined();
  });
});

describe('guest layout', () => {
  it('joins the pod namespaces of the pause process and puts the cgroup under /kata-ts/<pod>/<container>', () => {
    const layout = guestLayout({
      sandboxId: 's',
      containerId: 'c',
      rootfsGuestPath: '/run/kata-ts/shared/containers/c/rootfs',
      guestDir: '/run/kata-ts/shared/containers/c',
      mountSources: { '/data': '/run/kata-ts/shared/containers/c/mounts/0' },
      pod: { pausePid: 42, shmPath: '/run/kata-ts/pods/s/shm' },
    });
    expect(layout).toMatchObject({
      cgroupsPath: '/kata-ts/s/c',
      namespaces: { network: '/proc/42/ns/net', ipc: '/proc/42/ns/ipc', uts: '/proc/42/ns/uts', pid: '/proc/42/ns/pid' },
      shmPath: '/run/kata-ts/pods/s/shm',
      etcDir: '/run/kata-ts/shared/containers/c/etc',
    });
  });
});

describe('reading /etc/passwd inside a snapshot', () => {
  let dir: string;
  let root: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-root-'));
    root = path.join(dir, 'root');
    await mkdir(path.join(root, 'etc'), { recursive: true });
    await mkdir(path.join(root, 'data'), { recursive: true });
    await writeFile(path.join(dir, 'outside'), 'host secret');
    await writeFile(path.join(root, 'data', 'passwd'), 'root:x:0:0::/root:/bin/sh\n');
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('follows links inside the root: absolute targets restart at the root, .. stops there', async () => {
    await symlink('/data/passwd', path.join(root, 'etc', 'passwd'));
    expect(await readFileInRoot(root, 'etc/passwd')).toBe('root:x:0:0::/root:/bin/sh\n');
    await symlink('../../../../outside', path.join(root, 'etc', 'group'));
    expect(await readFileInRoot(root, 'etc/group')).toBeUndefined();
    await symlink(path.join(dir, 'outside'), path.join(root, 'etc', 'shadow'));
    expect(await readFileInRoot(root, 'etc/shadow')).toBeUndefined();
  });

  it('a loop or a directory is no file', async () => {
    await symlink('loop-b', path.join(root, 'etc', 'loop-a'));
    await symlink('loop-a', path.join(root, 'etc', 'loop-b'));
    expect(await readFileInRoot(root, 'etc/loop-a')).toBeUndefined();
    expect(await readFileInRoot(root, 'data')).toBeUndefined();
    expect(await readFileInRoot(root, 'missing/passwd')).toBeUndefined();
  });
});

/** What the migrations to formats 5 and 6 add to every older record (test/unit/runtime/records-migration.test.ts loads a real one). */
const FORMAT_5 = { rootfsOwner: 'runtime', stdio: { kind: 'cri-log' }, pid: 0, rootfsOverlay: null };

describe('container record format 3', () => {
  it('a format-2 record migrates to never started and without a guest plan', async () => {
    const { migrateContainerRecord } = await import('../../../src/runtime/container/record.js');
    expect(migrateContainerRecord(2, { id: 'x', state: 'CONTAINER_CREATED' })).toEqual({
      id: 'x',
      state: 'CONTAINER_CREATED',
      startedAtNs: '0',
      guest: null,
      ...FORMAT_5,
    });
    expect(() => migrateContainerRecord(6, {})).toThrow();
  });
});

describe('container record format 4', () => {
  const guest = (annotations?: Record<string, string>) => ({
    ociSpec: { ociVersion: '1.0.2', root: { path: '/r' }, ...(annotations === undefined ? {} : { annotations }) },
    stopSignal: 'SIGTERM',
    rootfsGuestPath: '/r',
    hostDir: '/h',
    bindMounts: [],
  });
  const legacy = JSON.stringify([
    { containerPath: '/dev/vfio/12', access: 'rw', source: { kind: 'vfio-group', pciPaths: ['08.0/00.0'] } },
    { containerPath: '/dev/vfio/vfio', access: 'rwm', source: { kind: 'vfio-container' } },
    { containerPath: '/dev/tun0', access: 'rwm', source: { kind: 'guest-node', guestPath: '/dev/net/tun' } },
  ]);

  it("a format-3 record's device annotation becomes guest.guestDevices, the other annotations stay", async () => {
    const { migrateContainerRecord } = await import('../../../src/runtime/container/record.js');
    const migrated = migrateContainerRecord(3, { id: 'x', guest: guest({ 'io.kata-ts.guest-devices': legacy, team: 'a' }) });
    expect(migrated).toEqual({
      id: 'x',
      guest: {
        ...guest({ team: 'a' }),
        guestDevices: [
          { containerPath: '/dev/vfio/12', access: 'rw', kind: 'GUEST_DEVICE_KIND_VFIO_GROUP', pciPaths: ['08.0/00.0'], guestPath: '' },
          { containerPath: '/dev/vfio/vfio', access: 'rwm', kind: 'GUEST_DEVICE_KIND_VFIO_CONTAINER', pciPaths: [], guestPath: '' },
          { containerPath: '/dev/tun0', access: 'rwm', kind: 'GUEST_DEVICE_KIND_GUEST_NODE', pciPaths: [], guestPath: '/dev/net/tun' },
        ],
      },
      ...FORMAT_5,
    });
  });

  it('without devices: no devices, and no empty annotations left behind', async () => {
    const { migrateContainerRecord } = await import('../../../src/runtime/container/record.js');
    expect(migrateContainerRecord(3, { id: 'x', guest: guest({ 'io.kata-ts.guest-devices': '[]' }) })).toEqual({
      id: 'x',
      guest: { ...guest(), guestDevices: [] },
      ...FORMAT_5,
    });
    expect(migrateContainerRecord(3, { id: 'x', guest: guest() })).toEqual({
      id: 'x',
      guest: { ...guest(), guestDevices: [] },
      ...FORMAT_5,
    });
    expect(migrateContainerRecord(3, { id: 'x', guest: null })).toEqual({ id: 'x', guest: null, ...FORMAT_5 });
  });

  it('an annotation that is not what format 3 wrote fails the migration', async () => {
    const { migrateContainerRecord } = await import('../../../src/runtime/container/record.js');
    const odd = JSON.stringify([{ containerPath: '/dev/x', access: 'rwm', source: { kind: 'block' } }]);
    expect(() => migrateContainerRecord(3, { id: 'x', guest: guest({ 'io.kata-ts.guest-devices': odd }) })).toThrow();
    expect(() => migrateContainerRecord(3, { id: 'x', guest: guest({ 'io.kata-ts.guest-devices': 'not json' }) })).toThrow();
  });
});

describe('container record format 6', () => {
  it('a format-5 record keeps its owner, stdio and pid and gets no overlay (its root filesystem is a copy or the caller’s)', async () => {
    const { migrateContainerRecord } = await import('../../../src/runtime/container/record.js');
    const v5 = { id: 'x', rootfs: '/bundle/rootfs', rootfsOwner: 'caller', stdio: { kind: 'fifo' }, pid: 42 };
    expect(migrateContainerRecord(5, v5)).toEqual({ ...v5, rootfsOverlay: null });
  });
});
