/**
 * Independent observations of where a process sits and what its cgroups hold, for scenarios run
 * inside the confined systemd harness: systemctl (a D-Bus client that is not ours), the cgroup
 * files, /proc. Read-only and vitest-free. Also the environment marker that lets the outer test
 * find any process of one harness run on the whole machine afterwards.
 */
import { execFile } from 'node:child_process';
import { promises as fsp, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Environment variable set for a harness run (and inherited by everything started inside it). */
export const RUN_MARKER_VAR = 'KATA_TS_RUN_MARKER';

/** `systemctl --user show UNIT -p ...` as a record (no bus code of ours involved). */
export async function systemctlShow(unit: string, props: string[]): Promise<Record<string, string>> {
  const { stdout } = await run('systemctl', ['--user', 'show', unit, ...props.map((p) => `--property=${p}`)]);
  return Object.fromEntries(
    stdout
      .split('\n')
      .filter((l) => l.includes('='))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
}

/** The kata-ts-*.scope units the manager knows, in any state ('' when none). */
export async function kataUnits(): Promise<string> {
  const { stdout } = await run('systemctl', ['--user', 'list-units', '--all', '--no-legend', '--plain', 'kata-ts-*.scope']);
  return stdout.trim();
}

export async function readOr(file: string): Promise<string | null> {
  return fsp.readFile(file, 'utf8').then(
    (t) => t.trim(),
    () => null,
  );
}

/** The v1 limit files (and pids.current) of one cgroup path, read in each hierarchy. */
export async function v1LimitFiles(cgroupRoot: string, cgroupPath: string): Promise<Record<string, string | null>> {
  const at = (h: string, f: string) => readOr(path.join(cgroupRoot, h, cgroupPath, f));
  return {
    'cpu.cfs_quota_us': await at('cpu', 'cpu.cfs_quota_us'),
    'cpu.cfs_period_us': await at('cpu', 'cpu.cfs_period_us'),
    'cpu.shares': await at('cpu', 'cpu.shares'),
    'memory.limit_in_bytes': await at('memory', 'memory.limit_in_bytes'),
    'pids.current': await at('pids', 'pids.current'),
  };
}

/** Which of the hierarchies (dir names under cgroupRoot) have a directory at `cgroupPath`. */
export async function dirsPresent(cgroupRoot: string, cgroupPath: string): Promise<string[]> {
  const out: string[] = [];
  for (const h of (await fsp.readdir(cgroupRoot)).sort()) {
    if (
      await fsp.stat(path.join(cgroupRoot, h, cgroupPath)).then(
        (s) => s.isDirectory(),
        () => false,
      )
    )
      out.push(h);
  }
  return out;
}

/** Pids whose command line contains `needle`, except this process (visible in this pid namespace). */
export function pidsMentioning(needle: string): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(needle)) out.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

/** Whether a process's environment carries `RUN_MARKER_VAR=marker`. */
export function carriesMarker(pid: number, marker: string): boolean {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').includes(`${RUN_MARKER_VAR}=${marker}`);
  } catch {
    return false;
  }
}

/** `pid: comm` of every process on the machine whose environment carries the marker. */
export function processesCarryingMarker(marker: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    if (!carriesMarker(Number(entry), marker)) continue;
    const comm = (() => {
      try {
        return readFileSync(`/proc/${entry}/comm`, 'utf8').trim();
      } catch {
        return '?';
      }
    })();
    out.push(`${entry}: ${comm}`);
  }
  return out;
}
