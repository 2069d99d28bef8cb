import type { CgroupDriverName } from '../config/types.js';
import type { HostTeeSupport, QemuVersion } from '../hypervisor/index.js';

/** What decides a handler's TEE: the host's hardware TEEs and the QEMU that would drive them. */
export interface TeeFacts {
  host: HostTeeSupport;
  /** From `qemu --version`; null when QEMU could not be run or said no version. */
  qemuVersion: QemuVersion | null;
}

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
  /** Absent (facts made by hand, as tests do): no hardware TEE, QEMU's version unknown. */
  tee?: TeeFacts;
}
