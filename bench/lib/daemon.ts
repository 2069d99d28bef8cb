import { randomBytes } from 'node:crypto';
/**
 * A kata-ts daemon run as a real process (`kata-ts serve`) for benches: the same harness the
 * integration tests use (test/helpers/runtime-daemon.ts), with a cgroup parent of its own
 * (`kata-ts-bench-<random>`) and info-level logging, as a deployment would run it: debug logging
 * would tax the daemon's side of the comparison only.
 */
import { createTestRuntime, type TestRuntime, type TestRuntimeOptions } from '../../test/helpers/runtime-daemon.js';

export type BenchDaemon = TestRuntime;

export function createBenchDaemon(
  configDoc: Record<string, unknown> = {},
  options: Pick<TestRuntimeOptions, 'stateTmpfsMiB' | 'netnsPath'> = {},
): Promise<BenchDaemon> {
  return createTestRuntime({ logLevel: 'info', ...configDoc }, { cgroupPrefix: 'kata-ts-bench-', tmpPrefix: 'ktb-', ...options });
}

/** A pod config for a bench pod: its own uid, the bench namespace, a cgroup parent in the daemon's private tree. */
export function benchPodConfig(daemon: BenchDaemon, name: string, labels?: Record<string, string>): Record<string, unknown> {
  const uid = randomBytes(8).toString('hex');
  return {
    metadata: { name, namespace: 'kata-ts-bench', uid, attempt: 0 },
    ...(labels === undefined ? {} : { labels }),
    linux: { cgroup_parent: daemon.cgroupParent(uid) },
  };
}
