import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isSameLiveProcess, readCmdline, readProcStat } from '../../../src/common/procfs.js';
import { tailFile } from '../../../src/hypervisor/log-tail.js';

describe('procfs readers', () => {
  let root: string;
  beforeEach(() => {
    root = mkdtempSync(path.join(os.tmpdir(), 'procfs-'));
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const fakeProcess = (pid: number, comm: string, state: string, startTime: number, cmdline: string[]): void => {
    mkdirSync(path.join(root, String(pid)));
    // Fields 3..22: state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt, majflt, cmajflt,
    // utime, stime, cutime, cstime, priority, nice, num_threads, itrealvalue, starttime, then more.
    const rest = [state, 1, pid, pid, 0, -1, 4194560, 1, 0, 0, 0, 5, 3, 0, 0, 20, 0, 4, 0, startTime, 123456, 789];
    writeFileSync(path.join(root, String(pid), 'stat'), `${pid} (${comm}) ${rest.join(' ')}\n`);
    writeFileSync(path.join(root, String(pid), 'cmdline'), `${cmdline.join('\0')}\0`);
  };

  it('reads state and start time even when comm contains spaces and parentheses', () => {
    fakeProcess(42, 'qemu (x) y', 'S', 987654, ['qemu-system-x86_64', '-S']);
    expect(readProcStat(42, root)).toEqual({ state: 'S', startTimeTicks: 987654 });
    expect(readCmdline(42, root)).toEqual(['qemu-system-x86_64', '-S']);
    expect(isSameLiveProcess(42, 987654, root)).toBe(true);
    expect(isSameLiveProcess(42, 987655, root)).toBe(false);
  });

  it('treats zombies and missing pids as gone', () => {
    fakeProcess(43, 'qemu-system-x86', 'Z', 5, []);
    expect(isSameLiveProcess(43, 5, root)).toBe(false);
    expect(readProcStat(44, root)).toBeUndefined();
    expect(readCmdline(44, root)).toEqual([]);
  });

  it('reads this very process from the real /proc', () => {
    const stat = readProcStat(process.pid);
    expect(stat?.state).toMatch(/^[RS]$/);
    expect(isSameLiveProcess(process.pid, stat!.startTimeTicks)).toBe(true);
    expect(readCmdline(process.pid)[0]).toContain('node');
  });

  it('tails a log file', async () => {
    const file = path.join(root, 'log');
    writeFileSync(file, `${Array.from({ length: 50 }, (_, i) => `line ${i}`).join('\r\n')}\r\n`);
    expect(await tailFile(file, 3)).toBe('line 47\nline 48\nline 49');
    expect(await tailFile(path.join(root, 'missing'), 3)).toBe('');
  });
});
