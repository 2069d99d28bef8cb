import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  cgroupFileWrites,
  milliCpuToQuotaUs,
  milliCpuToShares,
  planLimits,
  quotaPerSecUSec,
  SYSTEMD_INFINITY,
  sharesToWeight,
  systemdLimitProperties,
  validateLimits,
} from '../../../src/cgroups/limits.js';
import { KataError } from '../../../src/common/errors.js';

const MiB = 1024 * 1024;

describe('kubelet CPU conversions', () => {
  it('MilliCPUToQuota: period 100000, 0 = no quota, at least 1 ms', () => {
    expect(milliCpuToQuotaUs(0)).toBe(0);
    expect(milliCpuToQuotaUs(1)).toBe(1000);
    expect(milliCpuToQuotaUs(10)).toBe(1000);
    expect(milliCpuToQuotaUs(11)).toBe(1100);
    expect(milliCpuToQuotaUs(250)).toBe(25_000);
    expect(milliCpuToQuotaUs(1500)).toBe(150_000);
    expect(milliCpuToQuotaUs(1234)).toBe(123_400);
  });

  it('MilliCPUToShares: 0 -> 2, truncating, clamped to [2, 262144]', () => {
    expect(milliCpuToShares(0)).toBe(2);
    expect(milliCpuToShares(1)).toBe(2);
    expect(milliCpuToShares(2)).toBe(2);
    expect(milliCpuToShares(3)).toBe(3);
    expect(milliCpuToShares(750)).toBe(768);
    expect(milliCpuToShares(1000)).toBe(1024);
    expect(milliCpuToShares(1234)).toBe(1263);
    expect(milliCpuToShares(256_000)).toBe(262_144);
    expect(milliCpuToShares(1_000_000)).toBe(262_144);
  });

  it('shares -> cpu.weight keeps both defaults and both ends (2->1, 1024->100, 262144->10000)', () => {
    expect(sharesToWeight(2)).toBe(1);
    expect(sharesToWeight(1024)).toBe(100);
    expect(sharesToWeight(262_144)).toBe(10_000);
    expect(sharesToWeight(768)).toBe(80);
    expect(sharesToWeight(2048)).toBe(174);
  });

  it('shares -> cpu.weight is monotonic and within [1, 10000]', () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 262_144 }), fc.integer({ min: 2, max: 262_144 }), (a, b) => {
        const [lo, hi] = a <= b ? [a, b] : [b, a];
        const wl = sharesToWeight(lo);
        const wh = sharesToWeight(hi);
        return wl >= 1 && wh <= 10_000 && wl <= wh;
      }),
    );
  });

  it('CPUQuotaPerSecUSec rounds up to whole percent; no quota is infinity', () => {
    expect(quotaPerSecUSec(0)).toBe(SYSTEMD_INFINITY);
    expect(quotaPerSecUSec(150_000)).toBe(1_500_000n);
    expect(quotaPerSecUSec(123_400)).toBe(1_240_000n);
    expect(quotaPerSecUSec(1000)).toBe(10_000n);
    expect(quotaPerSecUSec(1100)).toBe(20_000n);
  });
});

describe('planLimits', () => {
  it('plans every value from one budget, memory page-aligned', () => {
    expect(planLimits({ cpuQuotaMillicores: 1234, cpuRequestMillicores: 750, memoryLimitBytes: 512 * MiB + 100 })).toEqual({
      periodUs: 100_000,
      quotaUs: 123_400,
      shares: 768,
      weight: 80,
      memoryBytes: 512 * MiB,
      systemdQuotaUs: 124_000,
    });
    expect(planLimits({ cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 })).toMatchObject({
      quotaUs: 0,
      shares: 2,
      weight: 1,
      memoryBytes: 0,
      systemdQuotaUs: 0,
    });
  });

  it.each([
    [{ cpuQuotaMillicores: -1, cpuRequestMillicores: 0, memoryLimitBytes: 0 }, 'cpuQuotaMillicores'],
    [{ cpuQuotaMillicores: 0, cpuRequestMillicores: 1.5, memoryLimitBytes: 0 }, 'cpuRequestMillicores'],
    [{ cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: Number.NaN }, 'memoryLimitBytes'],
    [{ cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 4096 }, 'memoryLimitBytes'],
  ])('refuses %o naming %s', (limits, field) => {
    let err: unknown;
    try {
      validateLimits(limits);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KataError);
    expect((err as KataError).kind).toBe('invalid');
    expect((err as KataError).reason).toBe('CGROUP_LIMITS_INVALID');
    expect((err as KataError).message).toContain(`limits.${field}`);
  });
});

describe('what the drivers write', () => {
  const plan = planLimits({ cpuQuotaMillicores: 1500, cpuRequestMillicores: 750, memoryLimitBytes: 640 * MiB });
  const unlimited = planLimits({ cpuQuotaMillicores: 0, cpuRequestMillicores: 750, memoryLimitBytes: 0 });

  it('v1 (and hybrid): period before quota, shares, memory.limit_in_bytes; -1 for none', () => {
    expect(cgroupFileWrites(plan, 'hybrid')).toEqual([
      { controller: 'cpu', file: 'cpu.cfs_period_us', value: '100000' },
      { controller: 'cpu', file: 'cpu.cfs_quota_us', value: '150000' },
      { controller: 'cpu', file: 'cpu.shares', value: '768' },
      { controller: 'memory', file: 'memory.limit_in_bytes', value: String(640 * MiB) },
    ]);
    expect(cgroupFileWrites(unlimited, 'v1').map((w) => w.value)).toEqual(['100000', '-1', '768', '-1']);
  });

  it('v2: cpu.max, cpu.weight, memory.max; max for none', () => {
    expect(cgroupFileWrites(plan, 'v2')).toEqual([
      { controller: 'cpu', file: 'cpu.max', value: '150000 100000' },
      { controller: 'cpu', file: 'cpu.weight', value: '80' },
      { controller: 'memory', file: 'memory.max', value: String(640 * MiB) },
    ]);
    expect(cgroupFileWrites(unlimited, 'v2').map((w) => w.value)).toEqual(['max 100000', '80', 'max']);
  });

  it('systemd: legacy names on v1/hybrid, unified names on v2, quota always sent', () => {
    expect(systemdLimitProperties(plan, 'hybrid')).toEqual([
      ['MemoryLimit', 't', BigInt(640 * MiB)],
      ['CPUShares', 't', 768n],
      ['CPUQuotaPerSecUSec', 't', 1_500_000n],
    ]);
    expect(systemdLimitProperties(unlimited, 'v2')).toEqual([
      ['MemoryMax', 't', SYSTEMD_INFINITY],
      ['CPUQuotaPerSecUSec', 't', SYSTEMD_INFINITY],
      ['CPUWeight', 't', 80n],
    ]);
  });
});
