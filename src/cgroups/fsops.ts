/**
 * The real cgroup file operations: the kernel's cgroupfs, used by the cgroupfs driver and by
 * detection. Kept tiny so that the v2 unit tests can substitute an imitation (see types.ts).
 */
import { constants, promises as fsp } from 'node:fs';
import type { CgroupFs } from './types.js';

/** statfs f_type values (linux/magic.h). */
export const CGROUP_SUPER_MAGIC = 0x27e0eb;
export const CGROUP2_SUPER_MAGIC = 0x63677270;
export const TMPFS_MAGIC = 0x01021994;

export const realCgroupFs: CgroupFs = {
  async mkdir(dir) {
    await fsp.mkdir(dir, { mode: 0o755 });
  },
  async rmdir(dir) {
    await fsp.rmdir(dir);
  },
  async readFile(file) {
    return fsp.readFile(file, 'utf8');
  },
  async writeFile(file, value) {
    // O_WRONLY without O_CREAT/O_TRUNC: interface files exist or the controller is absent, and
    // the kernel parses each write(2) on its own, so the value goes in a single write.
    const handle = await fsp.open(file, constants.O_WRONLY);
    try {
      await handle.write(value);
    } finally {
      await handle.close();
    }
  },
  async realpath(p) {
    return fsp.realpath(p);
  },
  async fsMagic(p) {
    return (await fsp.statfs(p)).type;
  },
};
