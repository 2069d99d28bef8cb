/** The one /proc/<pid>/stat reader: comm ends at the last ')', whatever the process named itself. */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { parseProcStat, readProcStatFields } from '../../../src/common/proc-stat.js';

/** A stat line as the kernel writes it: fields 3..24 after the comm, starttime (field 22) included. */
function statLine(pid: number, comm: string, state: string, ppid: number, startTime: number): string {
  const rest = [state, ppid, pid, pid, 0, -1, 4194560, 1, 0, 0, 0, 5, 3, 0, 0, 20, 0, 4, 0, startTime, 123456, 789];
  return `${pid} (${comm}) ${rest.join(' ')}\n`;
}

describe('parseProcStat', () => {
  it('reads pid, comm, state, ppid and start time of a plain line', () => {
    expect(parseProcStat(statLine(42, 'qemu-system-x86', 'S', 7, 987654))).toEqual({
      pid: 42,
      comm: 'qemu-system-x86',
      state: 'S',
      ppid: 7,
      startTimeTicks: 987654,
    });
  });

  it('takes a hostile comm whole: spaces, parentheses and a fake field tail inside it', () => {
    // A comm that imitates the end of a line: a parser splitting at the first ')' would read state
    // 'R', ppid 1 and the wrong start time.
    const comm = 'x) R 1 2 3 (y';
    const fields = parseProcStat(statLine(43, comm, 'Z', 9, 5550));
    expect(fields).toEqual({ pid: 43, comm, state: 'Z', ppid: 9, startTimeTicks: 5550 });
    expect(parseProcStat(statLine(44, ') )', 'T', 1, 3))?.comm).toBe(') )');
    expect(parseProcStat(statLine(45, '', 'S', 1, 3))?.comm).toBe('');
  });

  it('refuses lines that are not a stat line', () => {
    expect(parseProcStat('')).toBeUndefined();
    expect(parseProcStat('42 qemu S 1')).toBeUndefined();
    expect(parseProcStat('42 (qemu) S 1 42 42')).toBeUndefined();
    expect(parseProcStat(statLine(42, 'qemu', 'running', 1, 3))).toBeUndefined();
    expect(parseProcStat(statLine(42, 'qemu', 'S', 1, 3).replace('42 (', '(x) ('))).toBeUndefined();
  });
});

describe('readProcStatFields', () => {
  let root: string;
  beforeEach(() => {
    root = mkdtempSync(path.join(os.tmpdir(), 'proc-stat-'));
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  it('reads a file under the given root, and answers undefined for a missing pid', () => {
    mkdirSync(path.join(root, '42'));
    writeFileSync(path.join(root, '42', 'stat'), statLine(42, 'a (b) c', 'S', 1, 77));
    expect(readProcStatFields(42, root)).toEqual({ pid: 42, comm: 'a (b) c', state: 'S', ppid: 1, startTimeTicks: 77 });
    expect(readProcStatFields(43, root)).toBeUndefined();
  });

  it('throws on a file that does not parse, and on read errors other than a missing process', () => {
    mkdirSync(path.join(root, '42'));
    writeFileSync(path.join(root, '42', 'stat'), 'garbage');
    expect(() => readProcStatFields(42, root)).toThrow(/unexpected format/);
    // A directory where the file should be: EISDIR is a wrong root, not a gone process.
    mkdirSync(path.join(root, '44', 'stat'), { recursive: true });
    expect(() => readProcStatFields(44, root)).toThrow(expect.objectContaining({ code: 'EISDIR' }));
  });

  it('reads this very process from the real /proc', () => {
    const fields = readProcStatFields(process.pid);
    expect(fields?.pid).toBe(process.pid);
    expect(fields?.ppid).toBe(process.ppid);
    expect(fields?.comm.length).toBeGreaterThan(0);
  });
});
