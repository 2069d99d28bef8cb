import { PassThrough } from 'node:stream';
import type { BackendEvent, ContainerBackend, ProcessStdio } from '../../../guest/agent/backend.js';
import { alreadyExists, notFound } from '../../../src/common/errors.js';
import type { CreateContainerRequest, ExitStatus } from '../../../src/generated/agent/agent.js';

interface FakeProcess {
  stdio: { stdin: PassThrough; stdout: PassThrough; stderr: PassThrough };
  exit: Promise<ExitStatus>;
  finish: (exit: ExitStatus) => void;
}

function fakeProcess(): FakeProcess {
  let finish!: (exit: ExitStatus) => void;
  const exit = new Promise<ExitStatus>((resolve) => {
    finish = resolve;
  });
  return { stdio: { stdin: new PassThrough(), stdout: new PassThrough(), stderr: new PassThrough() }, exit, finish };
}

/**
 * A fake ContainerBackend for unit tests of the RPC plumbing: containers are PassThrough pipes
 * the test writes to and ends; exec'd processes echo stdin to stdout. Nothing runs.
 */
export class FakeContainerBackend implements ContainerBackend {
  readonly containers = new Map<string, FakeProcess & { status: 'CONTAINER_STATUS_CREATED' | 'CONTAINER_STATUS_RUNNING' }>();
  readonly execs = new Map<string, FakeProcess>();
  /** Every CreateContainer request as the agent decoded it, in arrival order. */
  readonly createRequests: CreateContainerRequest[] = [];
  private readonly listeners = new Set<(e: BackendEvent) => void>();

  container(id: string) {
    const c = this.containers.get(id);
    if (c === undefined) throw notFound('CONTAINER_NOT_FOUND', `no container ${id}.`);
    return c;
  }

  /** End the container's output and let its waiters see `exitCode`. */
  exitContainer(id: string, exitCode: number): void {
    const c = this.container(id);
    c.stdio.stdout.end();
    c.stdio.stderr.end();
    const exit = { exitCode, signal: 0, oomKilled: false, finishedAt: { seconds: 1, nanos: 2 } };
    c.finish(exit);
    this.emit({ kind: 'container-exited', containerId: id, exit });
  }

  emit(e: BackendEvent): void {
    for (const l of this.listeners) l(e);
  }

  guestFacts = async () => ({
    kernelRelease: 'fake',
    onlineVcpus: 2,
    memoryKib: 1000,
    onlineMemoryKib: 1024,
    cgroupVersion: 2,
    cgroupControllers: ['cpu', 'memory'],
    uptimeSeconds: 1.5,
    runtimeVersion: 'fake',
  });
  createContainer = async (req: CreateContainerRequest) => {
    this.createRequests.push(req);
    if (this.containers.has(req.containerId)) throw alreadyExists('CONTAINER_EXISTS', 'exists.');
    const p = fakeProcess();
    this.containers.set(req.containerId, { ...p, status: 'CONTAINER_STATUS_CREATED' });
    return { pid: 100 + this.containers.size, stdio: p.stdio as ProcessStdio };
  };
  startContainer = async (id: string) => {
    this.container(id).status = 'CONTAINER_STATUS_RUNNING';
    return { startedAt: { seconds: 5, nanos: 6 } };
  };
  signalContainer = async (id: string, signal: number) => {
    if (signal === 9) this.exitContainer(id, 137);
  };
  /** The resources each update asked for, by container. */
  readonly updates: Array<{ id: string; resources: unknown }> = [];
  updateContainer = async (id: string, ociResourcesJson: string) => {
    this.container(id);
    this.updates.push({ id, resources: JSON.parse(ociResourcesJson) });
  };
  freezeContainer = async (id: string, _frozen: boolean) => {
    this.container(id);
  };
  waitContainer = (id: string) => this.container(id).exit;
  deleteContainer = async (id: string) => {
    this.container(id);
    this.containers.delete(id);
  };
  listContainers = async (ids: string[]) =>
    [...this.containers.entries()]
      .filter(([id]) => ids.length === 0 || ids.includes(id))
      .map(([containerId, c]) => ({ containerId, status: c.status, pid: 1, createdAt: null, startedAt: null, exit: null }));
  containerStats = async () => [];
  guestStats = async () => ({ takenAt: null, cpu: { usageNs: 7, userNs: 3, systemNs: 4 }, memory: null, pids: 3 });
  execProcess = async (req: { containerId: string; execId: string }) => {
    this.container(req.containerId);
    const p = fakeProcess();
    p.stdio.stdin.pipe(p.stdio.stdout);
    p.stdio.stdin.on('end', () => {
      p.stdio.stderr.end('bye\n');
      p.finish({ exitCode: 3, signal: 0, oomKilled: false, finishedAt: null });
    });
    this.execs.set(`${req.containerId}/${req.execId}`, p);
    return { pid: 4242, stdio: p.stdio as ProcessStdio };
  };
  signalProcess = async () => {};
  resizeTty = async () => {};
  waitProcess = (cid: string, eid: string) => {
    const p = this.execs.get(`${cid}/${eid}`);
    if (p === undefined) return Promise.reject(notFound('EXEC_NOT_FOUND', 'no exec.'));
    return p.exit;
  };
  deleteProcess = async (cid: string, eid: string) => {
    this.execs.delete(`${cid}/${eid}`);
  };
  onEvent = (listener: (e: BackendEvent) => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };
}
