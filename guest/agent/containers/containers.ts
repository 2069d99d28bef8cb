import { mkdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { alreadyExists, errnoCode, invalid, notFound, precondition } from '../../../src/common/errors.js';
import { cgroupDir, diskUsage, ensureParentCgroups, killCgroup, readCgroupStats, readOomKills } from './cgroup.js';
import { GUEST_ROOTS, type GuestRoots, resolveGuestDevices, withGuestDevices } from './devices.js';
import { type OomWatch, watchOomKills } from './oom-watch.js';
import { type Reaped, reap, type WaitStatus } from './reaper.js';
import { findBundles, INIT_PID_FILE, pollExitFile, runtimeStatus, writeBundleRecord } from './recover.js';
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
  /**
   * The init's output goes through the reaper's spool file (default true), so an agent restart
   * loses none of it; false: plain pipes to the agent (lost with the agent).
   */
  spoolOutput?: boolean;
  /** Where device nodes are looked up for the host's devices (default /sys and /dev). */
  deviceRoots?: GuestRoots;
  now?: () => number;
}

/** A process's stdio as node streams: with a terminal only stdout (the pty output) exists. */
export interface ProcessStdio {
  stdin?: Writable;
  stdout?: Readable;
  stderr?: Readable;
  /** The container's output as the reaper's spool file (instead of stdout/stderr): survives an agent restart. */
  spool?: string;
}

/**
 * A process the core started (container init or exec). Its stdout/stderr are handed over unread:
 * whoever consumes them reads only as fast as it can forward (ProcessOutput does this with a
 * bound), and an unread pipe blocks the process's writes, which is the throttling wanted.
 */
export interface ProcessHandle {
  pid: number;
  stdio: ProcessStdio;
  /** Sets the terminal size (tty only; a no-op otherwise). */
  resize(rows: number, cols: number): void;
  exit: Promise<ExitStatus>;
  /** Set once the process has exited. */
  readonly exited: ExitStatus | undefined;
}

export interface ExecHandle extends ProcessHandle {
  /** True once the timeout passed and the process was killed. */
  readonly timedOut: boolean;
}

/** What happened, for the agent's event stream. */
export type CoreEvent =
  | { kind: 'started'; id: string; atMs: number }
  | { kind: 'exited'; id: string; exit: ExitStatus }
  /** The OOM killer ended a process of the container (its init or any other), once per new count. */
  | { kind: 'oom'; id: string; atMs: number; count: bigint }
  | { kind: 'exec-exited'; id: string; execId: string; exit: ExitStatus };

interface ContainerRecord {
  state: ContainerState;
  bundle: string;
  cgroup: string | undefined;
  writableLayerPath: string | undefined;
  handle: ProcessHandle;
  execs: Map<string, ExecHandle>;
  /** The watch of its OOM kills (a container with a cgroup of its own), until it exits. */
  oom?: OomWatch;
  /** Paused (its cgroup frozen). */
  frozen?: boolean;
  /**
   * The init's exit once the record says `stopped` (`exited` has run): what WaitContainer answers,
   * so that a DeleteContainer sent right after it finds the container stopped.
   */
  stopped?: Promise<ExitStatus>;
}

/** The reaper's spool of the init's output, in the bundle. */
export const OUTPUT_SPOOL_FILE = 'output.spool';

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const SIGKILL = 9;

/**
 * The guest agent's container core: runs containers with crun, one kata-ts-reaper per process
 * (exact wait status), and keeps their state and exit in memory (the agent lives as long as the VM).
 */
export class Containers implements ContainerBackendCore {
  private readonly records = new Map<string, ContainerRecord>();
  private readonly listeners = new Set<(event: CoreEvent) => void>();
  private readonly argv: RuntimeArgv;
  private readonly now: () => number;

  constructor(private readonly options: ContainersOptions) {
    this.argv = new RuntimeArgv(options.runtime);
    this.now = options.now ?? Date.now;
  }

  onEvent(listener: (event: CoreEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Writes the bundle and runs `crun create`; the init then waits for start() with its stdio wired. */
  async create(request: CreateRequest): Promise<ContainerState> {
    const { id } = request;
    if (!ID.test(id)) throw invalid('CONTAINER_ID_INVALID', 'The container id is not a valid runtime id.', { details: { id } });
    if (this.records.has(id)) throw alreadyExists('CONTAINER_EXISTS', 'A container with this id exists in the guest.', { details: { id } });
    const bundle = path.join(this.options.bundlesDir, id);
    // Hot-plugged devices get their guest nodes now: the host could not know their numbers.
    const devices = await resolveGuestDevices(request.devices ?? [], this.options.deviceRoots ?? GUEST_ROOTS);
    const spec = withGuestDevices(bundleSpec(request.spec, request.rootfsPath, request.stdio), devices);
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
      const pidFile = path.join(bundle, INIT_PID_FILE);
      const logFile = path.join(bundle, 'runtime.log');
      const consoleSocket = request.stdio.tty ? path.join(bundle, 'console.sock') : undefined;
      const spool = this.options.spoolOutput === false ? undefined : path.join(bundle, OUTPUT_SPOOL_FILE);
      const reaped = reap({
        reaperPath: this.options.reaperPath,
        runtimeArgv: this.argv.create(id, bundle, pidFile, logFile, consoleSocket),
        pidFile,
        logFile,
        consoleSocket,
        stdin: request.stdio.stdin,
        ...(spool === undefined ? {} : { spool }),
      });
      const handle = await this.handle(reaped, async () => (cgroup ? (await readOomKills(cgroup)) > 0n : false));
      if (spool !== undefined) handle.stdio.spool = spool;
      const state: ContainerState = { id, status: 'created', pid: handle.pid, createdAtMs: this.now() };
      await writeBundleRecord(bundle, { createdAtMs: state.createdAtMs, cgroup, writableLayerPath: request.writableLayerPath });
      const record: ContainerRecord = { state, bundle, cgroup, writableLayerPath: request.writableLayerPath, handle, execs: new Map() };
      // The cgroup is new: every kill it counts is this container's.
      if (cgroup) record.oom = this.watchOom(id, cgroup, 0n);
      this.records.set(id, record);
      this.watchExit(record, handle.exit);
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
    const atMs = this.now();
    await writeBundleRecord(record.bundle, {
      createdAtMs: record.state.createdAtMs,
      startedAtMs: atMs,
      cgroup: record.cgroup,
      writableLayerPath: record.writableLayerPath,
    });
    if (record.state.status === 'created') record.state = { ...record.state, status: 'running', startedAtMs: atMs };
    else record.state = { ...record.state, startedAtMs: atMs };
    this.emit({ kind: 'started', id, atMs });
    return { ...record.state };
  }

  /**
   * Sends `signal` to the init, or with `all` to every process of the container (crun finds them in
   * the container's cgroup, so `all` needs the cgroupfs manager). A stopped container ignores it.
   */
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

  /**
   * New limits for a running container (in-place resize): the OCI runtime writes them to its
   * cgroup, as `runc update` does for runc's containers. Only a running container has a cgroup to
   * change.
   */
  async update(id: string, resources: Record<string, unknown>): Promise<void> {
    const record = this.get(id);
    if (record.state.status !== 'running')
      throw precondition('CONTAINER_NOT_RUNNING', 'Only a running container can be updated.', { details: { id } });
    const file = path.join(record.bundle, 'update-resources.json');
    await writeFile(file, JSON.stringify(resources), { mode: 0o600 });
    try {
      await runRuntime(this.argv.update(id, file), `update ${id}`);
    } finally {
      await rm(file, { force: true });
    }
  }

  /** Freeze or thaw a running container (crun pause/resume: its cgroup's freezer). Idempotent. */
  async freeze(id: string, frozen: boolean): Promise<void> {
    const record = this.get(id);
    if (record.state.status !== 'running')
      throw precondition('CONTAINER_NOT_RUNNING', `Only a running container can be ${frozen ? 'paused' : 'resumed'}.`, { details: { id } });
    if (record.frozen === frozen) return;
    await runRuntime(frozen ? this.argv.pause(id) : this.argv.resume(id), `${frozen ? 'pause' : 'resume'} ${id}`);
    record.frozen = frozen;
  }

  /** Resolves once the container has stopped: its record says so (a non-forced delete then passes). */
  wait(id: string): Promise<ExitStatus> {
    const record = this.get(id);
    return record.stopped ?? record.handle.exit;
  }

  /**
   * Removes the runtime's state, the bundle and the record; with `force` (the default) kills what
   * still runs first, without it refuses a container that has not stopped. An unknown id is a no-op.
   */
  async delete(id: string, force = true): Promise<void> {
    const record = this.records.get(id);
    if (!record) return;
    if (!force && record.state.status === 'running') {
      throw precondition('CONTAINER_RUNNING', 'The container still runs; stop it or delete with force.', { details: { id } });
    }
    for (const exec of record.execs.values()) if (!exec.exited) killPid(exec.pid, SIGKILL);
    await runRuntime(this.argv.delete(id), `delete ${id}`).catch((err: unknown) => {
      if (!(err instanceof Error && 'kind' in err && err.kind === 'not_found')) throw err;
    });
    // `delete --force` killed the init; its reaper reports shortly after.
    await record.handle.exit;
    await Promise.all([...record.execs.values()].map((e) => e.exit));
    await removeBundle(record.bundle);
    this.records.delete(id);
  }

  state(id: string): ContainerState {
    return { ...this.get(id).state };
  }

  list(): ContainerState[] {
    return [...this.records.values()].map((r) => ({ ...r.state }));
  }

  /** The container's init process (`execId` empty) or one of its exec'd processes. */
  process(id: string, execId = ''): ProcessHandle {
    const record = this.get(id);
    if (execId === '') return record.handle;
    const exec = record.execs.get(execId);
    if (!exec) throw notFound('EXEC_NOT_FOUND', 'No such exec in the container.', { details: { id, execId } });
    return exec;
  }

  /** Signals an exec'd process directly (its reaper has not reaped it: the pid is still its own). */
  signalExec(id: string, execId: string, signal: number): void {
    const exec = this.process(id, execId);
    if (!exec.exited) killPid(exec.pid, signal);
  }

  /** Forgets an exited exec; refuses one that still runs. */
  deleteExec(id: string, execId: string): void {
    const exec = this.process(id, execId);
    if (!exec.exited) throw precondition('EXEC_RUNNING', 'The exec still runs; signal it first.', { details: { id, execId } });
    this.get(id).execs.delete(execId);
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
    const { containerId: id, execId } = request;
    const record = this.get(id);
    if (record.state.status !== 'running')
      throw precondition('CONTAINER_NOT_RUNNING', 'Exec needs a running container.', { details: { id } });
    if (!ID.test(execId)) throw invalid('EXEC_ID_INVALID', 'The exec id is not a valid id.', { details: { execId } });
    if (record.execs.has(execId))
      throw alreadyExists('EXEC_EXISTS', 'An exec with this id exists in the container.', { details: { execId } });
    const base = path.join(record.bundle, `exec-${execId}`);
    const files = { process: `${base}.json`, pid: `${base}.pid`, log: `${base}.log` };
    await writeFile(files.process, JSON.stringify({ ...request.process, terminal: request.stdio.tty }));
    const consoleSocket = request.stdio.tty ? `${base}.sock` : undefined;
    const reaped = reap({
      reaperPath: this.options.reaperPath,
      runtimeArgv: this.argv.exec(id, files.process, files.pid, files.log, consoleSocket),
      pidFile: files.pid,
      logFile: files.log,
      consoleSocket,
      stdin: request.stdio.stdin,
    });
    const cleanup = () => Promise.all(Object.values(files).map((f) => rm(f, { force: true })));
    let handle: ProcessHandle;
    try {
      handle = await this.handle(reaped, async () => false);
    } catch (err) {
      await cleanup();
      throw err;
    }
    let timedOut = false;
    const timer =
      request.timeoutMs && request.timeoutMs > 0
        ? setTimeout(() => {
            timedOut = true;
            if (!handle.exited) killPid(handle.pid, SIGKILL);
          }, request.timeoutMs)
        : undefined;
    const exec: ExecHandle = Object.defineProperties(handle, { timedOut: { get: () => timedOut } }) as ExecHandle;
    record.execs.set(execId, exec);
    void handle.exit.then(async (exit) => {
      clearTimeout(timer);
      await cleanup();
      this.emit({ kind: 'exec-exited', id, execId, exit });
    });
    return exec;
  }

  private async handle(reaped: Reaped, oomKilled: () => Promise<boolean>): Promise<ProcessHandle> {
    const pid = await reaped.pid.catch((err: unknown) => {
      for (const s of [reaped.stdin, reaped.stdout, reaped.stderr, reaped.resize]) s?.destroy();
      throw err;
    });
    let exited: ExitStatus | undefined;
    const exit = reaped.exited.then(async (status) => {
      exited = toExitStatus(status, await oomKilled().catch(() => false), this.now());
      return exited;
    });
    return {
      pid,
      stdio: { stdin: reaped.stdin, stdout: reaped.stdout, stderr: reaped.stderr },
      resize: (rows, cols) => {
        // After the process is gone the reaper has closed its end: nothing to resize.
        if (reaped.resize !== undefined && !reaped.resize.destroyed && !reaped.resize.writableEnded) {
          reaped.resize.write(`${rows} ${cols}\n`);
        }
      },
      exit,
      get exited() {
        return exited;
      },
    };
  }

  /**
   * After an agent restart: knows again the containers whose bundles remain, with their state
   * from crun and their exit from the reaper's exit file (watched until it appears; the reaper
   * outlives the agent). Their output continues in the reaper's spool file (the handle names it);
   * stdin, and the output of a container created without a spool, died with the old agent's
   * pipes (such a container gets EPIPE on its next write). Returns the ids recovered.
   */
  async recover(pollMs = 250): Promise<string[]> {
    const recovered: string[] = [];
    for (const found of await findBundles(this.options.bundlesDir)) {
      if (this.records.has(found.id)) continue;
      let status: ContainerState['status'];
      try {
        status = runtimeStatus(await runRuntime(this.argv.state(found.id), `read the state of ${found.id}`));
      } catch {
        // crun never finished creating it, or its state is gone: nothing left to manage.
        await rm(found.bundle, { recursive: true, force: true });
        continue;
      }
      const cgroup = found.record.cgroup;
      let exited: ExitStatus | undefined;
      const exit = pollExitFile(path.join(found.bundle, INIT_PID_FILE), pollMs).then(async ({ status: s, finishedAtMs }) => {
        exited = toExitStatus(s, cgroup ? (await readOomKills(cgroup).catch(() => 0n)) > 0n : false, finishedAtMs);
        return exited;
      });
      // The reaper kept writing the output to the spool: the server resumes it from there.
      const spool = path.join(found.bundle, OUTPUT_SPOOL_FILE);
      const hasSpool = await stat(spool).then(
        () => true,
        () => false,
      );
      const handle: ProcessHandle = {
        pid: found.pid,
        stdio: hasSpool ? { spool } : {},
        resize: () => {},
        exit,
        get exited() {
          return exited;
        },
      };
      const state: ContainerState = { id: found.id, status, pid: found.pid, createdAtMs: found.record.createdAtMs };
      if (found.record.startedAtMs !== undefined) state.startedAtMs = found.record.startedAtMs;
      const record: ContainerRecord = {
        state,
        bundle: found.bundle,
        cgroup,
        writableLayerPath: found.record.writableLayerPath,
        handle,
        execs: new Map(),
      };
      // Kills counted while no agent ran were not told and are not now: the exit's oomKilled still
      // says the container had one.
      if (cgroup && status !== 'stopped') record.oom = this.watchOom(found.id, cgroup, await readOomKills(cgroup).catch(() => 0n));
      this.records.set(found.id, record);
      this.watchExit(record, exit);
      recovered.push(found.id);
    }
    return recovered;
  }

  private watchOom(id: string, cgroup: string, baseline: bigint): OomWatch {
    return watchOomKills(cgroup, baseline, (count) => this.emit({ kind: 'oom', id, atMs: this.now(), count }));
  }

  /** Marks the record stopped when the init exits; `record.stopped` resolves after that. */
  private watchExit(record: ContainerRecord, exit: Promise<ExitStatus>): void {
    record.stopped = exit.then(async (e) => {
      await this.exited(record, e);
      return e;
    });
  }

  /** The init is gone: a kill not yet told (the one that ended it) is told first, then the exit. */
  private async exited(record: ContainerRecord, exit: ExitStatus): Promise<void> {
    if (record.oom !== undefined) {
      await record.oom.check();
      record.oom.stop();
    }
    // The init is gone: what it left in its cgroup (a shared PID namespace keeps it alive) goes too.
    // A failure here leaves them to the container's delete (crun delete --force kills them).
    if (record.cgroup !== undefined) await killCgroup(record.cgroup).catch(() => undefined);
    record.state = { ...record.state, status: 'stopped', exit };
    this.emit({ kind: 'exited', id: record.state.id, exit });
  }

  private emit(event: CoreEvent): void {
    for (const listener of this.listeners) listener(event);
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

function killPid(pid: number, signal: number): void {
  try {
    process.kill(pid, signal);
  } catch (err) {
    if (errnoCode(err) !== 'ESRCH') throw err;
  }
}

/**
 * Removes a container's bundle. A write already under way when the container was deleted (the
 * output spool's acknowledged position, written off the request path) can land in the directory
 * while rm walks it: rm then fails with ENOTEMPTY, and a second pass finds the directory quiet.
 */
async function removeBundle(bundle: string, attempts = 5): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await rm(bundle, { recursive: true, force: true });
      return;
    } catch (err) {
      if (errnoCode(err) !== 'ENOTEMPTY' || attempt >= attempts) throw err;
      await new Promise((resolve) => setTimeout(resolve, 20 * attempt));
    }
  }
}
