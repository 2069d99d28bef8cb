import { readdir, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { GuestFacts } from '../../src/generated/agent/agent.js';

/** Count of CPUs in a kernel cpu list such as `0-3,5`. */
export function countCpuList(text: string): number {
  let n = 0;
  for (const part of text.trim().split(',')) {
    if (part === '') continue;
    const [a, b] = part.split('-').map(Number);
    n += b === undefined ? 1 : b! - a! + 1;
  }
  return n;
}

async function readText(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch {
    return undefined;
  }
}

/**
 * What the guest looks like, read from /proc and /sys (roots are parameters for tests): the same
 * facts the init's KATA_TS_READY line carries, plus the cgroup layout containers get.
 */
export async function readGuestFacts(procRoot = '/proc', sysRoot = '/sys'): Promise<GuestFacts> {
  const meminfo = (await readText(path.join(procRoot, 'meminfo'))) ?? '';
  const memoryKib = Number(/^MemTotal:\s+(\d+)/m.exec(meminfo)?.[1] ?? 0);
  const memDir = path.join(sysRoot, 'devices/system/memory');
  const blockBytes = Number.parseInt((await readText(path.join(memDir, 'block_size_bytes')))?.trim() ?? '0', 16);
  let onlineBlocks = 0;
  for (const entry of await readdir(memDir).catch(() => [] as string[])) {
    if (!/^memory\d+$/.test(entry)) continue;
    if ((await readText(path.join(memDir, entry, 'online')))?.trim() === '1') onlineBlocks += 1;
  }
  const cgroupRoot = path.join(sysRoot, 'fs/cgroup');
  const controllers = await readText(path.join(cgroupRoot, 'cgroup.controllers'));
  const subtree = await readText(path.join(cgroupRoot, 'cgroup.subtree_control'));
  const uptime = Number(((await readText(path.join(procRoot, 'uptime'))) ?? '0').split(' ')[0]);
  return {
    kernelRelease: os.release(),
    onlineVcpus: countCpuList((await readText(path.join(sysRoot, 'devices/system/cpu/online'))) ?? ''),
    memoryKib,
    onlineMemoryKib: (onlineBlocks * blockBytes) / 1024,
    cgroupVersion: controllers === undefined ? 1 : 2,
    cgroupControllers: (subtree ?? '').trim().split(/\s+/).filter(Boolean),
    uptimeSeconds: uptime,
    runtimeVersion: process.version,
  };
}
