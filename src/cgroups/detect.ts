/** Which cgroup driver and which cgroup layout this host has (the facts RuntimeConfig and doctor report). */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, precondition } from '../common/errors.js';
import { isDirectory } from '../common/fsutil.js';
import type { CgroupDriverSetting } from '../config/types.js';
import { CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, realCgroupFs } from './fsops.js';
import type { CgroupDriverName, CgroupFs, CgroupMode } from './types.js';

/**
 * The driver to use. `auto` picks systemd when `systemdRuntimeDir` (/run/systemd/system) is a
 * directory - the test systemd itself uses (sd_booted) - and cgroupfs otherwise; an explicit
 * setting is returned as is.
 */
export async function detectCgroupDriver(setting: CgroupDriverSetting, systemdRuntimeDir: string): Promise<CgroupDriverName> {
  if (setting !== 'auto') return setting;
  return (await isDirectory(systemdRuntimeDir)) ? 'systemd' : 'cgroupfs';
}

/**
 * Classifies the filesystem magics: cgroup2 at the root is v2; otherwise cgroup2 at
 * `<root>/unified` is hybrid; otherwise any v1 hierarchy below the root is v1. Pure.
 */
export function classifyCgroupMode(rootMagic: number, unifiedMagic: number | null, hasV1Hierarchy: boolean): CgroupMode | null {
  if (rootMagic === CGROUP2_SUPER_MAGIC) return 'v2';
  if (unifiedMagic === CGROUP2_SUPER_MAGIC) return 'hybrid';
  if (hasV1Hierarchy) return 'v1';
  return null;
}

async function magicOrNull(fs: CgroupFs, p: string): Promise<number | null> {
  try {
    return await fs.fsMagic(p);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return null;
    throw err;
  }
}

/** The cgroup layout under `cgroupRoot`, from the statfs magic of the root and of root/unified. */
export async function detectCgroupMode(cgroupRoot: string, fs: CgroupFs = realCgroupFs): Promise<CgroupMode> {
  const rootMagic = await magicOrNull(fs, cgroupRoot);
  if (rootMagic === null) {
    throw precondition('CGROUP_ROOT_MISSING', `cgroupRoot ${cgroupRoot} does not exist.`, { details: { cgroupRoot } });
  }
  const unifiedMagic = rootMagic === CGROUP2_SUPER_MAGIC ? null : await magicOrNull(fs, path.join(cgroupRoot, 'unified'));
  let hasV1 = false;
  if (rootMagic !== CGROUP2_SUPER_MAGIC && unifiedMagic !== CGROUP2_SUPER_MAGIC) {
    const entries = await fsp.readdir(cgroupRoot).catch(() => [] as string[]);
    for (const entry of entries) {
      if ((await magicOrNull(fs, path.join(cgroupRoot, entry))) === CGROUP_SUPER_MAGIC) {
        hasV1 = true;
        break;
      }
    }
  }
  const mode = classifyCgroupMode(rootMagic, unifiedMagic, hasV1);
  if (mode === null) {
    throw precondition('CGROUP_ROOT_NOT_CGROUP', `cgroupRoot ${cgroupRoot} holds neither a cgroup2 mount nor any cgroup v1 hierarchy.`, {
      details: { cgroupRoot, rootMagic },
    });
  }
  return mode;
}
