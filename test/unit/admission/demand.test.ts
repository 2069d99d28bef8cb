import { describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { type AdmissionDemand, type ContainerConfigInput, containerDemand } from '../../../src/runtime/admission/index.js';

const MiB = 1024 * 1024;
const q = (string: string): { string: string } => ({ string });

const ROWS: [string, ContainerConfigInput, AdmissionDemand][] = [
  ['nothing at all', {}, { cpuMillicores: 0, memoryBytes: 0, hugepages: {} }],
  [
    'limits from kubernetes_resources',
    { kubernetes_resources: { limits: { cpu: q('1500m'), memory: q('1Gi') } } },
    { cpuMillicores: 1500, memoryBytes: 1024 * MiB, hugepages: {} },
  ],
  [
    'a container without a limit counts with its request',
    { kubernetes_resources: { requests: { cpu: q('250m'), memory: q('256Mi') } } },
    { cpuMillicores: 250, memoryBytes: 256 * MiB, hugepages: {} },
  ],
  [
    'the limit wins over the request',
    { kubernetes_resources: { requests: { cpu: q('250m'), memory: q('128Mi') }, limits: { cpu: q('1'), memory: q('256Mi') } } },
    { cpuMillicores: 1000, memoryBytes: 256 * MiB, hugepages: {} },
  ],
  [
    'CPU rounded up to a millicore',
    { kubernetes_resources: { limits: { cpu: q('0.0001') } } },
    { cpuMillicores: 1, memoryBytes: 0, hugepages: {} },
  ],
  [
    'hugepages by page size (2048Ki is 2Mi)',
    { kubernetes_resources: { limits: { 'hugepages-2048Ki': q('4Mi'), memory: q('64Mi') } } },
    { cpuMillicores: 0, memoryBytes: 64 * MiB, hugepages: { '2Mi': 4 * MiB } },
  ],
  [
    'extended resources and ephemeral-storage do not count',
    { kubernetes_resources: { limits: { 'example.com/dev': q('2'), 'ephemeral-storage': q('1Gi') } } },
    { cpuMillicores: 0, memoryBytes: 0, hugepages: {} },
  ],
  [
    'kubernetes_resources preferred over linux.resources',
    { kubernetes_resources: { limits: { cpu: q('2') } }, linux: { resources: { cpu_quota: '50000', cpu_period: '100000' } } },
    { cpuMillicores: 2000, memoryBytes: 0, hugepages: {} },
  ],
  [
    'linux.resources: quota/period, memory limit, hugepage limits',
    {
      kubernetes_resources: null,
      linux: {
        resources: {
          cpu_quota: '150000',
          cpu_period: '100000',
          cpu_shares: '1536',
          memory_limit_in_bytes: '268435456',
          hugepage_limits: [
            { page_size: '2MB', limit: '4194304' },
            { page_size: '1GB', limit: '0' },
          ],
        },
      },
    },
    { cpuMillicores: 1500, memoryBytes: 256 * MiB, hugepages: { '2Mi': 4 * MiB } },
  ],
  [
    'linux.resources: a third of a CPU rounds up',
    { linux: { resources: { cpu_quota: '33333', cpu_period: '100000' } } },
    { cpuMillicores: 334, memoryBytes: 0, hugepages: {} },
  ],
  [
    'linux.resources: period 0 is the kernel default 100ms',
    { linux: { resources: { cpu_quota: '50000', cpu_period: '0' } } },
    { cpuMillicores: 500, memoryBytes: 0, hugepages: {} },
  ],
  [
    'linux.resources: no quota counts the shares (the request)',
    { linux: { resources: { cpu_quota: '-1', cpu_shares: '512' } } },
    { cpuMillicores: 500, memoryBytes: 0, hugepages: {} },
  ],
  [
    'linux.resources: the minimum 2 shares are no request',
    { linux: { resources: { cpu_shares: '2' } } },
    { cpuMillicores: 0, memoryBytes: 0, hugepages: {} },
  ],
  [
    'empty kubernetes_resources falls back to linux.resources',
    { kubernetes_resources: { requests: {}, limits: {} }, linux: { resources: { memory_limit_in_bytes: 1048576 } } },
    { cpuMillicores: 0, memoryBytes: MiB, hugepages: {} },
  ],
];

describe('containerDemand', () => {
  it.each(ROWS)('%s', (_name, config, expected) => {
    expect(containerDemand(config)).toEqual(expected);
  });

  const REFUSALS: [string, ContainerConfigInput, string, string][] = [
    [
      'an unparsable quantity',
      { kubernetes_resources: { limits: { cpu: q('lots') } } },
      'QUANTITY_MALFORMED',
      'config.kubernetes_resources.limits["cpu"]',
    ],
    [
      'a limit below its request',
      { kubernetes_resources: { requests: { memory: q('2Gi') }, limits: { memory: q('1Gi') } } },
      'SIZING_LIMIT_BELOW_REQUEST',
      'config.kubernetes_resources.limits["memory"]',
    ],
    ['a malformed int64', { linux: { resources: { cpu_quota: '1.5' } } }, 'SIZING_INTEGER_INVALID', 'config.linux.resources.cpu_quota'],
    [
      'more memory than 2^53 bytes',
      { kubernetes_resources: { limits: { memory: q('1E') } } },
      'ADMISSION_VALUE_TOO_LARGE',
      'config.kubernetes_resources memory',
    ],
  ];
  it.each(REFUSALS)('refuses %s', (_name, config, reason, field) => {
    let caught: unknown;
    try {
      containerDemand(config);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(KataError);
    expect((caught as KataError).kind).toBe('invalid');
    expect((caught as KataError).reason).toBe(reason);
    expect((caught as KataError).message).toContain(field);
  });
});
