import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { toApiExit, toBackendEvents, toTimestamp } from '../../../guest/agent/containers/crun-backend.js';
import { countCpuList, parseMeminfoKib, readGuestFacts, readGuestUsage } from '../../../guest/agent/containers/guest-facts.js';

let root: string;
const put = (rel: string, text: string) => {
  mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
  writeFileSync(path.join(root, rel), text);
};
beforeEach(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'h6-facts-'));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));
const roots = () => ({ sysRoot: path.join(root, 'sys'), procRoot: path.join(root, 'proc'), cgroupRoot: path.join(root, 'cg') });

describe('guest facts and usage from fixture trees', () => {
  it('counts CPU range lists', () => {
    expect(countCpuList('0-3,5\n')).toBe(5);
    expect(countCpuList('0')).toBe(1);
    expect(countCpuList('')).toBe(0);
  });

  it('parses meminfo in KiB', () => {
    expect(parseMeminfoKib('MemTotal:  1000 kB\nActive(anon):  7 kB\nHugePages_Total: 0\n').get('Active(anon)')).toBe(7);
  });

  it('reads vCPUs, memory, online blocks and the cgroup2 layout', async () => {
    put('sys/devices/system/cpu/online', '0-1\n');
    put('sys/devices/system/memory/block_size_bytes', '8000000\n');
    put('sys/devices/system/memory/memory0/state', 'online\n');
    put('sys/devices/system/memory/memory1/state', 'online\n');
    put('sys/devices/system/memory/memory2/state', 'offline\n');
    put('proc/meminfo', 'MemTotal: 399348 kB\nMemFree: 1000 kB\n');
    put('cg/cgroup.controllers', 'cpu memory pids\n');
    put('cg/cgroup.subtree_control', 'cpu memory\n');
    expect(await readGuestFacts(roots())).toMatchObject({
      onlineVcpus: 2,
      memoryKib: 399348,
      onlineMemoryKib: 2 * 128 * 1024,
      cgroupVersion: 2,
      cgroupControllers: ['cpu', 'memory'],
      runtimeVersion: process.version,
    });
  });

  it('reads the whole guest usage', async () => {
    put('cg/cpu.stat', 'usage_usec 10\nuser_usec 6\nsystem_usec 4\n');
    put('proc/meminfo', 'MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\nAnonPages: 50 kB\n');
    put('proc/vmstat', 'pgfault 9\npgmajfault 1\n');
    mkdirSync(path.join(root, 'proc/1'));
    mkdirSync(path.join(root, 'proc/42'));
    expect(await readGuestUsage(roots())).toEqual({
      cpuUsageNs: 10_000,
      cpuUserNs: 6_000,
      cpuSystemNs: 4_000,
      memoryUsageBytes: 900 * 1024,
      memoryAvailableBytes: 400 * 1024,
      memoryWorkingSetBytes: 600 * 1024,
      memoryRssBytes: 50 * 1024,
      pageFaults: 9,
      majorPageFaults: 1,
      pids: 2,
    });
  });
});

describe('agent API mapping', () => {
  it('converts milliseconds to timestamps and exits to the API shape', () => {
    expect(toTimestamp(1_700_000_000_123)).toEqual({ seconds: 1_700_000_000, nanos: 123_000_000 });
    expect(toApiExit({ exitCode: 137, signal: 9, oomKilled: true, finishedAtMs: 2000 })).toEqual({
      exitCode: 137,
      signal: 9,
      oomKilled: true,
      finishedAt: { seconds: 2, nanos: 0 },
    });
  });

  it('tells each OOM kill as its own event (the core tells one before the exit it caused), and an exit as an exit', () => {
    const exit = { exitCode: 137, signal: 9, oomKilled: true, finishedAtMs: 1000 };
    expect(toBackendEvents({ kind: 'exited', id: 'c', exit }).map((e) => e.kind)).toEqual(['container-exited']);
    expect(toBackendEvents({ kind: 'oom', id: 'c', atMs: 1500, count: 2n })).toEqual([
      { kind: 'oom', containerId: 'c', at: { seconds: 1, nanos: 500_000_000 } },
    ]);
  });
});
