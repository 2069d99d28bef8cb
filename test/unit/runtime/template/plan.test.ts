/**
 * The runtime's template planners and guards: a handler's template VM is its pooled VM with the
 * pool's two hot-plug ports; whether a pod may start as a clone (each refusal with its reason);
 * the config's opt-in refused where a clone would be unsafe; the templates' root refused when
 * someone else could have planted a template in it (a hostile root: another owner, a link, a
 * directory others may write).
 */
import { execFileSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isKataError, KataError } from '../../../../src/common/errors.js';
import { defaultConfig } from '../../../../src/config/defaults.js';
import { resolveHandler } from '../../../../src/config/handlers.js';
import { parseConfigDocument } from '../../../../src/config/load.js';
import type { KataConfig } from '../../../../src/config/types.js';
import { planTemplateArgv } from '../../../../src/hypervisor/template.js';
import { planSandbox, type SandboxPlan } from '../../../../src/runtime/plan.js';
import { POOL_NIC_PORT_ID, POOL_VFS_PORT_ID, planPoolVm } from '../../../../src/runtime/pool/plan.js';
import { migrateSandboxRecord, virtioMemBasis } from '../../../../src/runtime/sandbox/record.js';
import { cloneBudgetMs } from '../../../../src/runtime/template/claim.js';
import { ensureTemplateRoot } from '../../../../src/runtime/template/manager.js';
import { planTemplateVm, type TemplateVmPlan, templateMiss } from '../../../../src/runtime/template/plan.js';
import { fixturePlanEnvironment } from '../../../helpers/plan-env.js';

const HOST = { cpus: 8, memoryMiB: 16_384 };
const MiB = 1024 * 1024;
const PATHS = { qmpSocket: '/r/qmp.sock', readySocket: '/r/ready.sock', consoleLog: '/r/console.log', agentSocket: '/r/agent.sock' };
const UNCONFINED = { vmmConfinement: { seccomp: true, unprivileged: false, optOutReason: 'clones (QEMU 7.2)' } };

async function templateOf(config: KataConfig, handler = 'kata-ts'): Promise<TemplateVmPlan> {
  const env = await fixturePlanEnvironment(HOST, 'no-iommu', config);
  return planTemplateVm({
    handler: resolveHandler(config, handler),
    host: HOST,
    hypervisor: config.hypervisor,
    accel: env.accel,
    pcieFacts: env.pcieFacts,
    simulateVfioWith: null,
  });
}

async function podPlan(config: KataConfig, cpuMillicores: number, memoryMiB: number, handler = 'kata-ts'): Promise<SandboxPlan> {
  const env = await fixturePlanEnvironment(HOST, 'no-iommu', config);
  return planSandbox({
    config: {
      metadata: { name: 'web', namespace: 'default', uid: 'u', attempt: 0 },
      linux: {
        resources: { cpu_period: '100000', cpu_quota: String(cpuMillicores * 100), memory_limit_in_bytes: String(memoryMiB * MiB) },
      },
    },
    handler: resolveHandler(config, handler),
    host: HOST,
    pcieFacts: env.pcieFacts,
    accel: env.accel,
    hypervisor: config.hypervisor,
    vmName: 'kata-ts-pod0',
    paths: { ...PATHS, virtiofsSocket: '/r/vfs.sock' },
  });
}

const config = () => parseConfigDocument({ handlers: { 'kata-ts': UNCONFINED }, templates: { handlers: ['kata-ts'] } }, 'test');

describe('planTemplateVm', () => {
  it("is the handler's pooled VM: same key and shape, the agent, the pool's two hot-plug ports in its argv", async () => {
    const c = config();
    const t = await templateOf(c);
    const env = await fixturePlanEnvironment(HOST, 'no-iommu', c);
    const pool = planPoolVm({
      handler: resolveHandler(c, 'kata-ts'),
      host: HOST,
      hypervisor: c.hypervisor,
      accel: env.accel,
      pcieFacts: env.pcieFacts,
      simulateVfioWith: null,
      vmName: 'p',
      paths: PATHS,
    });
    expect(t.key).toEqual(pool.key);
    expect(t.shape).toEqual(pool.shape);
    expect(t.spec.withAgent).toBe(true);
    const argv = planTemplateArgv(t.spec, 'kata-ts-template', PATHS, '/dev/shm/t/ram').join(' ');
    expect(argv).toContain(`pcie-root-port,id=${POOL_VFS_PORT_ID},bus=pcie.0,addr=05.0`);
    expect(argv).toContain(`pcie-root-port,id=${POOL_NIC_PORT_ID},bus=pcie.0,addr=06.0`);
    expect(argv).toContain('mem-path=/dev/shm/t/ram,share=on');
    expect(argv).not.toContain('vhost-user-fs-pci');
    expect(argv).not.toContain('virtio-net-pci');
    // The handler reports free pages (its default); its template VM has no balloon at all.
    expect(resolveHandler(c, 'kata-ts').profile.vm.freePageReporting).toBe(true);
    expect(argv).not.toContain('virtio-balloon');
    expect(() => planTemplateArgv({ ...t.spec, freePageReporting: true }, 'x', PATHS, '/dev/shm/t/ram')).toThrow(
      /freePageReporting must be off/,
    );
  });
});

describe('templateMiss', () => {
  const input = (plan: SandboxPlan, t: TemplateVmPlan, over: Partial<Parameters<typeof templateMiss>[0]> = {}) => ({
    plan,
    optedIn: true,
    template: t,
    joinsNetns: false,
    withAgent: true,
    cniOrNone: true,
    ...over,
  });

  it('lets a pod the template VM can grow into start as a clone', async () => {
    const c = config();
    expect(templateMiss(input(await podPlan(c, 1500, 300), await templateOf(c)))).toBeNull();
  });

  it('names why not: the handler not opted in, a joined namespace, no agent, a shape beyond the template VM', async () => {
    const c = config();
    const t = await templateOf(c);
    const plan = await podPlan(c, 1500, 300);
    expect(templateMiss(input(plan, t, { optedIn: false }))?.reason).toBe('TEMPLATE_DISABLED');
    expect(templateMiss(input(plan, t, { cniOrNone: false }))).toMatchObject({ reason: 'TEMPLATE_NO_FIT' });
    expect(templateMiss(input(plan, t, { joinsNetns: true }))?.message).toContain('POOL_NETNS_NOT_OURS');
    expect(templateMiss(input(plan, t, { withAgent: false }))?.message).toContain('POOL_NO_GUEST_AGENT');
    const small = { ...t, shape: { ...t.shape, maxVcpus: 1 } };
    const miss = templateMiss(input(plan, small));
    expect(miss?.reason).toBe('TEMPLATE_NO_FIT');
    expect(miss?.message).toContain("beyond the template VM's 1");
  });
});

describe('templates in the config', () => {
  const problemsOf = (doc: Record<string, unknown>): string[] => {
    try {
      parseConfigDocument(doc, 'test');
    } catch (err) {
      expect(err).toBeInstanceOf(KataError);
      return ((err as KataError).details?.problems as string[]) ?? [];
    }
    return [];
  };

  it('is off by default, rooted in /dev/shm', () => {
    expect(defaultConfig().templates).toEqual({ handlers: [], root: '/dev/shm/kata-ts-templates' });
  });

  it('refuses an unknown, a confidential and a confined handler, and a root QEMU could not take', () => {
    expect(problemsOf({ templates: { handlers: ['nope'] } })).toEqual([
      expect.stringContaining('/templates/handlers/0 "nope" names no handler'),
    ]);
    expect(problemsOf({ templates: { handlers: ['kata-ts-cvm'] } })).toEqual([
      expect.stringContaining('confidential handler, whose VMs are never cloned'),
    ]);
    // The default profile confines QEMU: a clone would need the shared RAM file writable by it.
    expect(problemsOf({ templates: { handlers: ['kata-ts'] } })).toEqual([
      expect.stringContaining('/handlers/kata-ts/vmmConfinement/unprivileged false'),
    ]);
    for (const root of ['relative/dir', '/dev/shm/a,b', '/dev/shm/../etc']) {
      expect(problemsOf({ handlers: { 'kata-ts': UNCONFINED }, templates: { handlers: ['kata-ts'], root } })).toEqual([
        expect.stringContaining(`/templates/root "${root}"`),
      ]);
    }
    expect(problemsOf({ handlers: { 'kata-ts': UNCONFINED }, templates: { handlers: ['kata-ts'] } })).toEqual([]);
  });
});

describe('ensureTemplateRoot against a hostile root', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-tplroot-'));
  });
  afterAll(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });
  const refusal = async (root: string): Promise<string> => {
    try {
      await ensureTemplateRoot(root);
    } catch (err) {
      if (isKataError(err)) return `${err.reason}: ${err.message}`;
      throw err;
    }
    return 'accepted';
  };

  it('makes a missing root 0700 and takes it', async () => {
    const root = path.join(dir, 'fresh');
    expect(await refusal(root)).toBe('accepted');
    expect((await fsp.stat(root)).mode & 0o777).toBe(0o700);
    expect(await refusal(root)).toBe('accepted');
  });

  it('refuses a root planted by another user, a link to a directory, and a directory others may write', async () => {
    const planted = path.join(dir, 'planted');
    await fsp.mkdir(planted, { mode: 0o700 });
    if (process.getuid?.() === 0) {
      execFileSync('chown', ['65534:65534', planted]);
      expect(await refusal(planted)).toMatch(/^TEMPLATE_ROOT_UNSAFE: .* belongs to uid 65534/);
    }
    const target = path.join(dir, 'target');
    await fsp.mkdir(target, { mode: 0o700 });
    const link = path.join(dir, 'link');
    await fsp.symlink(target, link);
    expect(await refusal(link)).toMatch(/^TEMPLATE_ROOT_UNSAFE: .* is not a directory/);
    const open = path.join(dir, 'open');
    await fsp.mkdir(open);
    await fsp.chmod(open, 0o1777);
    expect(await refusal(open)).toMatch(/^TEMPLATE_ROOT_UNSAFE: .* writable by others \(mode 1777\)/);
    // Nothing was made in any of them.
    for (const d of [planted, target, open]) expect(await fsp.readdir(d)).toEqual([]);
  });
});

describe('the sandbox record of a clone (format 9)', () => {
  it('migrates format 8 as it is, and resizes from the template VM shape', () => {
    const rec = { id: 'x', origin: { kind: 'cold', poolMiss: null } };
    expect(migrateSandboxRecord(8, rec)).toMatchObject(rec);
    const basis = virtioMemBasis({
      origin: {
        kind: 'template',
        templateName: '0123456789abcdef-0123456789abcdef',
        templateShape: { vcpus: 1, memoryMiB: 512, maxVcpus: 2, maxMemoryMiB: 2048 },
        cloneReadyMs: 900,
      },
      plan: { sizing: { vm: { memoryMiB: 768 } } } as never,
      shape: { maxMemoryMiB: 1536 } as never,
    });
    expect(basis).toEqual({ offsetMiB: 256, maxMiB: 1536 });
  });
});

describe('cloneBudgetMs', () => {
  it("is half the pod's ready budget, at least the claim's, never more than the whole", () => {
    expect(cloneBudgetMs(90_000, 30_000)).toBe(45_000);
    expect(cloneBudgetMs(40_000, 30_000)).toBe(30_000);
    expect(cloneBudgetMs(20_000, 30_000)).toBe(20_000);
    expect(cloneBudgetMs(1_200_000, 30_000)).toBe(600_000);
  });
});
