/** What a test asks of /proc: is a process alive, and which of ours are still there. */
import { readdirSync, readFileSync } from 'node:fs';

/**
 * Whether `pid` is a live process. A zombie is not: a shim that daemonized is reaped by whichever
 * process adopted it, in that process's own time, and is gone for every purpose of a test.
 */
export function isRunning(pid: number): boolean {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return false;
  }
  const afterName = stat.lastIndexOf(')');
  return stat.slice(afterName + 2, afterName + 3) !== 'Z';
}

/**
 * Live processes other than this one whose command line mentions `needle` (QEMU, virtiofsd and
 * the shims name their pod's work or state dir): what a test kills, or proves is gone.
 */
export function liveProcessesMentioning(needle: string): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(needle) && isRunning(Number(entry))) out.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}
