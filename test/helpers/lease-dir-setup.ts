/**
 * vitest globalSetup for the integration project. Test runtimes lease their VMMs' uids from the
 * node-wide lease dir (hypervisor.vmmIdentities.leaseDir, as production runtimes do, so that a test
 * daemon and a test shim never hand out one uid twice). Each runtime removes its own leases; this
 * removes the directory itself at the end of the run when the run created it and it is empty, so
 * a test run leaves /var/lib/kata-ts as it found it.
 */
import { promises as fsp } from 'node:fs';
import { DEFAULT_VMM_LEASE_DIR } from '../../src/config/defaults.js';

export async function setup(): Promise<() => Promise<void>> {
  const existedBefore = await fsp.stat(DEFAULT_VMM_LEASE_DIR).then(
    () => true,
    () => false,
  );
  return async () => {
    if (existedBefore) return;
    // rmdir, not rm -r: a lease still there belongs to a pod somebody else runs and is kept.
    await fsp.rmdir(DEFAULT_VMM_LEASE_DIR).catch(() => undefined);
  };
}
