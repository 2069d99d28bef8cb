import { readFileSync } from 'node:fs';
import { Containers } from './containers.js';
import { CrunBackend } from './crun-backend.js';
import { GUEST_ROOTS } from './guest-facts.js';
import { rootIsInitramfs } from './runtime.js';

export { Containers } from './containers.js';
export { CrunBackend } from './crun-backend.js';

/** Where things are in the guest image (mounted at /usr) and in the guest's tmpfs /run. */
export const GUEST_PATHS = {
  crun: '/usr/bin/crun',
  /** Built from native/reaper.c by the guest image build (gcc -static). */
  reaper: '/usr/lib/kata-ts/kata-ts-reaper',
  crunState: '/run/crun',
  bundles: '/run/kata-ts/bundles',
} as const;

/**
 * The backend the agent's main runs with: crun with the cgroupfs manager on the guest's cgroup2,
 * `--no-pivot` exactly when the agent's root is the initramfs (pivot_root cannot leave it).
 */
export function createGuestBackend(paths: typeof GUEST_PATHS = GUEST_PATHS): CrunBackend {
  const noPivot = rootIsInitramfs(readFileSync('/proc/self/mountinfo', 'utf8'));
  const containers = new Containers({
    runtime: { command: [paths.crun], stateDir: paths.crunState, cgroupManager: 'cgroupfs', noPivot },
    bundlesDir: paths.bundles,
    reaperPath: paths.reaper,
    cgroupRoot: GUEST_ROOTS.cgroupRoot,
  });
  return new CrunBackend(containers, { roots: GUEST_ROOTS });
}
