/**
 * Placing the VMM per the advertised cgroup driver. The runtime creates the driver named by
 * RuntimeConfig (detectCgroupDriver) and never falls back to the other one: a request that
 * cannot be honoured under it is refused.
 */
import { CgroupfsDriver } from './cgroupfs.js';
import { SystemdDriver } from './systemd.js';
import type { CgroupDriver, CgroupDriverName, CgroupDriverOptions } from './types.js';

export function createCgroupDriver(name: CgroupDriverName, opts: CgroupDriverOptions): CgroupDriver {
  return name === 'systemd' ? new SystemdDriver(opts) : new CgroupfsDriver(opts);
}

export { describeRecord } from './describe.js';
export { detectCgroupDriver, detectCgroupMode } from './detect.js';
export {
  cgroupFileWrites,
  milliCpuToQuotaUs,
  milliCpuToShares,
  millicoresForShares,
  planLimits,
  sharesToWeight,
  systemdLimitProperties,
  VMM_PIDS_MARGIN_PARTS,
  vmmPidsMax,
} from './limits.js';
export { expandSlice, isSystemdStyleParent, parseCgroupfsParent, parseSystemdParent, vmmCgroupName } from './parent.js';
export { probeSystemdManager, type SystemdManagerInfo } from './systemd.js';
export type {
  CgroupDriver,
  CgroupDriverName,
  CgroupDriverOptions,
  CgroupFs,
  CgroupMode,
  PlacementRecord,
  PlaceRequest,
  VmmLimits,
} from './types.js';
