import { readFileSync } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';

/** What /proc/<pid>/stat says about a process, for telling "our QEMU" from a reused pid. */
export interface ProcStat {
  /** One-letter state: R, S, D, Z (zombie), T, ... */
  state: string;
  /** Field 22: start time after boot in clock ticks; with the pid, it names one process for good. */
  startTimeTicks: number;
}

/** Read /proc/<pid>/stat; undefined when the process does not exist. */
export function readProcStat(pid: number, procRoot = '/proc'): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(procRoot, String(pid), 'stat'), 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ESRCH') return undefined;
    throw err;
  }
  // comm (field 2) is in parentheses and may itself contain spaces or ')': split after the last ')'.
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const state = fields[0];
  const startTimeTicks = Number(fields[19]);
  if (state === undefined || !Number.isSafeInteger(startTimeTicks)) {
    throw new Error(`unexpected format of ${procRoot}/${pid}/stat`);
  }
  return { state, startTimeTicks };
}

/** The argv of a process ([] when it is gone or a zombie). */
export function readCmdline(pid: number, procRoot = '/proc'): string[] {
  try {
    const raw = readFileSync(path.join(procRoot, String(pid), 'cmdline'), 'utf8');
    const args = raw.split('\0');
    if (args.at(-1) === '') args.pop();
    return args;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ESRCH') return [];
    throw err;
  }
}

/** True while `pid` is the process that started at `startTimeTicks` and has not exited. */
export function isSameLiveProcess(pid: number, startTimeTicks: number, procRoot = '/proc'): boolean {
  const stat = readProcStat(pid, procRoot);
  return stat !== undefined && stat.startTimeTicks === startTimeTicks && stat.state !== 'Z' && stat.state !== 'X';
}
