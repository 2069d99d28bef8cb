/**
 * A host process's usage as /proc tells it, for a pod's metrics and `kata-ts ps`: CPU time from
 * `/proc/<pid>/stat` (utime and stime, fields 14 and 15, in clock ticks) and memory from
 * `/proc/<pid>/smaps_rollup` (Rss and Pss, Linux 4.14+). Parsers are pure; readers take the proc
 * root and answer undefined for a process that is gone (or that another process now holds: a pid
 * is only ours together with its start time).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';
import { parseProcStat } from '../common/proc-stat.js';

/**
 * Clock ticks per second of /proc's times (USER_HZ): 100 on every Linux ABI kata-ts runs on
 * (x86-64 and arm64 fix it at 100 whatever the kernel's HZ).
 */
export const CLOCK_TICKS_PER_SECOND = 100;

export interface ProcCpu {
  startTimeTicks: number;
  state: string;
  userSeconds: number;
  systemSeconds: number;
}

export interface ProcMemory {
  rssBytes: number;
  pssBytes: number;
}

/** utime and stime (fields 14, 15) and the start time of a /proc/<pid>/stat text; undefined when it does not parse. */
export function parseProcCpu(text: string): ProcCpu | undefined {
  const fields = parseProcStat(text);
  if (fields === undefined) return undefined;
  // Fields after comm, from field 3: field n is rest[n - 3].
  const rest = text
    .slice(text.lastIndexOf(')') + 2)
    .trimEnd()
    .split(' ');
  const utime = Number(rest[11]);
  const stime = Number(rest[12]);
  if (!Number.isSafeInteger(utime) || !Number.isSafeInteger(stime)) return undefined;
  return {
    startTimeTicks: fields.startTimeTicks,
    state: fields.state,
    userSeconds: utime / CLOCK_TICKS_PER_SECOND,
    systemSeconds: stime / CLOCK_TICKS_PER_SECOND,
  };
}

/** Rss and Pss of a /proc/<pid>/smaps_rollup text, in bytes; undefined when either is missing. */
export function parseSmapsRollup(text: string): ProcMemory | undefined {
  const kib = (name: string): number | undefined => {
    const m = new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(text);
    return m === null ? undefined : Number(m[1]);
  };
  const rss = kib('Rss');
  const pss = kib('Pss');
  if (rss === undefined || pss === undefined) return undefined;
  return { rssBytes: rss * 1024, pssBytes: pss * 1024 };
}

async function readIfThere(file: string): Promise<string | undefined> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'ESRCH' || code === 'EACCES' || code === 'EPERM') return undefined;
    throw err;
  }
}

/** A process named by pid and start time (a record's `vmm`, `virtiofsd`); startTimeTicks null: this pid, whoever it is. */
export interface ProcessRef {
  pid: number;
  startTimeTicks: number | null;
}

/** What /proc says of a process: alive (the same process, not a zombie), CPU and memory. */
export interface ProcessUsage {
  alive: boolean;
  cpu: ProcCpu | undefined;
  memory: ProcMemory | undefined;
}

const GONE: ProcessUsage = { alive: false, cpu: undefined, memory: undefined };

/** Read a process's usage under `procRoot`; not alive when it is gone, a zombie, or another process with its pid. */
export async function readProcessUsage(ref: ProcessRef, procRoot = '/proc'): Promise<ProcessUsage> {
  const dir = path.join(procRoot, String(ref.pid));
  const statText = await readIfThere(path.join(dir, 'stat'));
  const cpu = statText === undefined ? undefined : parseProcCpu(statText);
  if (cpu === undefined) return GONE;
  if (ref.startTimeTicks !== null && cpu.startTimeTicks !== ref.startTimeTicks) return GONE;
  if (cpu.state === 'Z' || cpu.state === 'X') return { alive: false, cpu, memory: undefined };
  const smaps = await readIfThere(path.join(dir, 'smaps_rollup'));
  return { alive: true, cpu, memory: smaps === undefined ? undefined : parseSmapsRollup(smaps) };
}
