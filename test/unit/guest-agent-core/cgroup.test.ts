import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  cgroupDir,
  diskUsage,
  ensureParentCgroups,
  parseKeyed,
  readCgroupStats,
  readOomKills,
} from '../../../guest/agent/containers/cgroup.js';

let root: string;
beforeEach(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'h6-cgroup-'));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

/** A fake cgroup2 directory holding the files the kernel would show. */
function fakeCgroup(dir: string, files: Record<string, string>): void {
  mkdirSync(dir, { recursive: true });
  for (const [name, text] of Object.entries(files)) writeFileSync(path.join(dir, name), text);
}

describe('cgroup v2 stats from a fixture tree', () => {
  it('converts usage_usec to ns and computes the working set as current - inactive_file', async () => {
    fakeCgroup(root, {
      'cpu.stat': 'usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n',
      'memory.current': '10485760\n',
      'memory.stat': 'anon 4194304\nfile 6291456\ninactive_file 2097152\npgfault 77\npgmajfault 3\n',
      'pids.current': '4\n',
      'memory.max': '20971520\n',
      'memory.events': 'oom 1\noom_kill 1\n',
    });
    expect(await readCgroupStats(root, 42)).toEqual({
      timestampMs: 42,
      cpuUsageNs: 1_500_000n,
      cpuUserNs: 1_000_000n,
      cpuSystemNs: 500_000n,
      memoryUsageBytes: 10485760n,
      memoryWorkingSetBytes: 10485760n - 2097152n,
      memoryRssBytes: 4194304n,
      pageFaults: 77n,
      majorPageFaults: 3n,
      pids: 4n,
      memoryLimitBytes: 20971520n,
      oomKills: 1n,
    });
  });

  it('floors the working set at 0 and reads missing controllers as 0', async () => {
    fakeCgroup(root, { 'memory.current': '100\n', 'memory.stat': 'inactive_file 4096\n', 'memory.max': 'max\n' });
    const stats = await readCgroupStats(root, 0);
    expect(stats.memoryWorkingSetBytes).toBe(0n);
    expect(stats.cpuUsageNs).toBe(0n);
    expect(stats.pids).toBe(0n);
    expect(stats.memoryLimitBytes).toBeUndefined();
  });

  it('reads oom_kill from memory.events, 0 without the memory controller', async () => {
    expect(await readOomKills(root)).toBe(0n);
    fakeCgroup(root, { 'memory.events': 'low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n' });
    expect(await readOomKills(root)).toBe(1n);
  });

  it('parses keyed files, skipping blank and malformed lines', () => {
    expect([...parseKeyed('a 1\n\nb x\nc 3 extra\n')]).toEqual([
      ['a', 1n],
      ['c', 3n],
    ]);
  });
});

describe('pod parent cgroups', () => {
  it('creates the ancestors (not the leaf) and delegates the controllers each parent offers', async () => {
    fakeCgroup(root, { 'cgroup.controllers': 'cpuset cpu io memory hugetlb pids rdma misc\n', 'cgroup.subtree_control': '' });
    // The kernel fills a new cgroup's cgroup.controllers from its parent's subtree_control.
    fakeCgroup(path.join(root, 'kata-ts'), { 'cgroup.controllers': 'cpuset cpu io memory hugetlb pids\n', 'cgroup.subtree_control': '' });
    fakeCgroup(path.join(root, 'kata-ts/pod1'), { 'cgroup.controllers': 'cpu memory pids\n', 'cgroup.subtree_control': '' });
    await ensureParentCgroups(root, '/kata-ts/pod1/ctr1');
    expect(readFileSync(path.join(root, 'cgroup.subtree_control'), 'utf8')).toBe('+cpu +cpuset +io +memory +pids +hugetlb');
    expect(readFileSync(path.join(root, 'kata-ts/pod1/cgroup.subtree_control'), 'utf8')).toBe('+cpu +memory +pids');
    expect(() => readFileSync(path.join(root, 'kata-ts/pod1/ctr1/cgroup.controllers'))).toThrow();
  });

  it('refuses relative and dot-dot cgroup paths', () => {
    expect(() => cgroupDir(root, 'kata-ts/pod')).toThrow(expect.objectContaining({ reason: 'CGROUPS_PATH_INVALID' }));
    expect(() => cgroupDir(root, '/kata-ts/../../etc')).toThrow(expect.objectContaining({ reason: 'CGROUPS_PATH_INVALID' }));
    expect(cgroupDir(root, '/kata-ts/pod/c')).toBe(path.join(root, 'kata-ts/pod/c'));
  });
});

describe('writable layer usage', () => {
  it('counts allocated bytes and inodes, hard links once', async () => {
    const layer = path.join(root, 'upper');
    mkdirSync(path.join(layer, 'd'), { recursive: true });
    writeFileSync(path.join(layer, 'd/a'), Buffer.alloc(64 * 1024, 1));
    const before = await diskUsage(layer);
    expect(before.inodes).toBe(3n);
    expect(before.bytes).toBeGreaterThanOrEqual(64n * 1024n);
    const { linkSync } = await import('node:fs');
    linkSync(path.join(layer, 'd/a'), path.join(layer, 'b'));
    expect(await diskUsage(layer)).toEqual(before);
  });
});
