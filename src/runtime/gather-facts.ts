import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { detectCgroupDriver } from '../cgroups/detect.js';
import { errorMessage } from '../common/errors.js';
import type { LoadedConfig } from '../config/types.js';
import { chooseAcceleration } from '../hypervisor/accel.js';
import { checkGuestAssets } from '../hypervisor/assets.js';
import { detectHostTee, parseQemuVersion } from '../hypervisor/tee.js';
import type { HostCheck, RuntimeFacts } from './facts.js';

const run = promisify(execFile);

/** Is the configured QEMU there and runnable? Reports its version line when it is. */
export async function checkQemu(qemuBinary: string): Promise<HostCheck> {
  try {
    const { stdout } = await run(qemuBinary, ['--version'], { timeout: 10_000 });
    return { ok: true, message: stdout.split('\n')[0]?.trim() ?? qemuBinary };
  } catch (err) {
    return { ok: false, message: `QEMU binary ${qemuBinary} cannot be run: ${errorMessage(err)}` };
  }
}

/** Decide, once at start, everything Status, RuntimeConfig and `doctor` report about the host. */
export async function gatherFacts(loaded: LoadedConfig): Promise<RuntimeFacts> {
  const { config } = loaded;
  const [qemu, guestAssets, driverName] = await Promise.all([
    checkQemu(config.hypervisor.qemuBinary),
    checkGuestAssets({
      kernelPath: config.hypervisor.kernelPath,
      initrdPath: config.hypervisor.initrdPath,
      guestImagePath: config.hypervisor.guestImagePath,
    }),
    detectCgroupDriver(config.cgroupDriver, config.systemdRuntimeDir),
  ]);
  return {
    configPath: loaded.path,
    acceleration: chooseAcceleration(config.hypervisor.acceleration),
    cgroupDriver: { name: driverName, source: config.cgroupDriver === 'auto' ? 'detected' : 'config' },
    qemu,
    guestAssets,
    tee: { host: detectHostTee(), qemuVersion: qemu.ok ? parseQemuVersion(qemu.message) : null },
  };
}
