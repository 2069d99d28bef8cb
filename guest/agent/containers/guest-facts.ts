import { readdir, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { errnoCode } from '../../../src/common/errors.js';
import { parseKeyed } from './cgroup.js';

/** Where the guest's kernel interfaces are; parameters so tests can use fixture trees. */
export interface GuestRoots {
  sysRoot: string;
  procRoot: string;
  cgroupRoot: string;
}

export const GUEST_ROOTS: GuestRoots = { sysRoot: '/sys', procRoot: '/proc', cgroupRoot: '/sys/fs/cgroup' };

async function readText(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

/** Number of CPUs in a kernel range list such as "0-3,5". */
export function countCpuList(list: string): number {
  let n = 0;
  for (const range of list.trim().split(',')) {
    if (range === '') continue;
    const [a, b] = range.split('-').map(Number);
    n += b === undefined ? 1 : b - a! + 1;
  }
  return n;
}

export interface GuestFactsData {
  kernelRelease: string;
  onlineVcpus: number;
  memoryKib: number;
  onlineMemoryKib: number;
  cgroupVersion: number;
  cgroupControllers: string[];
  uptimeSeconds: number;
  runtimeVersion: string;
}

/** Facts the host reports: sizes as the guest sees them, cgroup layout, versions. */
export async function readGuestFacts(roots: GuestRoots): Promise<GuestFactsData> {
  const [online, meminfo, blockSize, controllers, subtree] = await Promise.all([
    readText(path.join(roots.sysRoot, 'devices/system/cpu/online')),
    readText(path.join(roots.procRoot, 'meminfo')),
    readText(path.join(roots.sysRoot, 'devices/system/memory/block_size_bytes')),
    readText(path.join(roots.cgroupRoot, 'cgroup.controllers')),
    readText(path.join(roots.cgroupRoot, 'cgroup.subtree_control')),
  ]);
  let onlineBlocks = 0;
  const memoryDir = path.join(roots.sysRoot, 'devices/system/memory');
  const blocks = (await readdir(memoryDir).catch(() => [] as string[])).filter((n) => /^memory\d+$/.test(n));
  for (const b of blocks) if ((await readText(path.join(memoryDir, b, 'state')))?.trim() === 'online') onlineBlocks++;
  const meminfoKib = parseMeminfoKib(meminfo ?? '');
  return {
    kernelRelease: os.release(),
    onlineVcpus: countCpuList(online ?? ''),
    memoryKib: meminfoKib.get('MemTotal') ?? 0,
    onlineMemoryKib: blockSize ? (onlineBlocks * Number.parseInt(blockSize.trim(), 16)) / 1024 : 0,
    cgroupVersion: controllers === undefined ? 1 : 2,
    cgroupControllers: (subtree ?? '').trim().split(/\s+/).filter(Boolean),
    uptimeSeconds: os.uptime(),
    runtimeVersion: process.version,
  };
}

/** /proc/meminfo values in KiB by key. */
export function parseMeminfoKib(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^(\w+(?:\(\w+\))?):\s+(\d+)/.exec(line);
    if (m) out.set(m[1]!, Number(m[2]));
  }
  return out;
}

export interface GuestUsage {
  cpuUsageNs: number;
  cpuUserNs: number;
  cpuSystemNs: number;
  memoryUsageBytes: number;
  memoryAvailableBytes: number;
  memoryWorkingSetBytes: number;
  memoryRssBytes: number;
  pageFaults: number;
  majorPageFaults: number;
  pids: number;
}

/** The whole guest's usage: CPU from the root cgroup's cpu.stat, memory from /proc/meminfo and vmstat. */
export async function readGuestUsage(roots: GuestRoots): Promise<GuestUsage> {
  const [cpuStat, meminfo, vmstat, procEntries] = await Promise.all([
    readText(path.join(roots.cgroupRoot, 'cpu.stat')),
    readText(path.join(roots.procRoot, 'meminfo')),
    readText(path.join(roots.procRoot, 'vmstat')),
    readdir(roots.procRoot).catch(() => [] as string[]),
  ]);
  const cpu = parseKeyed(cpuStat ?? '');
  const mem = parseMeminfoKib(meminfo ?? '');
  const vm = parseKeyed(vmstat ?? '');
  const kib = (key: string) => (mem.get(key) ?? 0) * 1024;
  const usec = (key: string) => Number(cpu.get(key) ?? 0n) * 1000;
  return {
    cpuUsageNs: usec('usage_usec'),
    cpuUserNs: usec('user_usec'),
    cpuSystemNs: usec('system_usec'),
    memoryUsageBytes: kib('MemTotal') - kib('MemFree'),
    memoryAvailableBytes: kib('MemAvailable'),
    memoryWorkingSetBytes: kib('MemTotal') - kib('MemAvailable'),
    memoryRssBytes: kib('AnonPages'),
    pageFaults: Number(vm.get('pgfault') ?? 0n),
    majorPageFaults: Number(vm.get('pgmajfault') ?? 0n),
    pids: procEntries.filter((n) => /^\d+$/.test(n)).length,
  };
}
