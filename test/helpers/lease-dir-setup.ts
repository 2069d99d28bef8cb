/**
 * vitest globalSetup for the integration project. Test runtimes lease their VMMs' uids from the
 * node-wide lease dir (hypervisor.vmmIdentities.leaseDir, as production runtimes do, so that a test
 * daemon and a test shim never hand out one uid twice). Each runtime removes its own leases; this
 * removes the directory itself at the end of the run when the run created it and it is empty, so
 * a test run leaves /var/lib/kata-ts as it found it. Released numbers leave release marks there
 * (quarantine, src/runtime/sandbox/identities.ts): those whose number has nothing left on the host
 * are swept first, without waiting out the delay (every VM of the run is gone by then).
 */
import { promises as fsp } from 'node:fs';
import { silentLogger } from '../../src/common/logger.js';
import { DEFAULT_VMM_FIRST_ID, DEFAULT_VMM_ID_COUNT, DEFAULT_VMM_LEASE_DIR } from '../../src/config/defaults.js';
import { VmmIdentities } from '../../src/runtime/sandbox/identities.js';

export async function setup(): Promise<() => Promise<void>> {
  const existedBefore = await fsp.stat(DEFAULT_VMM_LEASE_DIR).then(
    () => true,
    () => false,
  );
  return async () => {
    if (existedBefore) return;
    const config = { firstId: DEFAULT_VMM_FIRST_ID, count: DEFAULT_VMM_ID_COUNT, leaseDir: DEFAULT_VMM_LEASE_DIR, quarantineMs: 0 };
    await new VmmIdentities(config, silentLogger()).sweep().catch(() => undefined);
    // rmdir, not rm -r: a lease still there belongs to a pod somebody else runs and is kept.
    await fsp.rmdir(DEFAULT_VMM_LEASE_DIR).catch(() => undefined);
  };
}
