import { mkdir, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Writable } from 'node:stream';
import { alreadyExists, errnoCode, invalid, notFound, precondition } from '../../../src/common/errors.js';
import { cgroupDir, diskUsage, ensureParentCgroups, readCgroupStats, readOomKills } from './cgroup.js';
import { ProcessOutput } from './output.js';
import { type Reaped, reap, type WaitStatus } from './reaper.js';
import { RuntimeArgv, type RuntimeOptions, runRuntime } from './runtime.js';
import type {
  ContainerBackendCore,
  ContainerState,
  ContainerStats,
  CreateRequest,
  ExecRequest,
  ExitStatus,
  OciSpec,
  StdioOptions,
} from './types.js';

export interface ContainersOptions {
  runtime: RuntimeOptions;
  /** One bundle directory per container is made here (config.json, pid files, exec specs). */
  bundlesDir: string;
  /** Path of the kata-ts-reaper binary (native/reaper.c). */
  reaperPath: string;
  /** Where cgroup2 is mounted in the guest. */
  cgroupRoot: string;
  /** Unacknowledged output bytes kept per stream before the container is throttled. */
  outputCapacityBytes?: number;
  now?: () => number;
}

/** A running process's handles: output with offsets, stdin, terminal size, exit. */
export interface ProcessHandle {
  output: ProcessOutput;
  stdin: Writable | undefined;
  /** Sets the terminal size (tty only). */
  resize(rows: number, cols: number): void;
  exit: Promise<ExitStatus>;
  pid: number;
}

export interface ExecHandle extends ProcessHandle {
  /** True once the timeout passed and the process was killed. */
  readonly timedOut: boolean;
}

interface ContainerRecord {
  state: ContainerState;
  bundle: string;
  cgroup: string | undefined;
  writableLayerPath: string | undefined;
  handle: ProcessHandle;
  execs: Map<string, ExecHandle>;
}

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const DEFAULT_OUTPUT_CAPACITY_BYTES = 1 << 20;
const SIGKILL = 9;

/**
 * The guest agent's container backend: runs containers with crun, one kata-ts-reaper each, and
 * keeps their state, output and exit in memory (the agent lives as long as the VM).
 */
export class Containers implements ContainerBackendCore {
  private readonly records = new Map<string, ContainerRecord>();
  private readonly argv: RuntimeArgv;
  private readonly now: () => number;

  constructor(private readonly options: ContainersOptions) {
    this.argv = new RuntimeArgv(options.runtime);
    this.now = options.now ?? Date.now;
  }

  /** Writes the bundle and runs `crun create`; the init then waits for start() with its stdio wired. */
  async create(request: CreateRequest): Promise<ContainerState> {
    const { id } = request;
    if (!ID.test(id)) throw invalid('CONTAINER_ID_INVALID', 'The container id is not a valid runtime id.', { details: { id } });
    if (this.records.has(id)) throw alreadyExists('CONTAINER_EXISTS', 'A container with this id exists in the guest.', { details: { id } });
    const bundle = path.join(this.options.bundlesDir, id);
    const spec = bundleSpec(request.spec, request.rootfsPath, request.stdio);
    const cgroupsPath = spec.linux?.cgroupsPath;
    const cgroup =
      this.options.runtime.cgroupManager === 'cgroupfs' && cgroupsPath !== undefined
        ? cgroupDir(this.options.cgroupRoot, cgroupsPath)
        : undefined;
    await rm(bundle, { recursive: true, force: true });
    await mkdir(bundle, { recursive: true, mode: 0o700 });
    try {
      if (cgroup && cgroupsPath) await ensureParentCgroups(this.options.cgroupRoot, cgroupsPath);
      await writeFile(path.join(bundle, 'config.json'), JSON.stringify(spec));
      const pidFile = path.join(bundle, 'init.pid');
      const logFile = path.join(bundle, 'runtime.log');
      const consoleSocket = request.stdio.tty ? path.join(bundle, 'console.sock') : undefined;
      const reaped = reap({
        reaperPath: this.options.reaperPath,
        runtimeArgv: this.argv.create(id, bundle, pidFile, logFile, consoleSocket),
        pidFile,
        logFile,
        consoleSocket,
        stdin: request.stdio.stdin,
      });
      const handle = await this.handle(reaped, async () => (cgroup ? (await readOomKills(cgroup)) > 0n : false));
      const state: ContainerState = { id, status: 'created', pid: handle.pid, createdAtMs: this.now() };
      const record: ContainerRecord = { state, bundle, cgroup, writableLayerPath: request.writableLayerPath, handle, execs: new Map() };
      this.records.set(id, record);
      void handle.exit.then((exit) => {
        record.state = { ...record.state, status: 'stopped', exit };
      });
      return { ...state };
    } catch (err) {
      await rm(bundle, { recursive: true, force: true });
      throw err;
    }
  }

  async start(id: string): Promise<ContainerState> {
    const record = this.get(id);
    if (record.state.status !== 'created')
      throw precondition('CONTAINER_NOT_CREATED', 'Only a created container can be started.', { details: { id } });
    await runRuntime(this.argv.start(id), `start ${id}`);
    if (record.state.status === 'created') record.state = { ...record.state, status: 'running', startedAtMs: this.now() };
    return { ...record.state };
  }

  /** Sends `signal` to the init (or every process with `all`); a stopped container ignores it. */
  async signal(id: string, signal: number, all: boolean): Promise<void> {
    const record = this.get(id);
    if (record.state.status === 'stopped') return;
    try {
      await runRuntime(this.argv.kill(id, signal, all), `signal ${id}`);
    } catch (err) {
      // The process may have exited between the check and the kill.
      if (this.records.get(id)?.state.status !== 'stopped') throw err;
    }
  }

  wait(id: string): Promise<ExitStatus> {
    return this.get(id).handle.exit;
  }

  /** Kills what still runs, removes the runtime's state, the bundle and the record. Idempotent. */
  async delete(id: string): Promise<void> {
    const record = this.records.get(id);
    if (!record) return;
    for (const exec of record.execs.values()) killPid(exec.pid);
    await runRuntime(this.argv.delete(id), `delete ${id}`).catch((err: unknown) => {
      if (!(err instanceof Error && 'kind' in err && err.kind === 'not_found')) throw err;
    });
    // `delete --force` killed the init; its reaper reports shortly after.
    await record.handle.exit;
    await rm(record.bundle, { recursive: true, force: true });
    this.records.delete(id);
  }

  state(id: string): ContainerState {
    return { ...this.get(id).state };
  }

  list(): ContainerState[] {
    return [...this.records.values()].map((r) => ({ ...r.state }));
  }

  /** The container's init process handles (output, stdin, resize). */
  process(id: string): ProcessHandle {
    return this.get(id).handle;
  }

  async stats(id: string): Promise<ContainerStats> {
    const record = this.get(id);
    if (!record.cgroup) throw precondition('CONTAINER_NO_CGROUP', 'The container has no cgroup the agent manages.', { details: { id } });
    const stats = await readCgroupStats(record.cgroup, this.now());
    if (record.writableLayerPath) {
      const usage = await diskUsage(record.writableLayerPath);
      stats.writableLayerBytes = usage.bytes;
      stats.writableLayerInodes = usage.inodes;
    }
    return stats;
  }

  /**
   * Runs a process in a running container with `crun exec --detach` under a reaper of its own,
   * so its exit status is exact and a timeout kills the process itself (not only crun): the
   * reaper has not reaped it, so its pid cannot have been reused when the kill is sent.
   */
  async exec(request: ExecRequest): Promise<ExecHandle> {
    const record = this.get(request.containerId);
    if (record.state.status !== 'running')
      throw precondition('CONTAINER_NOT_RUNNING', 'Exec needs a running container.', { details: { id: request.containerId } });
    if (!ID.test(request.execId) || record.execs.has(request.execId))
      throw invalid('EXEC_ID_INVALID', 'The exec id is invalid or in use.', { details: { execId: request.execId } });
    const base = path.join(record.bundle, `exec-${request.execId}`);
    const processFile = `${base}.json`;
    await writeFile(processFile, JSON.stringify({ ...request.process, terminal: request.stdio.tty }));
    const consoleSocket = request.stdio.tty ? `${base}.sock` : undefined;
    const reaped = reap({
      reaperPath: this.options.reaperPath,
      runtimeArgv: this.argv.exec(request.containerId, processFile, `${base}.pid`, `${base}.log`, consoleSocket),
      pidFile: `${base}.pid`,
      logFile: `${base}.log`,
      consoleSocket,
      stdin: request.stdio.stdin,
    });
    let timedOut = false;
    const cleanup = () => Promise.all([processFile, `${base}.pid`, `${base}.log`].map((f) => rm(f, { force: true })));
    let handle: ProcessHandle;
    try {
      handle = await this.handle(reaped, async () => false);
    } catch (err) {
      await cleanup();
      throw err;
    }
    const timer =
      request.timeoutMs && request.timeoutMs > 0
        ? setTimeout(() => {
            timedOut = true;
            killPid(handle.pid);
          }, request.timeoutMs)
        : undefined;
    const exec: ExecHandle = {
      ...handle,
      get timedOut() {
        return timedOut;
      },
    };
    record.execs.set(request.execId, exec);
    void handle.exit.then(async () => {
      clearTimeout(timer);
      record.execs.delete(request.execId);
      await cleanup();
    });
    return exec;
  }

  private async handle(reaped: Reaped, oomKilled: () => Promise<boolean>): Promise<ProcessHandle> {
    const output = new ProcessOutput(
      { stdout: reaped.stdout, stderr: reaped.stderr },
      this.options.outputCapacityBytes ?? DEFAULT_OUTPUT_CAPACITY_BYTES,
    );
    const pid = await reaped.pid;
    const exit = reaped.exited.then(async (status) => toExitStatus(status, await oomKilled().catch(() => false), this.now()));
    return {
      output,
      stdin: reaped.stdin,
      resize: (rows, cols) => reaped.resize?.write(`${rows} ${cols}\n`),
      exit,
      pid,
    };
  }

  private get(id: string): ContainerRecord {
    const record = this.records.get(id);
    if (!record) throw notFound('CONTAINER_NOT_FOUND', 'No such container in the guest.', { details: { id } });
    return record;
  }
}

/** config.json as written to the bundle: the rootfs mounted in the guest, the terminal as asked. */
export function bundleSpec(spec: OciSpec, rootfsPath: string, stdio: StdioOptions): OciSpec {
  if (!spec.process) throw invalid('SPEC_PROCESS_MISSING', 'The container spec has no process.');
  return {
    ...spec,
    root: { ...spec.root, path: rootfsPath },
    process: { ...spec.process, terminal: stdio.tty },
  };
}

/** 128 + signal for a killed process, as shells and the CRI report it. */
export function toExitStatus(status: WaitStatus, oomKilled: boolean, finishedAtMs: number): ExitStatus {
  if (status.kind === 'signal') return { exitCode: 128 + status.signal, signal: status.signal, oomKilled, finishedAtMs };
  return { exitCode: status.code, oomKilled, finishedAtMs };
}

function killPid(pid: number): void {
  try {
    process.kill(pid, SIGKILL);
  } catch (err) {
    if (errnoCode(err) !== 'ESRCH') throw err;
  }
}
