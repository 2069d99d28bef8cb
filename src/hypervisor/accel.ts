import { closeSync, constants, existsSync, openSync } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';
import type { AccelerationSetting } from '../config/types.js';

export type Accelerator = 'kvm' | 'tcg';

/** The accelerator chosen for every VM of this daemon, with the sentence that explains why. */
export interface AccelerationChoice {
  accel: Accelerator;
  reason: string;
}

/** Where to look; parameters so that tests can use temporary trees. */
export interface AccelerationRoots {
  devKvm: string;
  sysModule: string;
}

const HOST_ROOTS: AccelerationRoots = { devKvm: '/dev/kvm', sysModule: '/sys/module' };

/**
 * Decide between KVM and TCG. An explicit setting wins. `auto` picks TCG when /dev/kvm is missing
 * or cannot be opened read-write, and on PVM hosts (`kvm_pvm` module loaded): there /dev/kvm
 * exists but only PVM-built guest kernels run, a stock kernel hangs after "early console in setup
 * code" and `-cpu host` fails on MSR 0x10a. Otherwise KVM.
 *
 * Synchronous on purpose: it runs once at daemon start and for `doctor`.
 */
export function chooseAcceleration(setting: AccelerationSetting, roots: AccelerationRoots = HOST_ROOTS): AccelerationChoice {
  if (setting === 'kvm') return { accel: 'kvm', reason: 'acceleration is set to kvm in the config file' };
  if (setting === 'tcg') return { accel: 'tcg', reason: 'acceleration is set to tcg in the config file' };

  if (!existsSync(roots.devKvm)) {
    return { accel: 'tcg', reason: `${roots.devKvm} does not exist, so VMs run under TCG emulation` };
  }
  try {
    const fd = openSync(roots.devKvm, constants.O_RDWR);
    closeSync(fd);
  } catch (err) {
    return {
      accel: 'tcg',
      reason: `${roots.devKvm} cannot be opened read-write (${errnoCode(err) ?? 'error'}), so VMs run under TCG emulation`,
    };
  }
  const pvm = path.join(roots.sysModule, 'kvm_pvm');
  if (existsSync(pvm)) {
    return {
      accel: 'tcg',
      reason: `${pvm} exists: this is a PVM host where stock guest kernels hang under KVM, so VMs run under TCG emulation`,
    };
  }
  return { accel: 'kvm', reason: `${roots.devKvm} is usable and the host runs ordinary KVM` };
}
