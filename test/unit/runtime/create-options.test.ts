/**
 * What a second face passes to ContainerManager.create (ContainerCreateOptions) and what it asks
 * of a container after (kill, waitExit, the guest pid, OOM), driven through the manager with the
 * sandbox, the record store and the agent faked: the caller's id (checked, unique), a root
 * filesystem the caller owns (no image, no copy, and never removed: a tripwire directory whose
 * files must all survive create, a failed create, remove, and a restart that drops the container),
 * FIFO stdio (checked, recorded), and the CRI face's path left as it was.
 */
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { ExitStatus } from '../../../src/generated/agent/agent.js';
import type { ContainerConfig__Output } from '../../../src/generated/runtime/v1/ContainerConfig.js';
import { MAX_TERMINAL_CONTAINER_ID_LENGTH } from '../../../src/runtime/container/create.js';
import type { ContainerOomEvent } from '../../../src/runtime/container/events.js';
import { ContainerManager } from '../../../src/runtime/container/manager.js';
import { CONTAINER_RECORD_KIND, type ContainerRecord } from '../../../src/runtime/container/record.js';
import type { ContainerCreateOptions, ImageLookup } from '../../../src/runtime/container/types.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { migrateSandboxRecord, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { LiveSandbox, SandboxAccess, SandboxHandle } from '../../../src/runtime/sandbox/types.js';
import { type ContainerSpec, decodeContainerSpec } from '../../../src/runtime/spec/container.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { rejection } from '../../helpers/kata-error.js';

const SANDBOX_ID = 'a1'.repeat(32);
const IS_ROOT = process.getuid?.() === 0;

function spec(name: string, extra: Record<string, unknown> = {}): ContainerSpec {
  return decodeContainerSpec(
    decodeProtoJson<ContainerConfig__Output>('runtime.v1.ContainerConfig', {
      metadata: { name },
      image: { image: 'docker.io/library/busybox:latest' },
      log_path: `${name}.log`,
      // No image config with a caller's rootfs: the command is the spec's own (as containerd's process.args).
      command: ['/bin/sh'],
      ...extra,
    }),
  );
}

const ctx: RequestContext = {
  method: 'test',
  logger: silentLogger(),
  signal: new AbortController().signal,
  deadlineMs: undefined,
  annotate: () => {},
};

/** A guest agent that runs nothing: records calls; a container exits when the test says so. */
class FakeAgent {
  readonly calls: string[] = [];
  private readonly exits = new Map<string, (e: ExitStatus) => void>();
  readonly connection = { ready: async () => {} };

  async createContainer(req: { containerId: string; stdin: boolean; stdinOnce: boolean }) {
    this.calls.push(`create ${req.containerId} stdin=${req.stdin} once=${req.stdinOnce}`);
    return { pid: 4242 };
  }
  async startContainer(id: string) {
    this.calls.push(`start ${id}`);
    return { startedAt: { seconds: 1, nanos: 0 } };
  }
  waitContainer(id: string): Promise<ExitStatus> {
    return new Promise((resolve) => this.exits.set(id, resolve));
  }
  exit(id: string, exit: Partial<ExitStatus>): void {
    this.exits.get(id)?.({ exitCode: 0, signal: 0, oomKilled: false, finishedAt: { seconds: 2, nanos: 5 }, ...exit });
  }
  async signalContainer(id: string, signal: number, all: boolean) {
    this.calls.push(`signal ${id} ${signal} all=${all}`);
  }
  async listContainers() {
    return [];
  }
  async ackOutput() {}
  async *streamOutput(_id: string, from: number) {
    yield { stream: 'OUTPUT_STREAM_STDOUT' as const, offset: from, data: new Uint8Array(0), eof: true };
  }
  async deleteContainer(id: string) {
    this.calls.push(`delete ${id}`);
  }
}

interface World {
  manager: ContainerManager;
  store: RecordStore<ContainerRecord>;
  agent: FakeAgent;
  /** Image lookups made (a caller's rootfs makes none). */
  imageLookups: string[];
  /** The sandbox exists for the manager (false: as after RemovePodSandbox, for a restart). */
  sandboxPresent: boolean;
}

async function world(stateDir: string, opts: { guestPod: boolean; failPut?: boolean }): Promise<World> {
  const file = path.join(packageRoot(), 'fixtures', 'records', 'v1', 'sandboxes', `${SANDBOX_ID}.json`);
  const record = migrateSandboxRecord(1, JSON.parse(await readFile(file, 'utf8')).record) as SandboxRecord;
  record.spec = { ...record.spec, pod_resources: null };
  const agent = new FakeAgent();
  const handle: SandboxHandle = {
    get record() {
      return record;
    },
    vm: {} as SandboxHandle['vm'],
    agent: undefined,
    persist: async () => {},
    cgroupsFor: () => ({}) as ReturnType<SandboxHandle['cgroupsFor']>,
  };
  const live: LiveSandbox = { record, vm: {} as LiveSandbox['vm'], agent: undefined, stopping: false };
  const w = { agent, imageLookups: [], sandboxPresent: true } as unknown as World;
  const sandboxes = {
    find: () => (w.sandboxPresent ? live : undefined),
    withSandbox: (_id: string, fn: (h: SandboxHandle) => unknown) => fn(handle),
    withSandboxIfPresent: (_id: string, fn: (h: SandboxHandle | undefined) => unknown) => fn(w.sandboxPresent ? handle : undefined),
  } as unknown as SandboxAccess;
  const store = new RecordStore<ContainerRecord>(stateDir, CONTAINER_RECORD_KIND, silentLogger());
  await store.load();
  if (opts.failPut === true) store.put = async () => Promise.reject(new Error('disk full'));
  const imageRoot = path.join(stateDir, 'image-rootfs');
  await mkdir(path.join(imageRoot, 'etc'), { recursive: true });
  const images: ImageLookup = {
    resolveImage: (ref) => {
      w.imageLookups.push(ref);
      return { id: `sha256:${'e'.repeat(64)}`, repoDigests: [] };
    },
    rootfsSourceFor: () => ({ kind: 'flat', dir: imageRoot }),
    imageConfig: async () => ({ Cmd: ['sh'] }),
  };
  w.store = store;
  w.manager = new ContainerManager({
    config: { ...defaultConfig(), stateDir },
    logger: silentLogger(),
    store,
    sandboxes,
    images,
    host: { cpus: 16, memoryMiB: 65536 },
    readPcieFacts: () => Promise.reject(new Error('no devices asked for')),
    guests: {
      agentOf: () => agent as unknown as AgentClient,
      sharedDirOf: () => path.join(stateDir, 'shared'),
      sharedDirsRoot: stateDir,
      guestSharedDir: '/run/kata-ts/shared',
      guestPodOf: () => (opts.guestPod ? { pausePid: 7, shmPath: '/dev/shm' } : null),
    },
  });
  return w;
}

/** A root filesystem the caller owns, with files whose loss would show. */
async function tripwireRootfs(dir: string): Promise<string> {
  const rootfs = path.join(dir, 'bundle', 'rootfs');
  await mkdir(path.join(rootfs, 'etc'), { recursive: true });
  await mkdir(path.join(rootfs, 'data', 'deep'), { recursive: true });
  await writeFile(path.join(rootfs, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
  await writeFile(path.join(rootfs, 'data', 'deep', 'tripwire'), 'must survive');
  return rootfs;
}

async function expectIntact(rootfs: string): Promise<void> {
  expect(await readFile(path.join(rootfs, 'data', 'deep', 'tripwire'), 'utf8')).toBe('must survive');
  expect((await readdir(rootfs)).sort()).toEqual(['data', 'etc']);
}

function mountsUnder(dir: string): string[] {
  return execFileSync('cat', ['/proc/self/mountinfo'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((p) => p.startsWith(dir));
}

describe('ContainerManager.create with a caller id, rootfs and stdio', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-opts-'));
  });
  afterEach(async () => {
    for (const m of mountsUnder(dir).reverse()) execFileSync('umount', ['--lazy', m]);
    await rm(dir, { recursive: true, force: true });
  });

  it('takes the caller id when it is a containerd identifier; anything else is INVALID_ARGUMENT naming the id', async () => {
    const w = await world(dir, { guestPod: false });
    const rootfs = await tripwireRootfs(dir);
    for (const bad of ['', '-a', 'a-', 'a..b', 'a/b', '..', 'a b', 'ä', 'x'.repeat(77)]) {
      const err = await rejection(w.manager.create(SANDBOX_ID, spec('c'), ctx, { id: bad, rootfs }));
      expect([err.kind, err.reason]).toEqual(['invalid', 'CONTAINER_ID_INVALID']);
      expect(err.message).toContain('id');
    }
    // With a terminal the guest's console socket path leaves fewer characters.
    const long = 't'.repeat(MAX_TERMINAL_CONTAINER_ID_LENGTH + 1);
    expect((await rejection(w.manager.create(SANDBOX_ID, spec('t', { tty: true }), ctx, { id: long, rootfs }))).reason).toBe(
      'CONTAINER_ID_INVALID',
    );
    expect(w.manager.list(null)).toEqual([]);
    for (const good of ['web', 'a.b_c-d', 'X'.repeat(76), '0'.repeat(64)]) {
      expect(await w.manager.create(SANDBOX_ID, spec(`c${w.manager.list(null).length}`), ctx, { id: good, rootfs })).toBe(good);
    }
    expect(w.manager.resolve('web').id).toBe('web');
  });

  it('an id a container has (or a create in progress holds) is ALREADY_EXISTS', async () => {
    const w = await world(dir, { guestPod: false });
    const rootfs = await tripwireRootfs(dir);
    await w.manager.create(SANDBOX_ID, spec('one'), ctx, { id: 'web', rootfs });
    const again = await rejection(w.manager.create(SANDBOX_ID, spec('two'), ctx, { id: 'web', rootfs }));
    expect([again.kind, again.reason]).toEqual(['exists', 'CONTAINER_EXISTS']);
    const both = await Promise.allSettled([
      w.manager.create(SANDBOX_ID, spec('three'), ctx, { id: 'twin', rootfs }),
      w.manager.create(SANDBOX_ID, spec('four'), ctx, { id: 'twin', rootfs }),
    ]);
    expect(both.map((r) => r.status).sort()).toEqual(['fulfilled', 'rejected']);
    expect(w.manager.list(null).map((c) => c.id)).toEqual(['web', 'twin']);
  });

  it('a caller rootfs: no image looked up or copied, recorded as the caller’s, a missing one refused', async () => {
    const w = await world(dir, { guestPod: false });
    const rootfs = await tripwireRootfs(dir);
    const id = await w.manager.create(SANDBOX_ID, spec('web'), ctx, { id: 'web', rootfs });
    const r = w.manager.resolve(id);
    expect([r.rootfs, r.rootfsOwner, r.image.id, r.image.requested]).toEqual([
      rootfs,
      'caller',
      'docker.io/library/busybox:latest',
      'docker.io/library/busybox:latest',
    ]);
    expect(w.imageLookups).toEqual([]);
    expect(await readdir(path.join(dir, 'rootfs')).catch(() => [])).toEqual([]);
    for (const bad of [path.join(dir, 'missing'), 'relative/rootfs', path.join(rootfs, 'etc', 'passwd')]) {
      const err = await rejection(w.manager.create(SANDBOX_ID, spec('x'), ctx, { rootfs: bad }));
      expect([err.kind, err.reason]).toEqual(['invalid', 'CONTAINER_ROOTFS_INVALID']);
    }
    await expectIntact(rootfs);
  });

  it('without options (the CRI face) nothing changes: a new id, the image looked up and copied, the CRI log', async () => {
    const w = await world(dir, { guestPod: false });
    const id = await w.manager.create(SANDBOX_ID, spec('web'), ctx);
    const r = w.manager.resolve(id);
    expect(id).toMatch(/^[0-9a-f]{64}$/);
    expect([r.rootfsOwner, r.rootfs, r.stdio, r.pid]).toEqual(['runtime', path.join(dir, 'rootfs', id), { kind: 'cri-log' }, 0]);
    expect(r.logPath).toMatch(/web\.log$/);
    expect(w.imageLookups).toEqual(['docker.io/library/busybox:latest']);
    await w.manager.remove(id, ctx);
    expect(await readdir(path.join(dir, 'rootfs'))).toEqual([]);
  });

  it('FIFO stdio is recorded (no CRI log); a path that is not a FIFO, or a terminal the spec does not have, is INVALID_ARGUMENT', async () => {
    const w = await world(dir, { guestPod: false });
    const rootfs = await tripwireRootfs(dir);
    const fifos = Object.fromEntries(
      ['in', 'out', 'err'].map((n) => {
        const p = path.join(dir, n);
        execFileSync('mkfifo', [p]);
        return [n, p];
      }),
    );
    const stdio = { kind: 'fifo' as const, stdin: fifos.in!, stdout: fifos.out!, stderr: fifos.err!, terminal: false };
    const id = await w.manager.create(SANDBOX_ID, spec('web'), ctx, { id: 'web', rootfs, stdio });
    expect([w.manager.resolve(id).stdio, w.manager.resolve(id).logPath]).toEqual([stdio, '']);
    const refusals: Array<[ContainerCreateOptions['stdio'], string]> = [
      [{ ...stdio, stdout: path.join(rootfs, 'etc', 'passwd') }, 'stdio.stdout'],
      [{ ...stdio, stdin: path.join(dir, 'nope') }, 'stdio.stdin'],
      [{ ...stdio, stderr: 'relative' }, 'stdio.stderr'],
      [{ ...stdio, terminal: true }, 'stdio.terminal'],
    ];
    for (const [bad, field] of refusals) {
      const err = await rejection(w.manager.create(SANDBOX_ID, spec('x'), ctx, { rootfs, stdio: bad }));
      expect([err.kind, err.reason]).toEqual(['invalid', 'CONTAINER_STDIO_INVALID']);
      expect(err.message).toContain(field);
    }
    // With a terminal stderr is not used: whatever it names is not checked.
    const tty = { ...stdio, terminal: true, stderr: 'unused' };
    expect(await w.manager.create(SANDBOX_ID, spec('tty', { tty: true }), ctx, { id: 'tty', rootfs, stdio: tty })).toBe('tty');
  });

  describe.skipIf(!IS_ROOT)('the caller rootfs, bind-mounted into the shared directory for real (root)', () => {
    it('survives remove: unbound, never deleted, and the shared directory goes', async () => {
      const w = await world(dir, { guestPod: true });
      const rootfs = await tripwireRootfs(dir);
      const id = await w.manager.create(SANDBOX_ID, spec('web'), ctx, { id: 'web', rootfs });
      const { guest } = w.manager.resolve(id);
      expect(guest?.bindMounts).toEqual([path.join(dir, 'shared', 'containers', 'web', 'rootfs')]);
      expect(await readFile(path.join(guest!.bindMounts[0]!, 'data', 'deep', 'tripwire'), 'utf8')).toBe('must survive');
      await w.manager.remove(id, ctx);
      expect(mountsUnder(dir)).toEqual([]);
      await expect(readdir(path.join(dir, 'shared', 'containers'))).resolves.toEqual([]);
      await expectIntact(rootfs);
    });

    it('survives a failed create (the rollback) and a restart that finds the sandbox gone', async () => {
      const failing = await world(dir, { guestPod: true, failPut: true });
      const rootfs = await tripwireRootfs(dir);
      await expect(failing.manager.create(SANDBOX_ID, spec('web'), ctx, { id: 'web', rootfs })).rejects.toThrow('disk full');
      expect(mountsUnder(dir)).toEqual([]);
      await expectIntact(rootfs);

      const w = await world(dir, { guestPod: true });
      await w.manager.create(SANDBOX_ID, spec('web'), ctx, { id: 'web', rootfs });
      // The next daemon: the record says whose rootfs it is; the sandbox is gone, so is the container.
      const next = await world(dir, { guestPod: true });
      next.sandboxPresent = false;
      for (const m of mountsUnder(dir).reverse()) execFileSync('umount', [m]);
      await next.manager.recover();
      expect(next.manager.list(null)).toEqual([]);
      expect((await next.store.load()).records).toEqual([]);
      await expectIntact(rootfs);
    });
  });
});

describe('kill, waitExit, the guest pid and OOM, for a second face', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-kill-'));
  });
  afterEach(async () => {
    for (const m of mountsUnder(dir).reverse()) execFileSync('umount', ['--lazy', m]);
    await rm(dir, { recursive: true, force: true });
  });

  it.skipIf(!IS_ROOT)(
    'a started container: its guest pid recorded, signalled as asked; OOM then stop; after the exit NOT_FOUND',
    async () => {
      const w = await world(dir, { guestPod: true });
      const rootfs = await tripwireRootfs(dir);
      const id = await w.manager.create(SANDBOX_ID, spec('web'), ctx, { id: 'web', rootfs });
      const created = await rejection(w.manager.kill(id, 15, false, ctx));
      expect([created.kind, created.reason]).toEqual(['precondition', 'CONTAINER_NOT_RUNNING']);
      await w.manager.start(id, ctx);
      expect(w.manager.resolve(id).pid).toBe(4242);
      // A CRI-log container's stdin as its spec says; a FIFO container's stdin is closed by the agent at end of stream.
      expect(w.agent.calls[0]).toBe('create web stdin=false once=false');
      await w.manager.kill(id, 15, false, ctx);
      await w.manager.kill('we', 9, true, ctx);
      expect(w.agent.calls.filter((c) => c.startsWith('signal'))).toEqual(['signal web 15 all=false', 'signal web 9 all=true']);
      expect((await rejection(w.manager.kill(id, 65, false, ctx))).reason).toBe('CONTAINER_SIGNAL_INVALID');

      const order: string[] = [];
      const ooms: ContainerOomEvent[] = [];
      w.manager.events.subscribeOom((e) => {
        ooms.push(e);
        order.push('oom');
      });
      w.manager.events.subscribe((e) => order.push(e.type));
      const waited = w.manager.waitExit(id, new AbortController().signal);
      w.agent.exit(id, { exitCode: 137, signal: 9, oomKilled: true });
      expect(await waited).toEqual({ exitCode: 137, finishedAtNs: '2000000005' });
      expect(order).toEqual(['oom', 'CONTAINER_STOPPED_EVENT']);
      expect(ooms.map((e) => [e.record.id, e.atNs])).toEqual([['web', '2000000005']]);
      // Exited: Wait answers at once, Kill says the process finished (containerd's NOT_FOUND).
      expect(await w.manager.waitExit(id, new AbortController().signal)).toEqual({ exitCode: 137, finishedAtNs: '2000000005' });
      const finished = await rejection(w.manager.kill(id, 9, false, ctx));
      expect([finished.kind, finished.reason]).toEqual(['not_found', 'CONTAINER_PROCESS_FINISHED']);
      await w.manager.remove(id, ctx);
      await expectIntact(rootfs);
    },
  );

  it('waitExit: a created container stopped; a removed one NOT_FOUND; an aborted wait CANCELLED', async () => {
    const w = await world(dir, { guestPod: false });
    const a = await w.manager.create(SANDBOX_ID, spec('a'), ctx);
    const b = await w.manager.create(SANDBOX_ID, spec('b'), ctx);
    const c = await w.manager.create(SANDBOX_ID, spec('c'), ctx);
    const abort = new AbortController();
    const waitC = w.manager.waitExit(c, abort.signal);
    abort.abort();
    expect((await rejection(waitC)).kind).toBe('cancelled');
    const waitA = w.manager.waitExit(a, new AbortController().signal);
    await w.manager.stop(a, 0, ctx);
    expect(await waitA).toMatchObject({ exitCode: 0 });
    const waitB = rejection(w.manager.waitExit(b, new AbortController().signal));
    await w.manager.sandboxRemoving(SANDBOX_ID);
    expect((await waitB).reason).toBe('CONTAINER_NOT_FOUND');
  });

  it('a VM that went away: the running container exits with 255 and its waiters hear it', async () => {
    const w = await world(dir, { guestPod: false });
    const id = await w.manager.create(SANDBOX_ID, spec('a'), ctx);
    // As if it had started: the guest plan is what a started container needs, not this test.
    const r = w.manager.resolve(id);
    r.state = 'CONTAINER_RUNNING';
    const waited = w.manager.waitExit(id, new AbortController().signal);
    await w.manager.sandboxStopped(SANDBOX_ID);
    expect((await waited).exitCode).toBe(255);
  });
});
