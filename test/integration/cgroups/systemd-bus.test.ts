/**
 * The systemd driver against a real D-Bus daemon on which no systemd manager runs (a private
 * dbus-daemon --session on the test's own socket; no systemd is started here).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCgroupDriver, probeSystemdManager } from '../../../src/cgroups/index.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';

let dir: string;
let daemon: ChildProcess;
let address: string;

beforeAll(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-cgroups-bus-'));
  address = `unix:path=${path.join(dir, 'bus')}`;
  daemon = spawn('dbus-daemon', ['--session', '--nofork', '--nopidfile', `--address=${address}`], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    if (
      await fsp.stat(path.join(dir, 'bus')).then(
        () => true,
        () => false,
      )
    )
      return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('dbus-daemon did not create its socket');
});

afterAll(async () => {
  if (daemon.exitCode === null && daemon.signalCode === null) {
    const exited = new Promise((r) => daemon.once('exit', r));
    process.kill(daemon.pid as number, 'SIGTERM');
    await exited;
  }
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('systemd driver on a bus without a systemd manager (real dbus-daemon)', () => {
  it('place and probe report UNAVAILABLE, not an internal error', async () => {
    const driver = createCgroupDriver('systemd', {
      cgroupRoot: '/sys/fs/cgroup',
      dbusAddress: address,
      logger: silentLogger(),
      timeoutMs: 10_000,
    });
    const limits = { cpuQuotaMillicores: 1000, cpuRequestMillicores: 500, memoryLimitBytes: 256 * 1024 * 1024 };
    for (const call of [
      () => driver.place({ sandboxId: '12'.repeat(32), cgroupParent: 'kubepods.slice', pid: process.pid, limits }),
      () => probeSystemdManager(address, silentLogger(), 10_000),
    ]) {
      const err = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(KataError);
      expect([(err as KataError).kind, (err as KataError).reason]).toEqual(['unavailable', 'SYSTEMD_UNAVAILABLE']);
    }
    // Nothing was moved.
    expect((await fsp.readFile('/proc/self/cgroup', 'utf8')).includes('kata-ts-')).toBe(false);
  });
});
