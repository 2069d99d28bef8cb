/**
 * What `kata-ts doctor` says of the pool (docs/pool.md), read from the pool's records without the
 * daemon: the sizes configured, the VMs recorded per handler and whether their QEMU still runs, and
 * where pooled QEMUs wait: the pool's cgroup for the driver and its CPU weight, at nice 19.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { sharesToWeight } from '../../cgroups/index.js';
import { poolCgroupParent } from '../../config/defaults.js';
import type { CgroupDriverName, KataConfig } from '../../config/types.js';
import { isSameLiveProcess } from '../../hypervisor/index.js';
import { POOL_NICE } from './vm.js';

export interface PoolDoctorReport {
  verdict: 'ok' | 'warn';
  message: string;
}

/** Where pooled QEMUs wait, as doctor and the docs say it. */
export function poolPlacementSummary(config: KataConfig, driver: CgroupDriverName): string {
  const shares = config.pool.cpuShares;
  return `in ${driver} cgroup ${poolCgroupParent(config.pool, driver)} at cpu.shares ${shares} (cgroup v2 cpu.weight ${sharesToWeight(shares)}), nice ${POOL_NICE}, until claimed`;
}

export async function poolDoctorReport(config: KataConfig, procRoot = '/proc', driver?: CgroupDriverName): Promise<PoolDoctorReport> {
  const sizes = Object.entries(config.pool.sizes).filter(([, n]) => n > 0);
  const dir = path.join(config.stateDir, 'pool');
  const names = (await fsp.readdir(dir).catch(() => [] as string[])).filter((n) => n.endsWith('.json'));
  const byHandler = new Map<string, { ready: number; booting: number; gone: number }>();
  for (const name of names) {
    try {
      const doc = JSON.parse(await fsp.readFile(path.join(dir, name), 'utf8')) as {
        record: { handler: string; phase: string; vmm: { pid: number; startTimeTicks: number } | null };
      };
      const r = doc.record;
      const c = byHandler.get(r.handler) ?? { ready: 0, booting: 0, gone: 0 };
      if (r.vmm !== null && !isSameLiveProcess(r.vmm.pid, r.vmm.startTimeTicks, procRoot)) c.gone++;
      else if (r.phase === 'ready') c.ready++;
      else c.booting++;
      byHandler.set(r.handler, c);
    } catch {
      // unreadable: the daemon's recovery sets it aside and says so
    }
  }
  if (sizes.length === 0 && byHandler.size === 0) return { verdict: 'ok', message: 'no pool configured (pool.sizes)' };
  const parts = [...new Set([...sizes.map(([h]) => h), ...byHandler.keys()])].map((h) => {
    const c = byHandler.get(h) ?? { ready: 0, booting: 0, gone: 0 };
    return `${h}: size ${config.pool.sizes[h] ?? 0}, ${c.ready} ready, ${c.booting} booting${c.gone > 0 ? `, ${c.gone} whose QEMU is gone` : ''}`;
  });
  const gone = [...byHandler.values()].some((c) => c.gone > 0);
  const where = driver === undefined ? `nice ${POOL_NICE} until claimed` : poolPlacementSummary(config, driver);
  return { verdict: gone ? 'warn' : 'ok', message: `pooled VMs (${where}): ${parts.join('; ')}` };
}
