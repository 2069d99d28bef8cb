/** Small readers and statistics the benches share. */
import { readFileSync } from 'node:fs';

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
