import { defineConfig } from 'vitest/config';
import { scaledMs } from './test/helpers/time-scale.js';

// Two projects: unit tests are pure or touch only temporary directories and run in parallel;
// integration tests boot real QEMU, write real cgroups, run a real registry or systemd, so they
// run one file at a time (two cores, TCG boots take seconds) with generous timeouts. Timeouts are
// sized for an idle two-core machine and scaled like every wait in the tests (test/helpers/time-scale.ts:
// TEST_TIME_SCALE, or a CI default), so a test's own waits give up, with what they saw, before vitest does.
export default defineConfig({
  test: {
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
          globalSetup: ['test/helpers/lease-dir-setup.ts'],
          pool: 'forks',
          poolOptions: { forks: { singleFork: true } },
          testTimeout: scaledMs(240_000),
          hookTimeout: scaledMs(240_000),
        },
      },
    ],
  },
});
