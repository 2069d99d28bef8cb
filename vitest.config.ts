import { defineConfig } from 'vitest/config';

// Two projects: unit tests are pure or touch only temporary directories and run in parallel;
// integration tests boot real QEMU, write real cgroups, run a real registry or systemd, so they
// run one file at a time (two cores, TCG boots take seconds) with generous timeouts.
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          testTimeout: 20_000,
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          pool: 'forks',
          poolOptions: { forks: { singleFork: true } },
          testTimeout: 240_000,
          hookTimeout: 240_000,
        },
      },
    ],
  },
});
