import type { PlacementRecord } from './types.js';

/**
 * A placement as flat strings for PodSandboxStatus verbose info: the driver, where the VMM is
 * (unit and slice, or one directory per hierarchy) and the limits it runs under.
 */
export function describeRecord(record: PlacementRecord): Record<string, string> {
  const out: Record<string, string> = {
    cgroupDriver: record.driver,
    cgroupMode: record.mode,
    cgroupParent: record.cgroupParent,
  };
  if (record.unit !== undefined) out.systemdUnit = record.unit;
  if (record.slice !== undefined) out.systemdSlice = record.slice;
  for (const [key, dir] of Object.entries(record.paths)) out[`cgroupPath.${key}`] = dir;
  out.cpuQuotaMillicores = String(record.limits.cpuQuotaMillicores);
  out.cpuRequestMillicores = String(record.limits.cpuRequestMillicores);
  out.memoryLimitBytes = String(record.limits.memoryLimitBytes);
  out.pidsMax = record.pidsMax === undefined ? 'none' : String(record.pidsMax);
  return out;
}
