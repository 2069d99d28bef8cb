import type { CgroupDriverName } from '../config/types.js';

/** A yes/no fact about the host with the sentence that explains it. */
export interface HostCheck {
  ok: boolean;
  message: string;
}

/**
 * What the daemon found out about its host at start, decided once and reported identically by
 * Status, RuntimeConfig, `doctor` and every sandbox's verbose info.
 */
export interface RuntimeFacts {
  configPath: string | null;
  acceleration: { accel: 'kvm' | 'tcg'; reason: string };
  cgroupDriver: { name: CgroupDriverName; source: 'config' | 'detected' };
  qemu: HostCheck;
  guestAssets: HostCheck;
}
