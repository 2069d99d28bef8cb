/**
 * The pool's host-side readers on fixture trees: a process's CPU time from /proc/<pid>/stat, and
 * what `kata-ts doctor` says of the recorded pooled VMs.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { defaultConfig } from '../../../src/config/defaults.js';
import { poolDoctorReport } from '../../../src/runtime/pool/doctor.js';
import { cpuMsOf } from '../../../src/runtime/pool/vm.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kts-pool-'));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A /proc/<pid>/stat line: comm with a space and a parenthesis, utime 250 and stime 50 ticks, start time 777. */
function statLine(pid: number): string {
  const after = ['S', '1', '1', '1', '0', '-1', '0', '0', '0', '0', '0', '250', '50', '0', '0', '20', '0', '1', '0', '777'];
  return `${pid} (qemu (x) y) ${after.join(' ')}\n`;
}

describe('cpuMsOf', () => {
  it('adds user and system time (fields 14 and 15) at 100 ticks a second, whatever the comm holds', () => {
    const proc = tmp();
    mkdirSync(path.join(proc, '42'));
    writeFileSync(path.join(proc, '42', 'stat'), statLine(42));
    expect(cpuMsOf(42, proc)).toBe(3000);
    expect(cpuMsOf(43, proc)).toBeNull();
  });
});

describe('poolDoctorReport', () => {
  it('says so when there is no pool', async () => {
    const config = { ...defaultConfig(), stateDir: tmp() };
    expect(await poolDoctorReport(config)).toEqual({ verdict: 'ok', message: 'no pool configured (pool.sizes)' });
  });

  it('counts recorded VMs per handler and warns about one whose QEMU is gone', async () => {
    const stateDir = tmp();
    const proc = tmp();
    mkdirSync(path.join(proc, '42'));
    writeFileSync(path.join(proc, '42', 'stat'), statLine(42));
    mkdirSync(path.join(stateDir, 'pool'));
    const write = (id: string, phase: string, pid: number) =>
      writeFileSync(
        path.join(stateDir, 'pool', `${id}.json`),
        JSON.stringify({ kind: 'pooled-vm', version: 1, record: { handler: 'kata-ts', phase, vmm: { pid, startTimeTicks: 777 } } }),
      );
    write('a', 'ready', 42);
    const config = { ...defaultConfig(), stateDir, pool: { ...defaultConfig().pool, sizes: { 'kata-ts': 2 } } };
    expect(await poolDoctorReport(config, proc)).toEqual({
      verdict: 'ok',
      message: 'pooled VMs (nice 19 until claimed): kata-ts: size 2, 1 ready, 0 booting',
    });
    expect((await poolDoctorReport(config, proc, 'cgroupfs')).message).toBe(
      'pooled VMs (in cgroupfs cgroup /kata-ts-pool at cpu.shares 2 (cgroup v2 cpu.weight 1), nice 19, until claimed): kata-ts: size 2, 1 ready, 0 booting',
    );
    write('b', 'ready', 99);
    const report = await poolDoctorReport(config, proc);
    expect(report.verdict).toBe('warn');
    expect(report.message).toContain('1 whose QEMU is gone');
  });
});
