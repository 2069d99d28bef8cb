import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';
import { scaledMs } from './test/helpers/time-scale.js';

// Unit tests are pure or touch only temporary directories. Integration tests boot real QEMU,
// write real cgroups, run a real registry or systemd; they run two files at a time (project
// `integration`): each file makes its own roots, daemons, namespaces and cgroups and judges only
// what it made, and a file spends much of its time waiting on a guest, a containerd or a grace
// period, so two lanes on two cores finish sooner than one. Timeouts are sized for an idle
// two-core machine and scaled like every wait in the tests (test/helpers/time-scale.ts:
// TEST_TIME_SCALE, or a CI default), so a test's own waits give up, with what they saw, before vitest does.

/**
 * Integration files that run alone, after the others, because they failed beside another file
 * where they pass alone: daemon-crash on the guest's create and start exceeding their then fixed
 * 30 s (the bound is now the kubelet's 2 minutes; kept alone until a two-lane run has passed it),
 * node-shim on two `node` processes left in containerd's cgroup after its pods were removed (not
 * yet explained; the helper now reports their command lines).
 */
const SERIAL_INTEGRATION = ['test/integration/containers/daemon-crash.test.ts', 'test/integration/shim/node-shim.test.ts'];

/**
 * Files whose run time their size does not tell (vitest starts unknown files largest first): the
 * soak is the smallest file and one of the longest. Started first, so that no lane ends the run
 * alone on it.
 */
const LONG_SMALL_FILES = ['test/integration/reliability/soak.test.ts'];

class LongFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const long = (f: TestSpecification): boolean => LONG_SMALL_FILES.some((name) => f.moduleId.endsWith(name));
    return [...sorted.filter(long), ...sorted.filter((f) => !long(f))];
  }
}

const integration = {
  globalSetup: ['test/helpers/lease-dir-setup.ts'],
  pool: 'forks' as const,
  testTimeout: scaledMs(240_000),
  hookTimeout: scaledMs(240_000),
};

export default defineConfig({
  test: {
    // The fork pool is the run's, not a project's (vitest reads maxForks from the root): on two
    // cores its default is one fork. Two lanes, for the unit and the integration project alike.
    poolOptions: { forks: { minForks: 1, maxForks: 2 } },
    sequence: { sequencer: LongFirstSequencer },
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          testTimeout: scaledMs(20_000),
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          exclude: SERIAL_INTEGRATION,
          ...integration,
        },
      },
      {
        // One file at a time, in a run of its own after `integration` (scripts/test.sh).
        test: {
          name: 'integration-serial',
          include: SERIAL_INTEGRATION,
          ...integration,
          poolOptions: { forks: { singleFork: true } },
        },
      },
    ],
  },
});
