/** The systemd driver's refusals that need no manager; placement itself is tested for real in test/integration/cgroups/systemd.test.ts. */
import { describe, expect, it } from 'vitest';
import { createCgroupDriver, probeSystemdManager } from '../../../src/cgroups/index.js';
import { missingLimitHierarchies } from '../../../src/cgroups/systemd.js';
import { systemdError } from '../../../src/cgroups/systemd-errors.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';

const limits = { cpuQuotaMillicores: 1000, cpuRequestMillicores: 500, memoryLimitBytes: 256 * 1024 * 1024 };
const driver = createCgroupDriver('systemd', {
  cgroupRoot: '/sys/fs/cgroup',
  dbusAddress: 'unix:path=/nonexistent/kata-ts-test-bus',
  logger: silentLogger(),
  timeoutMs: 3_000,
  mode: 'hybrid',
});

async function errorOf(p: Promise<unknown>): Promise<KataError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(KataError);
  return err as KataError;
}

describe('systemd driver without a reachable manager', () => {
  it('refuses a cgroupfs-style parent before talking to systemd', async () => {
    expect(() => driver.validateParent('/kubepods/burstable/pod1')).toThrow(/driver is systemd/);
    const err = await errorOf(
      driver.place({ sandboxId: 'ef'.repeat(32), cgroupParent: '/kubepods/besteffort/pod1', pid: process.pid, limits }),
    );
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_PARENT_STYLE_MISMATCH']);
  });

  it('refuses bad limits and pids before talking to systemd', async () => {
    const badLimits = await errorOf(
      driver.place({ sandboxId: 'ef'.repeat(32), cgroupParent: '', pid: process.pid, limits: { ...limits, cpuQuotaMillicores: -5 } }),
    );
    expect(badLimits.reason).toBe('CGROUP_LIMITS_INVALID');
    const badPid = await errorOf(driver.place({ sandboxId: 'ef'.repeat(32), cgroupParent: '', pid: 0, limits }));
    expect(badPid.reason).toBe('CGROUP_PID_INVALID');
  });

  it('reports UNAVAILABLE naming the bus when the address cannot be reached', async () => {
    for (const call of [
      () => driver.place({ sandboxId: 'ef'.repeat(32), cgroupParent: 'kubepods.slice', pid: process.pid, limits }),
      () => driver.remove({ driver: 'systemd', cgroupParent: '', mode: 'hybrid', unit: 'kata-ts-x.scope', paths: {}, limits }),
      () => probeSystemdManager('unix:path=/nonexistent/kata-ts-test-bus', silentLogger(), 3_000),
    ]) {
      const err = await errorOf(call());
      expect([err.kind, err.reason]).toEqual(['unavailable', 'SYSTEMD_UNAVAILABLE']);
      expect(err.message).toContain('/nonexistent/kata-ts-test-bus');
    }
  });
});

describe('D-Bus errors as KataErrors', () => {
  const dbusError = (type: string) => Object.assign(new Error('text from systemd'), { name: 'DBusError', type });
  it.each([
    ['org.freedesktop.DBus.Error.ServiceUnknown', 'unavailable', 'SYSTEMD_UNAVAILABLE'],
    ['org.freedesktop.DBus.Error.Spawn.ChildExited', 'unavailable', 'SYSTEMD_UNAVAILABLE'],
    ['org.freedesktop.systemd1.NoSuchUnit', 'not_found', 'SYSTEMD_NO_SUCH_UNIT'],
    ['org.freedesktop.systemd1.UnitExists', 'exists', 'SYSTEMD_UNIT_EXISTS'],
    ['org.freedesktop.DBus.Error.UnixProcessIdUnknown', 'precondition', 'CGROUP_PID_GONE'],
    ['org.freedesktop.DBus.Error.AccessDenied', 'precondition', 'SYSTEMD_ACCESS_DENIED'],
    ['org.freedesktop.DBus.Error.InvalidArgs', 'precondition', 'SYSTEMD_REFUSED'],
    ['org.freedesktop.systemd1.Whatever', 'internal', 'SYSTEMD_CALL_FAILED'],
  ])('%s -> %s %s', (type, kind, reason) => {
    const err = systemdError(dbusError(type), 'StartTransientUnit of x.scope', 'unix:path=/run/bus');
    expect([err.kind, err.reason]).toEqual([kind, reason]);
    expect(err.details).toMatchObject({ dbusError: type });
    expect(err.cause).toBeInstanceOf(Error);
  });
});

describe('limits must apply where systemd placed the VMM', () => {
  it('needs the cpu and memory hierarchies on v1/hybrid, the unified one on v2', () => {
    expect(missingLimitHierarchies({ systemd: '/a', unified: '/b' }, 'hybrid')).toEqual(['cpu', 'memory']);
    expect(missingLimitHierarchies({ 'cpu,cpuacct': '/a', memory: '/b', systemd: '/c' }, 'v1')).toEqual([]);
    expect(missingLimitHierarchies({ cpu: '/a', systemd: '/c' }, 'hybrid')).toEqual(['memory']);
    expect(missingLimitHierarchies({ unified: '/a' }, 'v2')).toEqual([]);
    expect(missingLimitHierarchies({ systemd: '/a' }, 'v2')).toEqual(['unified']);
  });
});
