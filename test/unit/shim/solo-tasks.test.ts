/**
 * ShimTasks in single-container mode over a scripted pod core (no VM): a bundle without CRI
 * annotations boots a pod made for it (its metadata, its resources, no network), then creates the
 * container in it under the same id; Delete removes the container and then the VM; a Create that
 * fails after the boot removes the VM and the output's FIFOs; a refused spec or stdout URI calls
 * nothing. The real boot is test/integration/shim/containerd-ctr.test.ts.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { ContainerEvents } from '../../../src/runtime/container/events.js';
import type { SandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import type { EventPublisher } from '../../../src/shim/events.js';
import { type ShimPod, shimRequestContext } from '../../../src/shim/pod.js';
import { ShimTasks } from '../../../src/shim/tasks.js';

const CTR_RUN = path.join(packageRoot(), 'fixtures', 'containerd', '1.6.20', 'ctr-run.solo.json');
const ID = 'solo-1';

function scriptedPod(stateDir: string, failCreate: boolean) {
  const calls: string[] = [];
  let ranWith: { spec?: SandboxSpec; options?: Record<string, unknown> } = {};
  let createdIn = '';
  let stdio: Record<string, unknown> = {};
  const pod = {
    stateDir,
    facts: { cgroupDriver: { name: 'cgroupfs', source: 'config' } },
    sandboxes: {
      run: async (spec: SandboxSpec, _handler: string, _ctx: unknown, options: Record<string, unknown>) => {
        calls.push('sandboxes.run');
        ranWith = { spec, options };
      },
      find: () => ({ vm: { pid: 4242 }, record: {} }),
      remove: async () => {
        calls.push('sandboxes.remove');
      },
    },
    containers: {
      events: new ContainerEvents(),
      create: async (sandboxId: string, _spec: unknown, _ctx: unknown, options: { stdio: Record<string, unknown> }) => {
        calls.push('containers.create');
        createdIn = sandboxId;
        stdio = options.stdio;
        if (failCreate) throw new Error('the guest refused the container');
      },
      remove: async () => {
        calls.push('containers.remove');
      },
    },
  } as unknown as ShimPod;
  return { pod, calls, ranWith: () => ranWith, createdIn: () => createdIn, stdio: () => stdio };
}

describe('ShimTasks: a container without CRI annotations is a pod of its own', () => {
  let dir: string;
  let bundle: string;
  const ctx = shimRequestContext(silentLogger(), 'test');
  const io = { stdin: '', stdout: '', stderr: '', terminal: false };
  const events = { publish: () => undefined } as unknown as EventPublisher;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-solo-tasks-'));
    bundle = path.join(dir, 'bundle');
    mkdirSync(bundle);
    writeFileSync(path.join(bundle, 'config.json'), readFileSync(CTR_RUN));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const tasksOn = (failCreate = false) => {
    const s = scriptedPod(path.join(dir, 'state'), failCreate);
    return { ...s, tasks: new ShimTasks({ pod: s.pod, events, handler: 'kata-ts', logger: silentLogger(), namespace: 'team.a' }) };
  };

  it('boots the pod made from the container (namespace, id, its own limits, no network), creates the container in it; Delete removes it, then the VM', async () => {
    const { tasks, calls, ranWith, createdIn } = tasksOn();
    expect(await tasks.create({ id: ID, bundle, rootfs: [], ...io }, ctx)).toBe(4242);
    expect(calls).toEqual(['sandboxes.run', 'containers.create']);
    const { spec, options } = ranWith();
    expect(spec?.metadata).toEqual({ name: ID, uid: ID, namespace: 'team-a', attempt: 0 });
    expect(spec?.linux?.resources).toMatchObject({ cpu_quota: '150000', cpu_period: '100000', memory_limit_in_bytes: '268435456' });
    expect(spec?.linux?.cgroup_parent).toBe('/default');
    expect(options).toEqual({ id: ID });
    expect(createdIn()).toBe(ID);
    expect(tasks.state(ID, '')).toMatchObject({ status: 'CREATED', pid: 4242 });
    await tasks.delete(ID, '', ctx);
    expect(calls).toEqual(['sandboxes.run', 'containers.create', 'containers.remove', 'sandboxes.remove']);
    expect(tasks.empty).toBe(true);
    tasks.close();
  });

  it("a Create that fails after the VM booted removes the VM and the output's own FIFOs; no task is left", async () => {
    const { tasks, calls, stdio } = tasksOn(true);
    const log = path.join(dir, 'out.log');
    await expect(
      tasks.create({ id: ID, bundle, rootfs: [], ...io, stdout: `file://${log}`, stderr: `file://${log}` }, ctx),
    ).rejects.toThrow('the guest refused the container');
    expect(calls).toEqual(['sandboxes.run', 'containers.create', 'sandboxes.remove']);
    // The core was handed the shim's FIFOs for the file; they are gone with the failed Create.
    expect(String(stdio().stdout)).toContain(path.join(dir, 'state', 'task-io', ID));
    expect(existsSync(path.join(dir, 'state', 'task-io', ID))).toBe(false);
    expect(tasks.empty).toBe(true);
    expect(() => tasks.state(ID, '')).toThrow(expect.objectContaining({ reason: 'TASK_NOT_FOUND' }));
    tasks.close();
  });

  it('a refused stdout URI or spec calls nothing of the core', async () => {
    const { tasks, calls } = tasksOn();
    await expect(tasks.create({ id: ID, bundle, rootfs: [], ...io, stdout: 'syslog://x' }, ctx)).rejects.toMatchObject({
      reason: 'SHIM_STDIO_INVALID',
    });
    const spec = JSON.parse(readFileSync(CTR_RUN, 'utf8')) as { process: { args: string[] } };
    spec.process.args = [];
    writeFileSync(path.join(bundle, 'config.json'), JSON.stringify(spec));
    await expect(tasks.create({ id: ID, bundle, rootfs: [], ...io }, ctx)).rejects.toMatchObject({ reason: 'SHIM_SPEC_INVALID' });
    expect(calls).toEqual([]);
    expect(tasks.empty).toBe(true);
    tasks.close();
  });
});
