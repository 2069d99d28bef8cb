/**
 * The Stats answer's cgroup metrics as containerd's CRI and CRI-O read them: the numbers where
 * they go, and every sub-message CRI-O dereferences without a nil check (runtime_vm.go's
 * metricsV1ToCgroupStats / metricsV2ToCgroupStats) present on the wire, also when nothing was
 * measured (a Go reader decodes a present empty message as a non-nil pointer).
 */
import { describe, expect, it } from 'vitest';
import { metricsAny, type UsageReading } from '../../../src/shim/metrics.js';
import { decodeAny } from '../../../src/shim/proto.js';

const reading: UsageReading = {
  cpu: { atNs: 5n, usageNs: 123_456_789n, nanoCores: undefined },
  memory: {
    atNs: 5n,
    workingSetBytes: 6_000_000,
    availableBytes: 4_000_000,
    usageBytes: 8_000_000,
    rssBytes: 5_000_000,
    pageFaults: 70,
    majorPageFaults: 2,
  },
  processCount: 3,
};
const nothing: UsageReading = { cpu: null, memory: null, processCount: null };

describe('metricsAny', () => {
  it('v1: cpu total, memory usage/limit/rss/inactive file, pids', () => {
    const any = metricsAny(reading, 'v1');
    expect(any.type_url).toBe('io.containerd.cgroups.v1.Metrics');
    const m = decodeAny(any, 'io.containerd.cgroups.v1.Metrics');
    expect(m.cpu?.usage?.total).toBe('123456789');
    expect(m.memory).toMatchObject({ rss: '5000000', total_inactive_file: '2000000', pg_fault: '70', pg_maj_fault: '2' });
    expect(m.memory?.usage).toMatchObject({ usage: '8000000', limit: '10000000' });
    expect(m.pids?.current).toBe('3');
  });

  it.each([
    ['a reading', reading],
    ['nothing measured', nothing],
  ])('v1 with %s: pids, cpu.usage, cpu.throttling, memory.usage, .swap, .kernel, .kernel_tcp are all present', (_, usage) => {
    const m = decodeAny(metricsAny(usage, 'v1'), 'io.containerd.cgroups.v1.Metrics');
    expect(m.pids).not.toBeNull();
    expect(m.cpu?.usage).not.toBeNull();
    expect(m.cpu?.throttling).not.toBeNull();
    for (const entry of [m.memory?.usage, m.memory?.swap, m.memory?.kernel, m.memory?.kernel_tcp]) {
      expect(entry).toBeDefined();
      expect(entry).not.toBeNull();
    }
  });

  it('v2: usage in microseconds, memory usage/limit/anon/inactive file; pids, cpu, memory present when nothing was measured', () => {
    const m = decodeAny(metricsAny(reading, 'v2'), 'io.containerd.cgroups.v2.Metrics');
    expect(m.cpu?.usage_usec).toBe('123456');
    expect(m.memory).toMatchObject({ usage: '8000000', usage_limit: '10000000', anon: '5000000', inactive_file: '2000000' });
    const empty = decodeAny(metricsAny(nothing, 'v2'), 'io.containerd.cgroups.v2.Metrics');
    expect([empty.pids, empty.cpu, empty.memory].map((x) => x === null || x === undefined)).toEqual([false, false, false]);
  });
});
