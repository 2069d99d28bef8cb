import { readFileSync } from 'node:fs';
import { errnoCode } from './errors.js';

// Only node:fs here: the guest agent bundles this module (through src/common/procfs.ts).

/** The fields of /proc/<pid>/stat that kata-ts reads (proc(5) numbers them from 1). */
export interface ProcStatFields {
  /** Field 1. */
  pid: number;
  /** Field 2 without its parentheses: the executable's name, at most 15 bytes, chosen by the process. */
  comm: string;
  /** Field 3, one letter: R, S, D, Z (zombie), T, X (dead), ... */
  state: string;
  /** Field 4: the parent's pid (0 for a process whose parent is outside its pid namespace). */
  ppid: number;
  /** Field 22: start time after boot in clock ticks; with the pid, it names one process for good. */
  startTimeTicks: number;
}

/**
 * Parse the text of /proc/<pid>/stat; undefined when it does not have that shape.
 * comm is the only field that is not a number or a letter, and a process may name itself
 * anything, including "a) R 1 (b": so it ends at the LAST ')' of the line, and every field
 * after it is split on single spaces.
 */
export function parseProcStat(text: string): ProcStatFields | undefined {
  const open = text.indexOf(' (');
  const close = text.lastIndexOf(')');
  if (open <= 0 || close < open) return undefined;
  const pid = Number(text.slice(0, open));
  const rest = text
    .slice(close + 2)
    .trimEnd()
    .split(' ');
  const state = rest[0];
  // rest[0] is field 3, so field n is rest[n - 3].
  const ppid = Number(rest[1]);
  const startTimeTicks = Number(rest[19]);
  if (state === undefined || !/^[A-Za-z]$/.test(state)) return undefined;
  if (![pid, ppid, startTimeTicks].every(Number.isSafeInteger)) return undefined;
  return { pid, comm: text.slice(open + 2, close), state, ppid, startTimeTicks };
}

/**
 * Read and parse /proc/<pid>/stat under `procRoot`; undefined when the process does not exist
 * (ENOENT, or ESRCH when it exits while being read). Other read errors, and a file that does not
 * parse, throw: they mean the root is wrong, not that the process is gone.
 */
export function readProcStatFields(pid: number, procRoot = '/proc'): ProcStatFields | undefined {
  const file = `${procRoot}/${pid}/stat`;
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'ESRCH') return undefined;
    throw err;
  }
  const fields = parseProcStat(text);
  if (fields === undefined) throw new Error(`unexpected format of ${file}`);
  return fields;
}
