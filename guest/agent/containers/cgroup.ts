import type { BigIntStats } from 'node:fs';
import { lstat, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { errnoCode, invalid } from '../../../src/common/errors.js';
import type { ContainerStats } from './types.js';

/**
 * The guest's cgroup v2 layout: crun (cgroupfs manager) creates each container's cgroup at the
 * absolute `linux.cgroupsPath` the host put in the spec, e.g. `/kata-ts/<pod>/<container>`. The
 * agent makes sure every ancestor exists and delegates the controllers a container needs, since a
 * controller is only available in a cgroup when its parent lists it in cgroup.subtree_control.
 */
export const DELEGATED_CONTROLLERS = ['cpu', 'cpuset', 'io', 'memory', 'pids', 'hugetlb'] as const;

/** The cgroup directory of an absolute cgroupsPath under `cgroupRoot`; refuses relative or `..` paths. */
export function cgroupDir(cgroupRoot: string, cgroupsPath: string): string {
  if (!cgroupsPath.startsWith('/') || cgroupsPath.split('/').some((part) => part === '..' || part === '.')) {
    throw invalid('CGROUPS_PATH_INVALID', 'linux.cgroupsPath must be an absolute cgroupfs path without . or ..', {
      details: { cgroupsPath },
    });
  }
  return path.join(cgroupRoot, cgroupsPath);
}

/**
 * Creates the ancestors of `cgroupsPath` (not the container's own cgroup: crun creates that) and
 * enables in each ancestor's subtree_control the delegated controllers its parent offers.
 */
export async function ensureParentCgroups(cgroupRoot: string, cgroupsPath: string): Promise<void> {
  const parts = cgroupsPath.split('/').filter((p) => p.length > 0);
  let dir = cgroupRoot;
  // Enable at the root, then at every ancestor down to the container's parent.
  for (let i = 0; i < parts.length; i++) {
    const available = (await readFile(path.join(dir, 'cgroup.controllers'), 'utf8')).trim().split(/\s+/);
    const wanted = DELEGATED_CONTROLLERS.filter((c) => available.includes(c));
    if (wanted.length > 0) await writeFile(path.join(dir, 'cgroup.subtree_control'), wanted.map((c) => `+${c}`).join(' '));
    if (i === parts.length - 1) break;
    dir = path.join(dir, parts[i]!);
    await mkdir(dir, { recursive: true });
  }
}

/** Parses a flat keyed file (cpu.stat, memory.stat, memory.events): "key value" per line. */
export function parseKeyed(text: string): Map<string, bigint> {
  const out = new Map<string, bigint>();
  for (const line of text.split('\n')) {
    const [key, value] = line.trim().split(/\s+/);
    if (key && value && /^\d+$/.test(value)) out.set(key, BigInt(value));
  }
  return out;
}

async function readOptional(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

function single(text: string | undefined): bigint {
  const v = text?.trim();
  return v && /^\d+$/.test(v) ? BigInt(v) : 0n;
}

/** The oom_kill count of a cgroup (0 when the memory controller is absent). */
/**
 * Kills every process left in a container's cgroup (cgroup v2 `cgroup.kill`, Linux 5.14), as
 * runc's shim does when a container's init exits and the container shares a PID namespace: its
 * other processes would otherwise live on, holding the container's output open, so that its
 * output never ends and containerd 1.7/2.x, which waits for that end, never finishes stopping it.
 * Where the container had a PID namespace of its own, the kernel already ended them with its init
 * and the cgroup is empty: a no-op. A cgroup already gone is nothing to do.
 */
export async function killCgroup(dir: string): Promise<void> {
  try {
    await writeFile(path.join(dir, 'cgroup.kill'), '1');
  } catch (err) {
    if (errnoCode(err) !== 'ENOENT') throw err;
  }
}

export async function readOomKills(dir: string): Promise<bigint> {
  const text = await readOptional(path.join(dir, 'memory.events'));
  return text === undefined ? 0n : (parseKeyed(text).get('oom_kill') ?? 0n);
}

/** Reads CPU, memory and pids usage from a cgroup v2 directory (files missing read as 0). */
export async function readCgroupStats(dir: string, nowMs: number): Promise<ContainerStats> {
  const [cpuStat, memStat, memCurrent, pids, memMax, memEvents] = await Promise.all([
    readOptional(path.join(dir, 'cpu.stat')),
    readOptional(path.join(dir, 'memory.stat')),
    readOptional(path.join(dir, 'memory.current')),
    readOptional(path.join(dir, 'pids.current')),
    readOptional(path.join(dir, 'memory.max')),
    readOptional(path.join(dir, 'memory.events')),
  ]);
  const cpu = parseKeyed(cpuStat ?? '');
  const mem = parseKeyed(memStat ?? '');
  const usage = single(memCurrent);
  const inactiveFile = mem.get('inactive_file') ?? 0n;
  return {
    timestampMs: nowMs,
    cpuUsageNs: (cpu.get('usage_usec') ?? 0n) * 1000n,
    cpuUserNs: (cpu.get('user_usec') ?? 0n) * 1000n,
    cpuSystemNs: (cpu.get('system_usec') ?? 0n) * 1000n,
    memoryUsageBytes: usage,
    memoryWorkingSetBytes: usage > inactiveFile ? usage - inactiveFile : 0n,
    memoryRssBytes: mem.get('anon') ?? 0n,
    pageFaults: mem.get('pgfault') ?? 0n,
    majorPageFaults: mem.get('pgmajfault') ?? 0n,
    pids: single(pids),
    memoryLimitBytes: memMax !== undefined && /^\d+$/.test(memMax.trim()) ? BigInt(memMax.trim()) : undefined,
    oomKills: parseKeyed(memEvents ?? '').get('oom_kill') ?? 0n,
  };
}

/**
 * Bytes and inodes used under `dir` (the writable layer): allocated blocks of every entry on the
 * same filesystem (a mount inside the layer is not the layer's usage), hard links counted once.
 * Walked here rather than by du, whose busybox flavour lacks the options needed.
 */
export async function diskUsage(dir: string): Promise<{ bytes: bigint; inodes: bigint }> {
  const root = await lstat(dir, { bigint: true });
  const seen = new Set<bigint>();
  let bytes = 0n;
  let inodes = 0n;
  const visit = async (p: string, st: BigIntStats): Promise<void> => {
    if (st.dev !== root.dev || seen.has(st.ino)) return;
    seen.add(st.ino);
    bytes += st.blocks * 512n;
    inodes += 1n;
    if (!st.isDirectory()) return;
    for (const name of await readdir(p).catch(ignoreVanished([]))) {
      const child = path.join(p, name);
      const childStat = await lstat(child, { bigint: true }).catch(ignoreVanished(undefined));
      if (childStat) await visit(child, childStat);
    }
  };
  await visit(dir, root);
  return { bytes, inodes };
}

/** Files come and go while the container runs: a vanished entry counts as nothing. */
function ignoreVanished<T>(fallback: T): (err: unknown) => T {
  return (err) => {
    if (errnoCode(err) === 'ENOENT') return fallback;
    throw err;
  };
}
