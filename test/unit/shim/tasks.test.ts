/**
 * ShimTasks over a scripted pod core (no VM): what CRI-O's VM runtime relies on beyond the
 * containerd face's tests. A container's root filesystem is `root.path` when Create brings no
 * rootfs mounts (CRI-O names its mounted image there); Kill with signal 0 is a liveness probe
 * that ends nothing; an OOM kill the core reports is told by `/tasks/oom` before `/tasks/exit`
 * and, for a CRI-O bundle, by `<bundle>/oom` written before Wait answers.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { ContainerEvents } from '../../../src/runtime/container/events.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import type { EventPublisher } from '../../../src/shim/events.js';
import { type ShimPod, shimRequestContext } from '../../../src/shim/pod.js';
import { CRIO_OOM_FILE, containerRootfsPath, ShimTasks } from '../../../src/shim/tasks.js';
import { deferred } from '../ttrpc/helpers.js';

const FIXTURES = path.join(packageRoot(), 'fixtures', 'cri-o', '1.28');
const SANDBOX = '7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f';
const CONTAINER = '0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0';

/** The scripted pod's state dir (the Task service's task files): in each test's own dir. */
let podStateDir = '';

/** The pod core as far as ShimTasks uses it, scripted. */
function scriptedPod() {
  const calls: string[] = [];
  const events = new ContainerEvents();
  const record = { id: CONTAINER, sandboxId: SANDBOX, state: 'CONTAINER_CREATED', pid: 0, reason: '', exitCode: 0 } as ContainerRecord;
  const exit = deferred<{ exitCode: number; finishedAtNs: string }>();
  // Holds containers.start until released (a test opens it to race two Starts).
  let startGate: Promise<void> = Promise.resolve();
  let starts = 0;
  const agentCalls: string[] = [];
  const execExit = deferred<{ exitCode: number }>();
  const agent = {
    execProcess: async () => {
      agentCalls.push('execProcess');
      return { pid: 99 };
    },
    resizeTty: async (_c: string, execId: string, rows: number, cols: number) => {
      agentCalls.push(`resizeTty ${execId === '' ? 'init' : 'exec'} ${cols}x${rows}`);
    },
    readProcessOutput: async function* () {
      yield { data: Buffer.alloc(0), eof: true };
    },
    waitProcess: () => execExit.promise,
    deleteProcess: async () => undefined,
    signalProcess: async () => undefined,
    pauseContainer: async (id: string) => {
      calls.push(`agent.pauseContainer ${id === CONTAINER ? 'container' : id}`);
    },
    resumeContainer: async (id: string) => {
      calls.push(`agent.resumeContainer ${id === CONTAINER ? 'container' : id}`);
    },
    connection: {
      hold: (refusal: unknown) => {
        calls.push(`agent.hold ${refusal !== undefined}`);
      },
    },
  };
  // The pod's sandbox as pause.ts sees it under its lock (src/runtime/sandbox/pause.ts).
  const sandboxRecord: { id: string; phase: string; state: string; paused?: unknown } = {
    id: SANDBOX,
    phase: 'running',
    state: 'SANDBOX_READY',
  };
  const vm = {
    pid: 4242,
    exitInfo: undefined,
    qmp: {
      stop: async () => {
        calls.push('qmp.stop');
      },
      cont: async () => {
        calls.push('qmp.cont');
      },
    },
  };
  // The container's output stored to its end: resolved at once unless a test holds it.
  let outputStored: Promise<void> = Promise.resolve();
  let createdWith: { rootfs?: string } = {};
  const pod = {
    sandboxes: {
      run: async () => {
        calls.push('sandboxes.run');
      },
      find: () => ({ vm: { pid: 4242 }, record: {} }),
      withSandbox: async (_id: string, fn: (h: unknown) => Promise<unknown>) =>
        fn({ record: sandboxRecord, vm, agent, persist: async () => calls.push(`persist paused=${sandboxRecord.paused != null}`) }),
      stop: async () => {
        calls.push('sandboxes.stop');
      },
    },
    sandboxExited: (_id: string, signal: AbortSignal) =>
      new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true })),
    containers: {
      events,
      create: async (_sandbox: string, _spec: unknown, _ctx: unknown, options: { rootfs?: string }) => {
        createdWith = options;
        calls.push('containers.create');
      },
      start: async () => {
        starts += 1;
        await startGate;
        record.state = 'CONTAINER_RUNNING';
        record.pid = 7;
      },
      resolve: () => record,
      inSandbox: () => [record],
      waitExit: () => exit.promise,
      outputStored: () => {
        calls.push('containers.outputStored');
        return outputStored;
      },
      kill: async (_id: string, signal: number) => {
        calls.push(`containers.kill ${signal}`);
      },
      freeze: async (id: string, frozen: boolean) => {
        calls.push(`containers.freeze ${id === CONTAINER ? 'container' : id} ${frozen}`);
      },
      stop: async () => {
        calls.push('containers.stop');
      },
    },
    guests: { agentOf: () => agent },
    facts: { cgroupDriver: { name: 'cgroupfs', source: 'config' } },
    // Where the Task service keeps its task files (node-task-records.ts).
    get stateDir() {
      return podStateDir;
    },
  } as unknown as ShimPod;
  const holdOutput = (p: Promise<void>) => {
    outputStored = p;
  };
  const holdStart = (p: Promise<void>) => {
    startGate = p;
  };
  return {
    pod,
    calls,
    containerEvents: events,
    record,
    exit,
    holdOutput,
    holdStart,
    starts: () => starts,
    agentCalls,
    execExit,
    createdWith: () => createdWith,
    sandboxRecord,
  };
}

function publisher(): { events: EventPublisher; topics: string[] } {
  const topics: string[] = [];
  return { events: { publish: (topic: string) => topics.push(topic) } as unknown as EventPublisher, topics };
}

describe('containerRootfsPath', () => {
  it('is <bundle>/rootfs with rootfs mounts, else root.path (absolute, or relative to the bundle)', () => {
    expect(containerRootfsPath({ root: { path: '/var/lib/containers/storage/overlay/x/merged' } }, '/b', true)).toBe('/b/rootfs');
    expect(containerRootfsPath({ root: { path: '/var/lib/containers/storage/overlay/x/merged' } }, '/b', false)).toBe(
      '/var/lib/containers/storage/overlay/x/merged',
    );
    expect(containerRootfsPath({ root: { path: 'rootfs' } }, '/b', false)).toBe('/b/rootfs');
    expect(containerRootfsPath({ root: { path: '' } }, '/b', false)).toBe('/b/rootfs');
    expect(containerRootfsPath({}, '/b', false)).toBe('/b/rootfs');
  });
});

describe('ShimTasks for CRI-O', () => {
  let dir: string;
  let sandboxBundle: string;
  let containerBundle: string;
  const ctx = shimRequestContext(silentLogger(), 'test');
  const io = { stdin: '', stdout: '', stderr: '', terminal: false };

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-tasks-'));
    podStateDir = path.join(dir, 'pod-state');
    sandboxBundle = path.join(dir, SANDBOX);
    containerBundle = path.join(dir, CONTAINER);
    mkdirSync(sandboxBundle);
    mkdirSync(containerBundle);
    const sandbox = JSON.parse(readFileSync(path.join(FIXTURES, 'sandbox.config.synthetic.json'), 'utf8')) as {
      annotations: Record<string, string>;
    };
    // CRI-O writes resolv.conf into the pause container's run directory, which is its bundle.
    sandbox.annotations['io.kubernetes.cri-o.ResolvPath'] = path.join(sandboxBundle, 'resolv.conf');
    writeFileSync(path.join(sandboxBundle, 'config.json'), JSON.stringify(sandbox));
    const container = JSON.parse(readFileSync(path.join(FIXTURES, 'container.config.synthetic.json'), 'utf8')) as Record<string, unknown>;
    container.root = { path: path.join(dir, 'merged') };
    writeFileSync(path.join(containerBundle, 'config.json'), JSON.stringify(container));
  });

  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  async function podWithContainer() {
    const s = scriptedPod();
    const p = publisher();
    const tasks = new ShimTasks({ pod: s.pod, events: p.events, handler: 'kata-ts', logger: silentLogger() });
    await tasks.create({ id: SANDBOX, bundle: sandboxBundle, rootfs: [], ...io }, ctx);
    await tasks.start(SANDBOX, '', ctx);
    await tasks.create({ id: CONTAINER, bundle: containerBundle, rootfs: [], ...io }, ctx);
    return { ...s, ...p, tasks };
  }

  it("runs the container on the spec's root.path when Create brings no rootfs mounts (nothing mounted at <bundle>/rootfs)", async () => {
    const { createdWith, tasks } = await podWithContainer();
    expect(createdWith().rootfs).toBe(path.join(dir, 'merged'));
    tasks.close();
  });

  it("reports the VMM's pid for a started container, never the guest pid (a host tool acting on it would touch an unrelated process)", async () => {
    const { tasks, record } = await podWithContainer();
    expect(await tasks.start(CONTAINER, '', ctx)).toBe(4242);
    expect(record.pid).toBe(7);
    expect(tasks.state(CONTAINER, '').pid).toBe(4242);
    expect(tasks.pids(CONTAINER)).toEqual([{ pid: 4242, execId: '' }]);
    tasks.close();
  });

  it('two Starts of one task at once: one starts it, the other is refused (rpcs of a task run one at a time)', async () => {
    const { tasks, holdStart, starts } = await podWithContainer();
    const gate = deferred<void>();
    holdStart(gate.promise);
    const first = tasks.start(CONTAINER, '', ctx);
    const second = tasks.start(CONTAINER, '', ctx);
    gate.resolve();
    expect(await first).toBe(4242);
    await expect(second).rejects.toMatchObject({ reason: 'TASK_ALREADY_STARTED' });
    expect(starts()).toBe(1);
    tasks.close();
  });

  it("ResizePty and CloseIO before an exec's Start are kept and applied to that exec once it runs, not to the container's process", async () => {
    const { tasks, agentCalls, execExit } = await podWithContainer();
    await tasks.start(CONTAINER, '', ctx);
    const spec = { args: ['sh'], cwd: '/', terminal: true, user: { uid: 0, gid: 0 } };
    await tasks.addExec(CONTAINER, 'e1', { stdin: '', stdout: '', stderr: '', terminal: true }, spec);
    await tasks.resizePty(CONTAINER, 'e1', 120, 40);
    await tasks.closeIo(CONTAINER, 'e1');
    expect(agentCalls).toEqual([]);
    expect(await tasks.start(CONTAINER, 'e1', ctx)).toBe(4242);
    expect(agentCalls).toEqual(['execProcess', 'resizeTty exec 120x40']);
    execExit.resolve({ exitCode: 0 });
    expect((await tasks.wait(CONTAINER, 'e1', new AbortController().signal)).status).toBe(0);
    tasks.close();
  });

  it("a pod paused before the shim's restart is PAUSED again once its tasks are recovered from their files (the core's record keeps the pause)", async () => {
    const { tasks, pod, sandboxRecord } = await podWithContainer();
    await tasks.start(CONTAINER, '', ctx);
    await tasks.freeze(SANDBOX, true, ctx);
    tasks.close();
    // The restarted shim's core finds the sandbox with its record, as recovery leaves it.
    const restartedPod = {
      ...pod,
      sandboxes: { ...pod.sandboxes, find: () => ({ vm: { pid: 4242 }, record: sandboxRecord }) },
    } as unknown as ShimPod;
    const again = new ShimTasks({ pod: restartedPod, events: publisher().events, handler: 'kata-ts', logger: silentLogger() });
    await again.recover();
    expect(again.state(SANDBOX, '').status).toBe('PAUSED');
    expect(again.state(CONTAINER, '').status).toBe('PAUSED');
    again.close();
    // Not paused: the recovered tasks run.
    sandboxRecord.paused = null;
    const unpaused = new ShimTasks({ pod: restartedPod, events: publisher().events, handler: 'kata-ts', logger: silentLogger() });
    await unpaused.recover();
    expect(unpaused.state(SANDBOX, '').status).toBe('RUNNING');
    expect(unpaused.state(CONTAINER, '').status).toBe('RUNNING');
    unpaused.close();
  });

  it('Pause of the sandbox task pauses the pod (containers frozen, then the vCPUs stopped; State PAUSED), Resume undoes it in the other order; events once per change', async () => {
    const { tasks, calls, topics } = await podWithContainer();
    await expect(tasks.freeze(CONTAINER, true, ctx)).rejects.toMatchObject({ reason: 'TASK_NOT_RUNNING' });
    await tasks.start(CONTAINER, '', ctx);
    await tasks.freeze(SANDBOX, true, ctx);
    await tasks.freeze(SANDBOX, true, ctx);
    await tasks.freeze(CONTAINER, true, ctx);
    expect(tasks.state(SANDBOX, '').status).toBe('PAUSED');
    expect(tasks.state(CONTAINER, '').status).toBe('PAUSED');
    await tasks.freeze(SANDBOX, false, ctx);
    expect(tasks.state(CONTAINER, '').status).toBe('RUNNING');
    // The container task's own Pause inside a paused pod changes nothing more.
    expect(calls.filter((c) => /^(containers\.freeze|agent\.|qmp\.|persist)/.test(c))).toEqual([
      'agent.pauseContainer container',
      'persist paused=true',
      'agent.hold true',
      'qmp.stop',
      'qmp.cont',
      'agent.hold false',
      'agent.resumeContainer container',
      'persist paused=false',
    ]);
    expect(topics.filter((t) => t === '/tasks/paused' || t === '/tasks/resumed')).toEqual(['/tasks/paused', '/tasks/resumed']);
    tasks.close();
  });

  it('Kill with signal 0 is a liveness probe: the sandbox VM and a created container are not ended; a started one is asked', async () => {
    const { calls, tasks } = await podWithContainer();
    await tasks.kill(SANDBOX, '', 0, false, ctx);
    await tasks.kill(CONTAINER, '', 0, false, ctx);
    expect(tasks.state(SANDBOX, '').status).toBe('RUNNING');
    expect(tasks.state(CONTAINER, '').status).toBe('CREATED');
    await tasks.start(CONTAINER, '', ctx);
    await tasks.kill(CONTAINER, '', 0, true, ctx);
    expect(calls.filter((c) => c.includes('stop') || c.includes('kill'))).toEqual(['containers.kill 0']);
    tasks.close();
  });

  it('an OOM kill: /tasks/oom before /tasks/exit, and <bundle>/oom exists when Wait answers 137', async () => {
    const { tasks, topics, containerEvents, record, exit } = await podWithContainer();
    await tasks.start(CONTAINER, '', ctx);
    const waited = tasks.wait(CONTAINER, '', new AbortController().signal).then((e) => {
      expect(existsSync(path.join(containerBundle, CRIO_OOM_FILE))).toBe(true);
      return e;
    });
    record.reason = 'OOMKilled';
    record.exitCode = 137;
    containerEvents.emitOom(record, '5000');
    exit.resolve({ exitCode: 137, finishedAtNs: '5000' });
    expect((await waited).status).toBe(137);
    expect(topics.filter((t) => t === '/tasks/oom' || t === '/tasks/exit')).toEqual(['/tasks/oom', '/tasks/exit']);
    tasks.close();
  });

  it('kills of processes other than the init while it runs: a /tasks/oom for each, the oom file once, the task still running', async () => {
    const { tasks, topics, containerEvents, record } = await podWithContainer();
    await tasks.start(CONTAINER, '', ctx);
    containerEvents.emitOom(record, '5000');
    containerEvents.emitOom(record, '6000');
    await new Promise((r) => setTimeout(r, 10));
    expect(topics.filter((t) => t === '/tasks/oom')).toEqual(['/tasks/oom', '/tasks/oom']);
    expect(existsSync(path.join(containerBundle, CRIO_OOM_FILE))).toBe(true);
    expect(tasks.state(CONTAINER, '').status).toBe('RUNNING');
    tasks.close();
  });

  it('an exit the core recorded as OOMKilled without the event reaching the shim is told the same way, once', async () => {
    const { tasks, topics, record, exit } = await podWithContainer();
    await tasks.start(CONTAINER, '', ctx);
    record.reason = 'OOMKilled';
    exit.resolve({ exitCode: 137, finishedAtNs: '5000' });
    expect((await tasks.wait(CONTAINER, '', new AbortController().signal)).status).toBe(137);
    expect(existsSync(path.join(containerBundle, CRIO_OOM_FILE))).toBe(true);
    expect(topics.filter((t) => t === '/tasks/oom' || t === '/tasks/exit')).toEqual(['/tasks/oom', '/tasks/exit']);
    tasks.close();
  });

  it("TaskExit waits until the container's output is stored (containerd closes the FIFOs as it handles the exit)", async () => {
    const { tasks, topics, record, exit, holdOutput } = await podWithContainer();
    const stored = deferred<void>();
    holdOutput(stored.promise);
    await tasks.start(CONTAINER, '', ctx);
    record.reason = 'Error';
    exit.resolve({ exitCode: 7, finishedAtNs: '5000' });
    let waited = false;
    const wait = tasks.wait(CONTAINER, '', new AbortController().signal).then((e) => {
      waited = true;
      return e;
    });
    await new Promise((r) => setTimeout(r, 20));
    expect([waited, topics.includes('/tasks/exit')]).toEqual([false, false]);
    stored.resolve();
    expect((await wait).status).toBe(7);
    expect(topics).toContain('/tasks/exit');
    tasks.close();
  });

  it('an ordinary exit writes no oom file', async () => {
    const { tasks, topics, record, exit } = await podWithContainer();
    await tasks.start(CONTAINER, '', ctx);
    record.reason = 'Error';
    exit.resolve({ exitCode: 5, finishedAtNs: '5000' });
    expect((await tasks.wait(CONTAINER, '', new AbortController().signal)).status).toBe(5);
    expect(existsSync(path.join(containerBundle, CRIO_OOM_FILE))).toBe(false);
    expect(topics).not.toContain('/tasks/oom');
    tasks.close();
  });
});
