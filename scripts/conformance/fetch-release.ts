/**
 * Resolves the containerd release a run through containerd uses (CONFORMANCE_CONTAINERD: 1.7 or
 * 2.1), before scripts/conformance.sh enters its loopback-only network namespace: apt's own client
 * fetches the package into the test-owned cache (test/helpers/containerd-releases.ts), or finds it
 * there. Prints the release on success; exits 2 with the reason when it cannot run here.
 */
import { type ContainerdReleaseLabel, containerdRelease } from '../../test/helpers/containerd-releases.js';

const label = process.argv[2] ?? '';
if (label !== '1.7' && label !== '2.1') {
  process.stderr.write(`conformance: CONFORMANCE_CONTAINERD must be 1.6, 1.7 or 2.1, not '${label}'\n`);
  process.exit(2);
}
const resolved = await containerdRelease(label as ContainerdReleaseLabel);
if (resolved.release === null) {
  process.stderr.write(`conformance: containerd ${label} cannot run here: ${resolved.missing}\n`);
  process.exit(2);
}
process.stdout.write(`==> conformance: containerd ${label} is ${resolved.release.versionText} (${resolved.release.source})\n`);
