import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { errnoCode } from './errors.js';
import { type ProcStatFields, readProcStatFields } from './proc-stat.js';

/** What /proc/<pid>/stat says about a process, for telling "our QEMU" from a reused pid. */
export type ProcStat = Pick<ProcStatFields, 'state' | 'startTimeTicks'>;

/** Read /proc/<pid>/stat; undefined when the process does not exist. */
export function readProcStat(pid: number, procRoot = '/proc'): ProcStat | undefined {
  const fields = readProcStatFields(pid, procRoot);
  return fields === undefined ? undefined : { state: fields.state, startTimeTicks: fields.startTimeTicks };
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

/** Every thread of `pid` set to `nice` (the vCPU threads exist once QEMU answers QMP). */
export function reniceProcess(pid: number, nice: number, procRoot = '/proc'): void {
  let tids: string[];
  try {
    tids = readdirSync(path.join(procRoot, String(pid), 'task'));
  } catch {
    return;
  }
  for (const tid of tids) {
    try {
      os.setPriority(Number(tid), nice);
    } catch {
      // a thread that ended meanwhile
    }
  }
}
