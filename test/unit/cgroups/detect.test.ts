import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { classifyCgroupMode, detectCgroupDriver, detectCgroupMode } from '../../../src/cgroups/detect.js';
import { CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, TMPFS_MAGIC } from '../../../src/cgroups/fsops.js';
import { createCgroupDriver } from '../../../src/cgroups/index.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { SimulatedCgroup2Fs } from '../../helpers/cgroups-simfs.js';

let tmp: string;
beforeEach(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-cgroups-detect-'));
});
afterEach(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
});

describe('detectCgroupDriver', () => {
  it('auto: systemd exactly when the systemd runtime dir is a directory', async () => {
    await fsp.mkdir(path.join(tmp, 'system'));
    await fsp.writeFile(path.join(tmp, 'file'), '');
    expect(await detectCgroupDriver('auto', path.join(tmp, 'system'))).toBe('systemd');
    expect(await detectCgroupDriver('auto', path.join(tmp, 'missing'))).toBe('cgroupfs');
    expect(await detectCgroupDriver('auto', path.join(tmp, 'file'))).toBe('cgroupfs');
  });

  it('an explicit setting wins over detection', async () => {
    await fsp.mkdir(path.join(tmp, 'system'));
    expect(await detectCgroupDriver('cgroupfs', path.join(tmp, 'system'))).toBe('cgroupfs');
    expect(await detectCgroupDriver('systemd', path.join(tmp, 'missing'))).toBe('systemd');
  });

  it('the driver created is the one detected, in every configuration', async () => {
    await fsp.mkdir(path.join(tmp, 'system'));
    const cases = [
      ['auto', path.join(tmp, 'system'), 'systemd'],
      ['auto', path.join(tmp, 'missing'), 'cgroupfs'],
      ['systemd', path.join(tmp, 'missing'), 'systemd'],
      ['cgroupfs', path.join(tmp, 'system'), 'cgroupfs'],
    ] as const;
    for (const [setting, dir, expected] of cases) {
      const name = await detectCgroupDriver(setting, dir);
      const driver = createCgroupDriver(name, { cgroupRoot: '/sys/fs/cgroup', dbusAddress: null, logger: silentLogger() });
      expect(driver.name).toBe(expected);
    }
  });
});

describe('detectCgroupMode', () => {
  it('classifies statfs magics', () => {
    expect(classifyCgroupMode(CGROUP2_SUPER_MAGIC, null, false)).toBe('v2');
    expect(classifyCgroupMode(TMPFS_MAGIC, CGROUP2_SUPER_MAGIC, true)).toBe('hybrid');
    expect(classifyCgroupMode(TMPFS_MAGIC, null, true)).toBe('v1');
    expect(classifyCgroupMode(TMPFS_MAGIC, TMPFS_MAGIC, false)).toBeNull();
    expect(CGROUP_SUPER_MAGIC).toBe(0x27e0eb);
  });

  it('refuses a root that is missing or holds no cgroup mount', async () => {
    for (const [root, reason] of [
      [path.join(tmp, 'missing'), 'CGROUP_ROOT_MISSING'],
      [tmp, 'CGROUP_ROOT_NOT_CGROUP'],
    ] as const) {
      const err = await detectCgroupMode(root).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(KataError);
      expect([(err as KataError).kind, (err as KataError).reason]).toEqual(['precondition', reason]);
    }
  });

  it('reports v2 for a cgroup2 root (cgroup v2 simulated on a directory tree: this machine is hybrid)', async () => {
    expect(await detectCgroupMode(tmp, new SimulatedCgroup2Fs(tmp))).toBe('v2');
  });
});
