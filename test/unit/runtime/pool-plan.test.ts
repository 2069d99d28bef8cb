/**
 * The pool's pure planners: a pooled VM's shape and argv, the fit of a pod's cold plan (each
 * refusal with its reason), and the claim plan that grows the pooled VM into the cold shape.
 */
import { describe, expect, it } from 'vitest';
import { milliCpuToShares } from '../../../src/cgroups/index.js';
import { isKataError } from '../../../src/common/errors.js';
import { defaultConfig, poolCgroupParent } from '../../../src/config/defaults.js';
import { resolveHandler } from '../../../src/config/handlers.js';
import { parseConfigDocument } from '../../../src/config/load.js';
import type { KataConfig } from '../../../src/config/types.js';
import { planSandbox, type SandboxPlan } from '../../../src/runtime/plan.js';
import {
  POOL_NIC_PORT_ID,
  POOL_VFS_PORT_ID,
  type PoolFitInput,
  type PoolKey,
  type PoolVmPlan,
  planClaim,
  planPoolShape,
  planPoolVm,
  poolCgroupLimits,
  poolMiss,
  withPoolCgroup,
} from '../../../src/runtime/pool/plan.js';
import { POOLED_VM_RECORD_KIND } from '../../../src/runtime/pool/record.js';
import type { VmShape } from '../../../src/sizing/types.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';

const HOST = { cpus: 8, memoryMiB: 16_384 };
const PATHS = {
  qmpSocket: '/run/p/qmp.sock',
  readySocket: '/run/p/ready.sock',
  consoleLog: '/run/p/console.log',
  agentSocket: '/run/p/agent.sock',
};
const MiB = 1024 * 1024;

async function pooled(config: KataConfig = defaultConfig(), handlerName = 'kata-ts'): Promise<PoolVmPlan> {
  const env = await fixturePlanEnvironment(HOST, 'no-iommu', config);
  return planPoolVm({
    handler: resolveHandler(config, handlerName),
    host: HOST,
    hypervisor: config.hypervisor,
    accel: env.accel,
    pcieFacts: env.pcieFacts,
    simulateVfioWith: null,
    vmName: 'kata-ts-pool0',
    paths: PATHS,
  });
}

async function coldPlan(
  podConfig: Record<string, unknown>,
  config: KataConfig = defaultConfig(),
  handlerName = 'kata-ts',
): Promise<SandboxPlan> {
  const env = await fixturePlanEnvironment(HOST, 'no-iommu', config);
  return planSandbox({
    config: { metadata: { name: 'web', namespace: 'default', uid: 'u', attempt: 0 }, ...podConfig },
    handler: resolveHandler(config, handlerName),
    host: HOST,
    pcieFacts: env.pcieFacts,
    accel: env.accel,
    hypervisor: config.hypervisor,
    vmName: 'kata-ts-pod0',
    paths: { ...PATHS, virtiofsSocket: '/run/p/vfs.sock' },
  });
}

function limits(cpuMillicores: number, memoryMiB: number) {
  return {
    linux: { resources: { cpu_period: '100000', cpu_quota: String(cpuMillicores * 100), memory_limit_in_bytes: String(memoryMiB * MiB) } },
  };
}

function fitInput(plan: SandboxPlan, pool: PoolVmPlan, over: Partial<PoolFitInput> = {}): PoolFitInput {
  return { plan, key: pool.key, joinsNetns: false, pooled: { key: pool.key, shape: pool.shape }, poolSize: 1, withAgent: true, ...over };
}

describe('planPoolShape', () => {
  it('boots one vCPU and the least RAM, with headroom to the handler and host ceilings in 128 MiB blocks', () => {
    const config = defaultConfig();
    const handler = resolveHandler(config, 'kata-ts');
    const shape = planPoolShape(handler, HOST);
    const { vm } = handler.profile;
    expect(shape.vcpus).toBe(1);
    expect(shape.maxVcpus).toBe(Math.min(vm.maxVcpus, HOST.cpus));
    expect(shape.memoryMiB).toBe(Math.ceil(vm.minMemoryMiB / 2) * 2);
    expect((shape.maxMemoryMiB - shape.memoryMiB) % 128).toBe(0);
    expect(shape.maxMemoryMiB).toBeGreaterThanOrEqual(Math.min(vm.maxMemoryMiB, HOST.memoryMiB));
    expect(shape.maxMemoryMiB - 128).toBeLessThan(Math.min(vm.maxMemoryMiB, HOST.memoryMiB));
  });

  it('is bounded by a small host', () => {
    const shape = planPoolShape(resolveHandler(defaultConfig(), 'kata-ts'), { cpus: 2, memoryMiB: 1000 });
    expect(shape.maxVcpus).toBe(2);
    expect(shape.maxMemoryMiB).toBeLessThan(1000 + 128);
  });
});

describe('planPoolVm', () => {
  it('has neither NIC nor virtio-fs but two root ports of its own on slots 05 and 06', async () => {
    const pool = await pooled();
    const argv = pool.qemu.argv.join(' ');
    expect(argv).not.toContain('vhost-user-fs-pci');
    expect(argv).not.toContain('virtio-net-pci');
    expect(argv).toContain(`pcie-root-port,id=${POOL_VFS_PORT_ID},bus=pcie.0,addr=05.0`);
    expect(argv).toContain(`pcie-root-port,id=${POOL_NIC_PORT_ID},bus=pcie.0,addr=06.0`);
    expect(argv).toContain(`-smp cpus=1,maxcpus=${pool.shape.maxVcpus}`);
    expect(argv).toContain(`virtio-mem-pci`);
  });

  it('has the topology class of a pod without devices', async () => {
    const pool = await pooled();
    const plan = await coldPlan({});
    expect(pool.key.pcieArgs).toEqual(plan.pcie.qemuArgs);
  });
});

describe('poolMiss', () => {
  it('lets a default pod and pods of any size the handler allows take the pooled VM', async () => {
    const pool = await pooled();
    expect(poolMiss(fitInput(await coldPlan({}), pool))).toBeNull();
    for (const mib of [100, 333, 1024, 1500, 4000]) {
      expect(poolMiss(fitInput(await coldPlan(limits(2000, mib)), pool)), `${mib} MiB`).toBeNull();
    }
  });

  it('refuses with POOL_DISABLED when the handler has no pool', async () => {
    const pool = await pooled();
    expect(poolMiss(fitInput(await coldPlan({}), pool, { poolSize: 0 }))?.reason).toBe('POOL_DISABLED');
  });

  it('refuses with POOL_CONFIDENTIAL for the confidential handler, whatever else', async () => {
    const pool = await pooled();
    const plan = await coldPlan({}, defaultConfig(), 'kata-ts-cvm');
    expect(poolMiss(fitInput(plan, pool))?.reason).toBe('POOL_CONFIDENTIAL');
  });

  it("refuses with POOL_NETNS_NOT_OURS a pod that joins its caller's namespace", async () => {
    const pool = await pooled();
    expect(poolMiss(fitInput(await coldPlan({}), pool, { joinsNetns: true }))?.reason).toBe('POOL_NETNS_NOT_OURS');
  });

  it('refuses with POOL_NO_GUEST_AGENT without a guest image', async () => {
    const pool = await pooled();
    expect(poolMiss(fitInput(await coldPlan({}), pool, { withAgent: false }))?.reason).toBe('POOL_NO_GUEST_AGENT');
  });

  it('refuses with POOL_EMPTY when no VM is ready', async () => {
    const pool = await pooled();
    expect(poolMiss(fitInput(await coldPlan({}), pool, { pooled: undefined }))?.reason).toBe('POOL_EMPTY');
  });

  it('refuses with POOL_TOPOLOGY_DIFFERS a pod whose PCIe ports differ', async () => {
    const pool = await pooled();
    const plan = await coldPlan({});
    const other: SandboxPlan = { ...plan, pcie: { ...plan.pcie, qemuArgs: [...plan.pcie.qemuArgs, '-device', 'pcie-root-port,id=x'] } };
    expect(poolMiss(fitInput(other, pool))?.reason).toBe('POOL_TOPOLOGY_DIFFERS');
  });

  it('refuses with POOL_COLD_PLUGGED_DEVICES a pod with functions attached at boot', async () => {
    const pool = await pooled();
    const plan = await coldPlan({});
    const fn = { bdf: '0000:01:00.0', group: '12' } as unknown as SandboxPlan['pcie']['topology']['functions'][number];
    const other: SandboxPlan = { ...plan, pcie: { ...plan.pcie, topology: { ...plan.pcie.topology, functions: [fn] } } };
    expect(poolMiss(fitInput(other, pool))?.reason).toBe('POOL_COLD_PLUGGED_DEVICES');
  });

  it('refuses with POOL_HUGEPAGES a pod with hugepage pools', async () => {
    const pool = await pooled();
    const plan = await coldPlan({});
    const vm: VmShape = { ...plan.sizing.vm, kernelParams: ['hugepagesz=2M', 'hugepages=4'] };
    expect(poolMiss(fitInput({ ...plan, sizing: { ...plan.sizing, vm } }, pool))?.reason).toBe('POOL_HUGEPAGES');
  });

  it('refuses with POOL_GUEST_DIFFERS a VM booted from another guest, naming the field', async () => {
    const pool = await pooled();
    const stale: PoolKey = { ...pool.key, kernelPath: '/old/vmlinuz' };
    const miss = poolMiss(fitInput(await coldPlan({}), pool, { pooled: { key: stale, shape: pool.shape } }));
    expect(miss?.reason).toBe('POOL_GUEST_DIFFERS');
    expect(miss?.message).toContain('kernelPath');
  });

  it('refuses shapes the hot-plug cannot reach, each with its reason', async () => {
    const pool = await pooled();
    const plan = await coldPlan({});
    const withShape = (over: Partial<VmShape>): SandboxPlan => ({
      ...plan,
      sizing: { ...plan.sizing, vm: { ...plan.sizing.vm, ...over } },
    });
    const s = pool.shape;
    expect(poolMiss(fitInput(withShape({ maxVcpus: s.maxVcpus + 1 }), pool))?.reason).toBe('POOL_VCPUS_BEYOND_POOL');
    expect(poolMiss(fitInput(withShape({ maxMemoryMiB: s.maxMemoryMiB + 128 }), pool))?.reason).toBe('POOL_MEMORY_BEYOND_POOL');
    expect(poolMiss(fitInput(withShape({ memoryMiB: s.memoryMiB - 2 }), pool))?.reason).toBe('POOL_MEMORY_BELOW_POOL');
    expect(poolMiss(fitInput(withShape({ memoryMiB: s.memoryMiB + 1 }), pool))?.reason).toBe('POOL_MEMORY_BELOW_POOL');
    const big = { ...pool, shape: { ...s, vcpus: 4 } };
    expect(poolMiss(fitInput(withShape({ vcpus: 2 }), big))?.reason).toBe('POOL_VCPUS_BELOW_POOL');
  });
});

describe('planClaim', () => {
  it('grows the pooled VM to exactly the cold boot shape', async () => {
    const pool = await pooled();
    const plan = await coldPlan(limits(2000, 1024));
    const claim = planClaim(plan, pool.shape, true);
    expect(pool.shape.vcpus + claim.addVcpus).toBe(plan.sizing.vm.vcpus);
    expect(pool.shape.memoryMiB + claim.virtioMemMiB).toBe(plan.sizing.vm.memoryMiB);
    expect(claim.virtioMemMiB).toBeLessThanOrEqual(claim.virtioMemMaxMiB);
    expect(claim.nic).toEqual({ portId: POOL_NIC_PORT_ID });
    expect(claim.sharedFs).toEqual({ portId: POOL_VFS_PORT_ID });
    expect(planClaim(plan, pool.shape, false).nic).toBeNull();
  });
});

describe('pool config', () => {
  it('refuses a non-zero size for the confidential handler and for an unknown handler, naming the key', () => {
    try {
      parseConfigDocument({ pool: { sizes: { 'kata-ts-cvm': 1, nope: 2 } } }, 'test');
      expect.unreachable();
    } catch (err) {
      expect(isKataError(err) && err.reason).toBe('CONFIG_INVALID');
      const problems = (err as { details?: { problems?: string[] } }).details?.problems ?? [];
      expect(problems.some((p) => p.startsWith('/pool/sizes/kata-ts-cvm must be 0'))).toBe(true);
      expect(problems.some((p) => p.startsWith('/pool/sizes/nope names no handler'))).toBe(true);
    }
  });

  it('accepts a size for the default handler and 0 for the confidential one; defaults to no pool', () => {
    const config = parseConfigDocument({ pool: { sizes: { 'kata-ts': 2, 'kata-ts-cvm': 0 } } }, 'test');
    expect(config.pool.sizes['kata-ts']).toBe(2);
    expect(defaultConfig().pool.sizes).toEqual({});
  });
});

describe("the pool's cgroup", () => {
  const problemsOf = (doc: Record<string, unknown>): string[] => {
    try {
      parseConfigDocument(doc, 'test');
    } catch (err) {
      expect(isKataError(err) && err.reason).toBe('CONFIG_INVALID');
      return (err as { details?: { problems?: string[] } }).details?.problems ?? [];
    }
    return [];
  };

  it('defaults to the driver\'s parent and 2 shares; accepts either style under "auto" and its own under a set driver', () => {
    expect(defaultConfig().pool).toMatchObject({ cgroupParent: null, cpuShares: 2 });
    expect(poolCgroupParent(defaultConfig().pool, 'cgroupfs')).toBe('/kata-ts-pool');
    expect(poolCgroupParent(defaultConfig().pool, 'systemd')).toBe('kata_ts_pool.slice');
    const set = parseConfigDocument({ pool: { cgroupParent: '/kubepods/kata-ts-pool', cpuShares: 10 } }, 'test');
    expect(set.pool).toMatchObject({ cgroupParent: '/kubepods/kata-ts-pool', cpuShares: 10 });
    expect(poolCgroupParent(set.pool, 'systemd')).toBe('/kubepods/kata-ts-pool');
    expect(problemsOf({ pool: { cgroupParent: 'pool.slice' } })).toEqual([]);
    expect(problemsOf({ cgroupDriver: 'systemd', pool: { cgroupParent: 'kata_pool.slice' } })).toEqual([]);
  });

  it('refuses a parent of the other style, the root, unusable names and shares out of the kernel range, naming the field', () => {
    const one = (doc: Record<string, unknown>) => {
      const problems = problemsOf(doc);
      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^\/pool\/(cgroupParent|cpuShares)/);
      return problems[0];
    };
    expect(one({ cgroupDriver: 'systemd', pool: { cgroupParent: '/kata-ts-pool' } })).toContain(
      'is a cgroupfs path but cgroupDriver is systemd',
    );
    expect(one({ cgroupDriver: 'cgroupfs', pool: { cgroupParent: 'pool.slice' } })).toContain(
      'is a systemd slice but cgroupDriver is cgroupfs',
    );
    expect(one({ pool: { cgroupParent: '/' } })).toContain('not the root');
    expect(one({ pool: { cgroupParent: 'kata-ts-pool' } })).toContain('must be an absolute cgroupfs path');
    expect(one({ pool: { cgroupParent: '/a/../b' } })).toContain('unusable path component ".."');
    expect(one({ pool: { cgroupParent: '/a/cgroup.procs' } })).toContain('unusable path component "cgroup.procs"');
    expect(one({ pool: { cgroupParent: 'kata-ts-pool.slice' } })).toContain('no "-"');
    expect(one({ pool: { cgroupParent: '-.slice' } })).toContain('no "-"');
    expect(one({ pool: { cpuShares: 1 } })).toContain('/pool/cpuShares');
    expect(one({ pool: { cpuShares: 262_145 } })).toContain('/pool/cpuShares');
  });

  it('gives each pooled VM no quota, no memory limit and the request the kubelet turns into the configured shares', () => {
    for (const shares of [2, 3, 10, 100, 1024, 5000, 262_144]) {
      const limits = poolCgroupLimits(shares);
      expect(limits).toMatchObject({ cpuQuotaMillicores: 0, memoryLimitBytes: 0 });
      expect(milliCpuToShares(limits.cpuRequestMillicores)).toBe(shares);
    }
    // The few shares no request reaches (the conversion steps by 1.024) get the next ones above.
    expect(milliCpuToShares(poolCgroupLimits(1023).cpuRequestMillicores)).toBe(1024);
  });

  it("records the pool's cgroup among a cgroupfs placement's created parents, once, deepest last", () => {
    const base = {
      driver: 'cgroupfs' as const,
      cgroupParent: '/t/pool',
      mode: 'v1' as const,
      paths: { cpu: '/sys/fs/cgroup/cpu/t/pool/kata-ts-x', memory: '/sys/fs/cgroup/memory/t/pool/kata-ts-x' },
      limits: poolCgroupLimits(2),
    };
    expect(withPoolCgroup({ ...base, createdParents: [] }).createdParents).toEqual([
      '/sys/fs/cgroup/cpu/t/pool',
      '/sys/fs/cgroup/memory/t/pool',
    ]);
    const made = ['/sys/fs/cgroup/cpu/t', '/sys/fs/cgroup/cpu/t/pool', '/sys/fs/cgroup/memory/t', '/sys/fs/cgroup/memory/t/pool'];
    expect(withPoolCgroup({ ...base, createdParents: made }).createdParents).toEqual(made);
    const scope = { ...base, driver: 'systemd' as const, unit: 'kata-ts-x.scope', slice: 'kata_ts_pool.slice', paths: {} };
    expect(withPoolCgroup(scope)).toEqual(scope);
  });

  it("migrates a format-1 pooled VM record (booted in the daemon's cgroup) with no placement", () => {
    expect(POOLED_VM_RECORD_KIND.version).toBe(2);
    expect(POOLED_VM_RECORD_KIND.migrate?.(1, { id: 'a' })).toEqual({ id: 'a', placement: null });
    expect(() => POOLED_VM_RECORD_KIND.migrate?.(3, {})).toThrow();
  });
});
