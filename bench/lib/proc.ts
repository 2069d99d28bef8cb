/** Small readers and statistics the benches share. */
import { readdirSync, readFileSync } from 'node:fs';

/** VmRSS of a process in KiB from /proc/<pid>/status; undefined when it is gone. */
export function readVmRssKiB(pid: number): number | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return undefined;
  }
  const match = /^VmRSS:\s+(\d+)\s+kB$/m.exec(text);
  return match === null ? undefined : Number(match[1]);
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** Least-squares line through (x, y) points: the slope and the value at x = 0. */
export function linearFit(points: ReadonlyArray<readonly [number, number]>): { slope: number; intercept: number } {
  const n = points.length;
  if (n < 2) return { slope: Number.NaN, intercept: points[0]?.[1] ?? Number.NaN };
  const mx = points.reduce((s, [x]) => s + x, 0) / n;
  const my = points.reduce((s, [, y]) => s + y, 0) / n;
  const sxy = points.reduce((s, [x, y]) => s + (x - mx) * (y - my), 0);
  const sxx = points.reduce((s, [x]) => s + (x - mx) ** 2, 0);
  const slope = sxy / sxx;
  return { slope, intercept: my - slope * mx };
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The median of `samples` VmRSS readings `intervalMs` apart: a Node process's RSS moves with its
 * garbage collector, one reading alone can land on either side of a collection.
 */
export async function sampledVmRssKiB(pid: number, samples = 5, intervalMs = 200): Promise<number> {
  const values: number[] = [];
  for (let i = 0; i < samples; i++) {
    if (i > 0) await sleep(intervalMs);
    const v = readVmRssKiB(pid);
    if (v === undefined) throw new Error(`process ${pid} is gone`);
    values.push(v);
  }
  return median(values);
}

/** Memory of a process from /proc/<pid>/smaps_rollup, in KiB. */
export interface SmapsRollupKiB {
  rss: number;
  /** Proportional set size: shared pages divided among the processes mapping them. */
  pss: number;
  /** Private_Clean + Private_Dirty: pages no other process maps (what ending it would free). */
  private: number;
  swap: number;
}

/** /proc/<pid>/smaps_rollup (Linux 4.14+); undefined when the process is gone. */
export function readSmapsRollupKiB(pid: number): SmapsRollupKiB | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
  } catch {
    return undefined;
  }
  const field = (name: string): number => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(text);
    return match === null ? 0 : Number(match[1]);
  };
  return { rss: field('Rss'), pss: field('Pss'), private: field('Private_Clean') + field('Private_Dirty'), swap: field('Swap') };
}

/** The median of each field over `samples` smaps_rollup readings `intervalMs` apart (see sampledVmRssKiB). */
export async function sampledSmapsRollupKiB(pid: number, samples = 5, intervalMs = 200): Promise<SmapsRollupKiB> {
  const readings: SmapsRollupKiB[] = [];
  for (let i = 0; i < samples; i++) {
    if (i > 0) await sleep(intervalMs);
    const r = readSmapsRollupKiB(pid);
    if (r === undefined) throw new Error(`process ${pid} is gone`);
    readings.push(r);
  }
  const m = (k: keyof SmapsRollupKiB) => median(readings.map((r) => r[k]));
  return { rss: m('rss'), pss: m('pss'), private: m('private'), swap: m('swap') };
}

/** Every live process's pid and arguments (/proc/<pid>/cmdline split at its NULs), this one excluded. */
export function processArgs(): Array<{ pid: number; args: string[] }> {
  const out: Array<{ pid: number; args: string[] }> = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline !== '') out.push({ pid: Number(entry), args: cmdline.replace(/\0$/, '').split('\0') });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}
