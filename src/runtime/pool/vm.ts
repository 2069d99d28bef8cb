/** A pooled VM as the daemon holds it, and the host-side helpers the pool and the claim share. */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import type { VmProcess } from '../../hypervisor/index.js';
import type { PooledVmRecord } from './record.js';

export { reniceProcess } from '../../common/procfs.js';
export { poolVmRoot } from '../sandbox/paths.js';

/** A pooled VM the daemon holds: its record, its QEMU and its agent. */
export interface PooledVm {
  record: PooledVmRecord;
  vm: VmProcess;
  agent: AgentClient;
}

/** nice value of a pooled VM's threads until it is claimed (then 0, and its pod's cgroup). */
export const POOL_NICE = 19;

/** A process's user + system CPU time so far (fields 14 and 15 of /proc/<pid>/stat at 100 Hz), in ms. */
export function cpuMsOf(pid: number, procRoot = '/proc'): number | null {
  try {
    const text = readFileSync(path.join(procRoot, String(pid), 'stat'), 'utf8');
    const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(rest[11]) + Number(rest[12]);
    return Number.isFinite(ticks) ? ticks * 10 : null;
  } catch {
    return null;
  }
}
