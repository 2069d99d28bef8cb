import { describe, expect, it } from 'vitest';
import { cgroupDirOf, findProcEntry, parseCgroupMounts, parseProcCgroup } from '../../../src/cgroups/procfs.js';

// As on these machines (hybrid, memory under a control-plane path).
const procCgroup = `9:name=systemd:/
8:pids:/
4:memory:/process_api/4413894fe8744b9df139ada32cc643fb
2:cpu,cpuacct:/kubepods/pod1
0::/
`;
const mountinfo = `25 30 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
32 25 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
40 25 0:30 /process_api /mnt/my\\040memory rw,relatime - cgroup cgroup rw,memory
33 25 0:31 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,pids,release_agent=/x
`;

describe('/proc/<pid>/cgroup and mountinfo', () => {
  it('parses hierarchy lines, named and unified ones included', () => {
    const entries = parseProcCgroup(procCgroup);
    expect(entries).toHaveLength(5);
    expect(findProcEntry(entries, 'cpuacct')).toEqual({ hierarchyId: 2, controllers: ['cpu', 'cpuacct'], path: '/kubepods/pod1' });
    expect(findProcEntry(entries, 'name=systemd')?.hierarchyId).toBe(9);
    expect(findProcEntry(entries, '')?.path).toBe('/');
    expect(findProcEntry(entries, 'blkio')).toBeUndefined();
  });

  it('keeps cgroup mounts with their controllers, unescaping paths', () => {
    const mounts = parseCgroupMounts(mountinfo);
    expect(mounts.map((m) => m.mountPoint)).toEqual([
      '/sys/fs/cgroup/unified',
      '/sys/fs/cgroup/systemd',
      '/sys/fs/cgroup/cpu,cpuacct',
      '/sys/fs/cgroup/memory',
      '/mnt/my memory',
      '/sys/fs/cgroup/pids',
    ]);
    expect(mounts[1]?.controllers).toEqual(['name=systemd']);
    expect(mounts[2]?.controllers).toEqual(['cpu', 'cpuacct']);
    expect(mounts[5]?.controllers).toEqual(['pids']);
  });

  it('maps an entry to its directory through the first mount that shows it', () => {
    const mounts = parseCgroupMounts(mountinfo);
    const entries = parseProcCgroup(procCgroup);
    expect(cgroupDirOf(mounts, findProcEntry(entries, 'memory')!)).toBe(
      '/sys/fs/cgroup/memory/process_api/4413894fe8744b9df139ada32cc643fb',
    );
    expect(cgroupDirOf(mounts, findProcEntry(entries, 'cpu')!)).toBe('/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1');
    expect(cgroupDirOf(mounts, findProcEntry(entries, '')!)).toBe('/sys/fs/cgroup/unified');
    // Only the bind of /process_api shows this path: the mount root is stripped.
    const bindOnly = mounts.filter((m) => m.mountPoint === '/mnt/my memory');
    expect(cgroupDirOf(bindOnly, { hierarchyId: 4, controllers: ['memory'], path: '/process_api/x' })).toBe('/mnt/my memory/x');
    expect(cgroupDirOf(bindOnly, { hierarchyId: 4, controllers: ['memory'], path: '/elsewhere' })).toBeUndefined();
  });
});
