/**
 * The tasks of one pod, as containerd sees them: the sandbox task (containerd's pause container,
 * which here is the pod's VM) and the app containers' tasks, each with its exec'd processes. This
 * is the shim face's state and its whole translation onto the core: every method takes values the
 * service has decoded once (task-service.ts) and calls the core's managers; what containerd must
 * hear (events, exit statuses, pids) is kept here. Nothing here speaks ttrpc or protobuf.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../agent-client/index.js';
import { raceAbort } from '../common/abort.js';
import { callerPath } from '../common/caller-root.js';
import { alreadyExists, errorMessage, invalid, notFound, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { epochNs } from '../common/time.js';
import type { CommandResult } from '../runtime/container/command-channels.js';
import { runExec } from '../runtime/container/commands.js';
import type { ContainerRecord } from '../runtime/container/record.js';
import type { ContainerResourceUpdate } from '../runtime/container/types.js';
import type { RequestContext } from '../runtime/context.js';
import { KeyedMutex } from '../runtime/locks.js';
import { pausePod, resumePod } from '../runtime/sandbox/pause.js';
import type { SandboxSpec } from '../runtime/spec/sandbox.js';
import { readBundleJson, readResolvConf } from './bundle.js';
import {
  decodeBundleRole,
  decodeExecProcess,
  decodePodSpec,
  decodeSoloTask,
  decodeTaskContainerSpec,
  type ExecSpec,
  isSoloBundle,
} from './decode/index.js';
import type { EventPublisher } from './events.js';
import type { OutputHolder } from './node-output-holder.js';
import { readTaskRecords, removeTaskRecord, writeTaskRecord } from './node-task-records.js';
import { cgroupParentForDriver, type ShimPod } from './pod.js';
import { openPortForwardDoor, type PortForwardDoor } from './port-forward.js';
import { timestampOfNs } from './proto.js';
import { mountRootfs, type RootfsMount, requireSourcesSeen, unmountRootfs } from './rootfs.js';
import { bootSoloSandbox, removeSoloSandbox } from './solo.js';
import { type ExecStdio, openExecStdio, type TaskIo } from './stdio.js';
import { openTaskOutput, parseOutputUri, type TaskOutput } from './task-output.js';
import './task-reasons.js';

/** Where Create writes a container's seccomp filter in its bundle (see writeSeccompProfile). */
const SECCOMP_PROFILE_FILE = 'kata-ts-seccomp.json';

/** containerd's task states (containerd.v1.types.Status). */
export type TaskStatus = 'CREATED' | 'RUNNING' | 'PAUSED' | 'STOPPED' | 'UNKNOWN';

/** An exit as containerd wants it: the status (128 + signal for a signalled process) and when. */
export interface TaskExit {
  status: number;
  atNs: bigint;
}

export interface CreateTask extends TaskIo {
  id: string;
  bundle: string;
  rootfs: RootfsMount[];
}

/** A task's view for State, Pids and Connect. */
export interface TaskState extends TaskIo {
  id: string;
  execId: string;
  bundle: string;
  pid: number;
  status: TaskStatus;
  exit: TaskExit | undefined;
}

/** A deferred exit: resolved once, awaited by any number of Wait calls. */
class ExitLatch {
  value: TaskExit | undefined;
  readonly promise: Promise<TaskExit>;
  private resolveFn!: (exit: TaskExit) => void;

  constructor() {
    this.promise = new Promise((resolve) => {
      this.resolveFn = resolve;
    });
  }

  settle(exit: TaskExit): boolean {
    if (this.value !== undefined) return false;
    this.value = exit;
    this.resolveFn(exit);
    return true;
  }
}

interface ExecProcess {
  execId: string;
  spec: ExecSpec;
  io: TaskIo;
  pid: number;
  started: boolean;
  exit: ExitLatch;
  abort: AbortController;
  stdio: ExecStdio | undefined;
  /**
   * ResizePty and CloseIO that came before Start (containerd may send the terminal's size as soon
   * as the exec is added): kept and applied once the process runs, never sent to another process.
   */
  pending: { size?: { width: number; height: number }; closeStdin: boolean };
}

interface Task {
  id: string;
  kind: 'sandbox' | 'container';
  bundle: string;
  io: TaskIo;
  pid: number;
  started: boolean;
  exit: ExitLatch;
  execs: Map<string, ExecProcess>;
  /** `<bundle>/rootfs` was mounted here (from containerd's rootfs mounts): unmounted at Delete. */
  rootfsMounted: boolean;
  /** Stops the exit watch (Delete). */
  watch: AbortController;
  /** Paused (Pause): its processes frozen in the guest until Resume. */
  paused: boolean;
  /** CRI-O wrote the bundle: an OOM kill is also told by a `<bundle>/oom` file. */
  crio: boolean;
  /** The OOM kill told (event published, CRI-O's file written): the exit waits for it. */
  oom: Promise<void> | undefined;
  /** A container that is a pod of its own (no CRI annotations): its VM was booted for it and goes with it. */
  solo: boolean;
  /** Where its stdout and stderr go (containerd's FIFOs, a file, a logging binary). */
  output: TaskOutput | undefined;
  /** Node mode: the process holding containerd's output FIFOs open across a crash of this server (node-output-holder.ts); 0 none. */
  outputHolderPid: number;
}

export interface ShimTasksDeps {
  pod: ShimPod;
  events: EventPublisher;
  /** The kata-ts runtime handler this shim runs pods with (`kata-ts`, `kata-ts-cvm`). */
  handler: string;
  logger: Logger;
  /** The containerd namespace (`-namespace`): a single-container pod's namespace, a logging binary's CONTAINER_NAMESPACE. Default `default`. */
  namespace?: string;
  /** Node mode: holds a started container's output FIFOs open while this process may die and be revived. */
  outputHolder?: OutputHolder;
}

/** Where a task's own FIFOs are (file:// and binary:// output) in the pod's state dir. */
const TASK_IO_DIR = 'task-io';

/**
 * The FIFOs containerd named, as this process opens them: through containerd's root where the
 * runtime's mount namespace does not see the same file (src/common/caller-root.ts). `outputs`:
 * stdout and stderr are FIFO paths too (not a file:// or binary:// URI). State and events keep
 * containerd's own paths.
 */
function callerFifos(io: TaskIo, outputs: boolean): TaskIo {
  const local = (p: string) => (p === '' ? '' : callerPath(p));
  return { ...io, stdin: local(io.stdin), ...(outputs ? { stdout: local(io.stdout), stderr: local(io.stderr) } : {}) };
}

/** A signal's exit status as runc reports it (128 + the signal). */
const SIGKILL_STATUS = 128 + 9;

/**
 * The file CRI-O looks for in a container's bundle when a VM runtime's container exited non-zero
 * (internal/oci/runtime_vm.go updateContainerStatus): its presence means OOMKilled. CRI-O has no
 * events service to hear containerd's TaskOOM on; Kata's shim writes the same file for it.
 */
export const CRIO_OOM_FILE = 'oom';

/**
 * Where a container's root filesystem is (pure): `<bundle>/rootfs` when the Create request
 * brought mounts for it (containerd's snapshotter; the shim mounts them there), else the spec's
 * `root.path` (relative to the bundle, as runc reads it): CRI-O hands no rootfs mounts and names
 * the mounted image directly (`/var/lib/containers/storage/overlay/<id>/merged`).
 */
export function containerRootfsPath(oci: unknown, bundle: string, mountsGiven: boolean): string {
  const fallback = path.join(bundle, 'rootfs');
  if (mountsGiven) return fallback;
  const root = typeof oci === 'object' && oci !== null ? (oci as { root?: { path?: unknown } }).root : undefined;
  return typeof root?.path === 'string' && root.path !== '' ? path.resolve(bundle, root.path) : fallback;
}

export class ShimTasks {
  private readonly tasks = new Map<string, Task>();
  private sandboxId: string | undefined;
  private readonly unsubscribeOom: () => void;
  /**
   * One rpc at a time per task, and per exec: each checks a state and then awaits (Start checks
   * `started` and then starts the container in the guest), so two at once would both pass the
   * check. Wait, State, Pids and Stats only read and are not held up.
   */
  private readonly serial = new KeyedMutex();
  /** containerd's port-forward into the guest, while the sandbox runs in containerd's namespace. */
  private portDoor: PortForwardDoor | undefined;

  constructor(private readonly deps: ShimTasksDeps) {
    // The core reports an OOM kill just before the exit it caused (ContainerEvents).
    this.unsubscribeOom = deps.pod.containers.events.subscribeOom((e) => this.oomKilled(e.record.id));
  }

  private get namespace(): string {
    return this.deps.namespace ?? 'default';
  }

  /**
   * containerd's port-forward into the guest (port-forward.ts), for a sandbox in containerd's
   * namespace. A door that cannot be made is logged, not fatal: the pod runs, port-forward to it
   * fails as it did before the door existed.
   */
  private async openPortDoor(sandboxId: string, netnsPath: string, logger: Logger): Promise<void> {
    try {
      this.portDoor = await openPortForwardDoor({
        netnsPath,
        stateDir: this.deps.pod.stateDir,
        logger,
        dial: (port) => {
          const agent = this.deps.pod.guests.agentOf(sandboxId);
          if (agent === undefined) throw precondition('TASK_NOT_RUNNING', `sandbox ${sandboxId} has no agent`);
          return agent.portForward(port);
        },
      });
    } catch (err) {
      logger.error({ err: errorMessage(err) }, 'port-forward door not made: port-forward to this pod fails');
    }
  }

  /** The door's rule, helper and socket removed (before the VM stops; idempotent). */
  async closePortDoor(): Promise<void> {
    const door = this.portDoor;
    this.portDoor = undefined;
    await door?.close().catch((err: unknown) => this.deps.logger.warn({ err: errorMessage(err) }, 'port-forward door not fully removed'));
  }

  /** Run `fn` after every earlier rpc of the task (execId '') or of the exec. */
  private one<T>(id: string, execId: string, fn: () => Promise<T>): Promise<T> {
    return this.serial.run(execId === '' ? id : `${id}\u0000${execId}`, fn);
  }

  /** No task is left: Shutdown may end the shim. */
  get empty(): boolean {
    return this.tasks.size === 0;
  }

  /** The pod's sandbox id, once its task was created. */
  get sandbox(): string | undefined {
    return this.sandboxId;
  }

  create(req: CreateTask, ctx: RequestContext): Promise<number> {
    return this.one(req.id, '', () => this.createNow(req, ctx));
  }

  /**
   * The Sandbox API's StartSandbox (sandbox-service.ts): the pod's VM from the whole pod config
   * containerd passed, with no pause task; the pod's containers then join it through Create.
   * Returns the VMM's host pid.
   */
  runSandbox(id: string, spec: SandboxSpec, netnsPath: string, ctx: RequestContext): Promise<number> {
    return this.one(id, '', async () => {
      if (this.sandboxId !== undefined) throw alreadyExists('TASK_EXISTS', `this shim already runs sandbox ${this.sandboxId}`);
      const driver = this.deps.pod.facts.cgroupDriver.name;
      const parent = cgroupParentForDriver(driver, null, spec.linux?.cgroup_parent ?? '');
      const placed =
        spec.linux == null || parent === spec.linux.cgroup_parent ? spec : { ...spec, linux: { ...spec.linux, cgroup_parent: parent } };
      await this.deps.pod.sandboxes.run(placed, this.deps.handler, ctx, { id, ...(netnsPath === '' ? {} : { joinNetns: netnsPath }) });
      this.sandboxId = id;
      if (netnsPath !== '') await this.openPortDoor(id, netnsPath, ctx.logger);
      return this.deps.pod.sandboxes.find(id)?.vm?.pid ?? 0;
    });
  }

  private async createNow(req: CreateTask, ctx: RequestContext): Promise<number> {
    if (this.tasks.has(req.id)) throw alreadyExists('TASK_EXISTS', `task ${req.id} already exists in this shim`);
    const oci = await readBundleJson(req.bundle);
    const io: TaskIo = { stdin: req.stdin, stdout: req.stdout, stderr: req.stderr, terminal: req.terminal };
    // A bundle without CRI annotations, first in its shim, is a container that is a pod of its own.
    const solo = this.sandboxId === undefined && isSoloBundle(oci);
    const kind = this.sandboxId === undefined && !solo ? 'sandbox' : 'container';
    const outputTarget = parseOutputUri(io.stdout, 'stdout');
    const task: Task = {
      id: req.id,
      kind,
      bundle: req.bundle,
      io,
      pid: 0,
      started: false,
      exit: new ExitLatch(),
      execs: new Map(),
      rootfsMounted: false,
      watch: new AbortController(),
      paused: false,
      crio: false,
      oom: undefined,
      solo,
      output: undefined,
      outputHolderPid: 0,
    };
    if (kind === 'sandbox') {
      // The pod's DNS is the resolv.conf containerd wrote for it (the guest gets it as its own).
      const first = decodePodSpec(oci, { bundle: req.bundle });
      // containerd's file, read through its root where the runtime's namespace does not see it.
      const resolvConf = first.resolvConfPath === null ? undefined : await readResolvConf(callerPath(first.resolvConfPath));
      const pod = resolvConf === undefined ? first : decodePodSpec(oci, { resolvConf, bundle: req.bundle });
      const driver = this.deps.pod.facts.cgroupDriver.name;
      const parent = cgroupParentForDriver(driver, pod.cgroup?.driver ?? null, pod.spec.linux?.cgroup_parent ?? '');
      if (pod.spec.linux != null && parent !== pod.spec.linux.cgroup_parent) {
        this.deps.logger.warn(
          { cgroupsPath: pod.cgroup?.cgroupsPath, driver },
          'the sandbox names a systemd slice but the configured cgroup driver is cgroupfs: the VMM goes to the cgroupfs root',
        );
        pod.spec.linux.cgroup_parent = parent;
      }
      await this.deps.pod.sandboxes.run(pod.spec, this.deps.handler, ctx, {
        id: req.id,
        ...(pod.netnsPath === null ? {} : { joinNetns: pod.netnsPath }),
      });
      this.sandboxId = req.id;
      task.pid = this.deps.pod.sandboxes.find(req.id)?.vm?.pid ?? 0;
      if (pod.netnsPath !== null) await this.openPortDoor(req.id, pod.netnsPath, ctx.logger);
    } else {
      const sandboxId = solo ? req.id : (this.sandboxId as string);
      const seccompProfilePath = await writeSeccompProfile(oci, req.bundle);
      const seccomp = seccompProfilePath === undefined ? {} : { seccompProfilePath };
      const soloTask = solo
        ? decodeSoloTask(oci, { namespace: this.namespace, id: req.id, stdin: io.stdin !== '', ...seccomp })
        : undefined;
      const spec = soloTask?.container ?? decodeTaskContainerSpec(oci, sandboxId, seccomp);
      task.crio = !solo && decodeBundleRole(oci).kind === 'cri-o';
      const rootfs = containerRootfsPath(oci, req.bundle, req.rootfs.length > 0);
      const output = await openTaskOutput(callerFifos(io, outputTarget.kind === 'fifo'), {
        // The shim's own FIFOs only for a file or a logger (containerd's FIFOs are used as they are).
        dir: outputTarget.kind === 'fifo' ? '' : path.join(this.deps.pod.stateDir, TASK_IO_DIR, req.id),
        containerId: req.id,
        namespace: this.namespace,
        logger: ctx.logger,
      });
      let booted = false;
      try {
        if (req.rootfs.length > 0) {
          // The snapshot's directories must be containerd's here too (not so on a private root for
          // a file system mounted after the runtime's namespace was made): refused, never mounted empty.
          requireSourcesSeen(req.rootfs, callerPath);
          await mountRootfs(req.rootfs, rootfs);
          task.rootfsMounted = true;
        }
        if (soloTask !== undefined) {
          await bootSoloSandbox(this.deps, req.id, soloTask, ctx);
          booted = true;
        }
        await this.deps.pod.containers.create(sandboxId, spec, ctx, {
          id: req.id,
          rootfs,
          stdio: { kind: 'fifo', ...output.io },
          // containerd and CRI-O refuse a privileged container in a pod that is not privileged.
          podPrivilegeCheckedByCaller: true,
        });
      } catch (err) {
        // Everything made for the task goes: the VM booted for it, the rootfs, the output's FIFOs and logger.
        if (booted)
          await removeSoloSandbox(this.deps, req.id, ctx).catch((e: unknown) =>
            ctx.logger.warn({ err: errorMessage(e) }, 'removing the VM of a failed create failed'),
          );
        if (task.rootfsMounted) await unmountRootfs(rootfs).catch(() => undefined);
        await output.close();
        throw err;
      }
      task.output = output;
      if (solo) {
        this.sandboxId = req.id;
        task.pid = this.hostPid();
      }
    }
    this.tasks.set(req.id, task);
    await this.saveTask(task);
    await this.deps.events.publish('/tasks/create', {
      container_id: req.id,
      bundle: req.bundle,
      rootfs: req.rootfs.map((m) => ({ ...m, options: [...m.options] })),
      io: { stdin: io.stdin, stdout: io.stdout, stderr: io.stderr, terminal: io.terminal },
      checkpoint: '',
      pid: task.pid,
    });
    return task.pid;
  }

  /** Start a task (the sandbox's VM already runs: Start only watches it) or one of its execs. */
  start(id: string, execId: string, ctx: RequestContext): Promise<number> {
    return this.one(id, execId, () => this.startNow(id, execId, ctx));
  }

  private async startNow(id: string, execId: string, ctx: RequestContext): Promise<number> {
    const task = this.task(id);
    if (execId !== '') return this.startExec(task, execId, ctx);
    if (task.started) throw precondition('TASK_ALREADY_STARTED', `task ${id} was started already`);
    if (task.kind === 'container') {
      // The holder first: from the container's first byte, containerd's copy must outlive a crash of this server.
      if (this.deps.outputHolder !== undefined && parseOutputUri(task.io.stdout, 'stdout').kind === 'fifo')
        task.outputHolderPid = (await this.deps.outputHolder.hold(id, callerFifos(task.io, true))) ?? 0;
      try {
        await this.deps.pod.containers.start(id, ctx);
      } catch (err) {
        await this.releaseOutput(task);
        throw err;
      }
      task.pid = this.hostPid();
    }
    task.started = true;
    await this.saveTask(task);
    this.watchExit(task);
    await this.deps.events.publish('/tasks/start', { container_id: id, pid: task.pid });
    return task.pid;
  }

  private watchExit(task: Task): void {
    const signal = task.watch.signal;
    const exited =
      task.kind === 'sandbox'
        ? this.deps.pod.sandboxExited(task.id, signal)
        : this.deps.pod.containers.waitExit(task.id, signal).then(async (e) => {
            // An OOM kill the core recorded without the event reaching us (it came before Start's watch).
            if (task.oom === undefined && this.exitReason(task.id) === 'OOMKilled') this.oomKilled(task.id);
            await task.oom;
            // containerd closes the task's FIFOs as soon as it handles TaskExit: the output goes
            // in first, or the last lines of a short-lived container are lost.
            await this.deps.pod.containers.outputStored(task.id).catch(() => undefined);
            // A file's relay writes the last bytes before the exit is told; a logger gets its end.
            task.output?.end();
            await task.output?.drained();
            // containerd's Delete waits for its copy to see the FIFOs' end: no holder may keep them open.
            await this.releaseOutput(task);
            return { status: e.exitCode, atNs: BigInt(e.finishedAtNs) };
          });
    exited.then(
      (exit) => this.taskExited(task, exit),
      (err: unknown) => {
        if (!signal.aborted) this.deps.logger.warn({ containerId: task.id, err: errorMessage(err) }, 'watching a task exit failed');
      },
    );
  }

  private exitReason(id: string): string | undefined {
    try {
      return this.deps.pod.containers.resolve(id).reason;
    } catch {
      return undefined;
    }
  }

  /**
   * The guest's OOM killer ended a process of a container (its init or another): containerd hears
   * a TaskOOM for each kill, before an exit it caused; CRI-O finds `<bundle>/oom` when it reads the
   * exit (the exit waits for the file).
   */
  private oomKilled(id: string): void {
    const task = this.tasks.get(id);
    if (task === undefined || task.kind !== 'container') return;
    this.deps.logger.info({ containerId: id }, 'OOM kill in the task');
    // Every kill is a TaskOOM, as runc's shim sends one per memory.events change; the file once.
    this.deps.events.publish('/tasks/oom', { container_id: id });
    if (task.oom !== undefined) return;
    task.oom = task.crio
      ? fsp.writeFile(path.join(task.bundle, CRIO_OOM_FILE), '', { mode: 0o644 }).catch((err: unknown) => {
          this.deps.logger.warn({ containerId: id, err: errorMessage(err) }, "writing CRI-O's oom file failed");
        })
      : Promise.resolve();
  }

  private taskExited(task: Task, exit: TaskExit): void {
    if (!task.exit.settle(exit)) return;
    this.deps.logger.info({ containerId: task.id, exitStatus: exit.status }, 'task exited');
    void this.deps.events.publish('/tasks/exit', {
      container_id: task.id,
      id: task.id,
      pid: task.pid,
      exit_status: exit.status,
      exited_at: timestampOfNs(exit.atNs),
    });
  }

  kill(id: string, execId: string, signal: number, all: boolean, ctx: RequestContext): Promise<void> {
    return this.one(id, execId, () => this.killNow(id, execId, signal, all, ctx));
  }

  private async killNow(id: string, execId: string, signal: number, all: boolean, ctx: RequestContext): Promise<void> {
    const task = this.task(id);
    if (execId !== '') {
      const exec = this.exec(task, execId);
      if (exec.exit.value !== undefined) throw notFound('PROCESS_FINISHED', `exec ${execId} of task ${id} has already finished`);
      const agent = this.deps.pod.guests.agentOf(this.sandboxId as string);
      if (agent === undefined || !exec.started) throw precondition('EXEC_NOT_RUNNING', `exec ${execId} of task ${id} is not running`);
      await agent.signalProcess(id, exec.stdio?.guestExecId ?? '', signal, { timeoutMs: 30_000 });
      return;
    }
    if (task.exit.value !== undefined) throw notFound('PROCESS_FINISHED', `task ${id} has already finished`);
    if (signal === 0 && (task.kind === 'sandbox' || !task.started)) {
      // A liveness probe (CRI-O's IsContainerAlive): the task has not finished, nothing is ended.
      return;
    }
    if (task.kind === 'sandbox') {
      // The pod's VM stops as a whole; its containers are told by the core and exit with it.
      await this.closePortDoor();
      await this.deps.pod.sandboxes.stop(id, ctx);
      this.taskExited(task, { status: SIGKILL_STATUS, atNs: epochNs() });
      return;
    }
    if (!task.started) {
      // A container never started has no process: it ends here, as runc's created task does.
      await this.deps.pod.containers.stop(id, 0, ctx);
      this.taskExited(task, { status: 128 + signal, atNs: epochNs() });
      return;
    }
    await this.deps.pod.containers.kill(id, signal, all, ctx);
  }

  async wait(id: string, execId: string, signal: AbortSignal): Promise<TaskExit> {
    const task = this.task(id);
    const latch = execId === '' ? task.exit : this.exec(task, execId).exit;
    return raceAbort(latch.promise, signal, (sig) => (sig.reason instanceof Error ? sig.reason : new Error('the wait was cancelled')));
  }

  delete(id: string, execId: string, ctx: RequestContext): Promise<{ pid: number; exit: TaskExit }> {
    return this.one(id, execId, () => this.deleteNow(id, execId, ctx));
  }

  private async deleteNow(id: string, execId: string, ctx: RequestContext): Promise<{ pid: number; exit: TaskExit }> {
    const task = this.task(id);
    if (execId !== '') {
      const exec = this.exec(task, execId);
      if (exec.started && exec.exit.value === undefined) {
        throw precondition('EXEC_RUNNING', `exec ${execId} of task ${id} is still running; kill it first`);
      }
      exec.abort.abort();
      task.execs.delete(execId);
      const exit = exec.exit.value ?? { status: 0, atNs: epochNs() };
      return { pid: exec.pid, exit };
    }
    if (task.kind === 'sandbox' && this.tasks.size > 1) {
      const left = [...this.tasks.keys()].filter((t) => t !== id);
      throw precondition('SANDBOX_HAS_TASKS', `the pod's sandbox task cannot be deleted while tasks ${left.join(', ')} exist`);
    }
    if (task.started && task.exit.value === undefined) {
      throw precondition('TASK_RUNNING', `task ${id} is still running; kill it first`);
    }
    for (const exec of task.execs.values()) exec.abort.abort();
    if (task.kind === 'sandbox') await this.closePortDoor();
    if (task.kind === 'sandbox') await this.deps.pod.sandboxes.remove(id, ctx);
    else await this.deps.pod.containers.remove(id, ctx);
    if (task.solo) {
      // The container is gone; then the VM that was booted for it.
      await removeSoloSandbox(this.deps, id, ctx);
      this.sandboxId = undefined;
    }
    if (task.rootfsMounted) {
      await unmountRootfs(path.join(task.bundle, 'rootfs'));
      task.rootfsMounted = false;
    }
    task.output?.end();
    await task.output?.close();
    await this.releaseOutput(task);
    task.watch.abort();
    this.tasks.delete(id);
    await removeTaskRecord(this.deps.pod.stateDir, id);
    const exit = task.exit.value ?? { status: 0, atNs: epochNs() };
    await this.deps.events.publish('/tasks/delete', {
      container_id: id,
      pid: task.pid,
      exit_status: exit.status,
      exited_at: timestampOfNs(exit.atNs),
      id,
    });
    return { pid: task.pid, exit };
  }

  state(id: string, execId: string): TaskState {
    const task = this.task(id);
    if (execId !== '') {
      const exec = this.exec(task, execId);
      return {
        id,
        execId,
        bundle: task.bundle,
        pid: exec.pid,
        status: exec.exit.value !== undefined ? 'STOPPED' : exec.started ? 'RUNNING' : 'CREATED',
        exit: exec.exit.value,
        ...exec.io,
      };
    }
    return {
      id,
      execId: '',
      bundle: task.bundle,
      pid: task.pid,
      status: task.exit.value !== undefined ? 'STOPPED' : task.paused ? 'PAUSED' : task.started ? 'RUNNING' : 'CREATED',
      exit: task.exit.value,
      ...task.io,
    };
  }

  /**
   * Pause (`frozen`) or Resume a task: a container's processes are frozen by its guest cgroup's
   * freezer; the sandbox task pauses the whole pod (src/runtime/sandbox/pause.ts: every running
   * container frozen, then the VM's vCPUs stopped, so the pod holds its memory and spends no CPU;
   * while paused, calls that need the guest answer FAILED_PRECONDITION SANDBOX_PAUSED at once).
   * Idempotent; /tasks/paused or /tasks/resumed once per change.
   */
  freeze(id: string, frozen: boolean, ctx: RequestContext): Promise<void> {
    return this.one(id, '', () => this.freezeNow(id, frozen, ctx));
  }

  private async freezeNow(id: string, frozen: boolean, ctx: RequestContext): Promise<void> {
    const task = this.task(id);
    if (task.exit.value !== undefined || !task.started) {
      throw precondition('TASK_NOT_RUNNING', `task ${id} is not running; only a running task can be ${frozen ? 'paused' : 'resumed'}`);
    }
    if (task.kind === 'container') {
      if (task.paused === frozen) return;
      await this.deps.pod.containers.freeze(task.id, frozen, ctx);
      task.paused = frozen;
    } else {
      // The core's record is the truth (it survives a restart of this shim); the task follows it.
      const pod = { sandboxes: this.deps.pod.sandboxes, containers: this.deps.pod.containers };
      const outcome = frozen ? await pausePod(pod, id, ctx) : await resumePod(pod, id, ctx);
      const wasPaused = task.paused;
      for (const t of this.tasks.values()) {
        if (t.kind === 'container' && t.started && t.exit.value === undefined) t.paused = frozen;
      }
      task.paused = frozen;
      if (!outcome.changed && wasPaused === frozen) return;
    }
    await this.deps.events.publish(frozen ? '/tasks/paused' : '/tasks/resumed', { container_id: id });
  }

  /**
   * The task's host process: the VMM's pid, once (see hostPid). Its execs run in the same VM, so
   * they add no host process of their own.
   */
  pids(id: string): Array<{ pid: number; execId: string }> {
    const task = this.task(id);
    return task.pid > 0 ? [{ pid: task.pid, execId: '' }] : [];
  }

  /**
   * The pid containerd hears for every task and exec of the pod: the VMM's, as Kata reports. A
   * container's processes live in the guest, and a guest pid handed to the host names an
   * unrelated host process to whatever acts on it (nsenter, kill, NRI plugins); the VMM is the host
   * process that holds them all. 0 when the VM is gone.
   */
  private hostPid(): number {
    return this.sandboxId === undefined ? 0 : (this.deps.pod.sandboxes.find(this.sandboxId)?.vm?.pid ?? 0);
  }

  /** Exec: remember the process; Start runs it. */
  addExec(id: string, execId: string, io: TaskIo, specJson: unknown): Promise<void> {
    return this.one(id, execId, () => this.addExecNow(id, execId, io, specJson));
  }

  private async addExecNow(id: string, execId: string, io: TaskIo, specJson: unknown): Promise<void> {
    const task = this.task(id);
    if (task.kind === 'sandbox') throw invalid('EXEC_IN_SANDBOX', `task ${id} is the pod's sandbox; processes run in its containers`);
    if (execId === '') throw invalid('EXEC_ID_MISSING', 'exec_id is required');
    if (task.execs.has(execId)) throw alreadyExists('EXEC_EXISTS', `exec ${execId} already exists in task ${id}`);
    if (!task.started || task.exit.value !== undefined) throw precondition('TASK_NOT_RUNNING', `task ${id} is not running`);
    // containerd's clients give an exec FIFOs; a file or logger URI is for a task's own process only.
    if (parseOutputUri(io.stdout, 'stdout').kind !== 'fifo') {
      throw invalid('SHIM_STDIO_INVALID', "an exec's stdout must be a FIFO path; file:// and binary:// name a task's output", {
        details: { field: 'stdout' },
      });
    }
    const spec = decodeExecProcess(specJson);
    task.execs.set(execId, {
      execId,
      spec,
      io,
      pid: 0,
      started: false,
      exit: new ExitLatch(),
      abort: new AbortController(),
      stdio: undefined,
      pending: { closeStdin: false },
    });
    await this.deps.events.publish('/tasks/exec-added', { container_id: id, exec_id: execId });
  }

  private async startExec(task: Task, execId: string, ctx: RequestContext): Promise<number> {
    const exec = this.exec(task, execId);
    if (exec.started) throw precondition('EXEC_ALREADY_STARTED', `exec ${execId} of task ${task.id} was started already`);
    const agent = this.deps.pod.guests.agentOf(this.sandboxId as string);
    const record: ContainerRecord = this.deps.pod.containers.resolve(task.id);
    if (agent === undefined || record.state !== 'CONTAINER_RUNNING') {
      throw precondition('TASK_NOT_RUNNING', `task ${task.id} is not running; no process can start in it`);
    }
    const stdio = await openExecStdio(callerFifos(exec.io, true), exec.abort.signal);
    exec.stdio = stdio;
    const logger = ctx.logger.child({ containerId: task.id, execId });
    const started = new Promise<number>((resolve, reject) => {
      const finish = async (result: CommandResult): Promise<void> => {
        await stdio.close();
        const status = 'exitCode' in result ? result.exitCode : 255;
        if (exec.exit.settle({ status, atNs: epochNs() })) {
          void this.deps.events.publish('/tasks/exit', {
            container_id: task.id,
            id: execId,
            pid: exec.pid,
            exit_status: status,
            exited_at: timestampOfNs(exec.exit.value?.atNs ?? epochNs()),
          });
        }
      };
      runExec(agent, record, exec.spec.args, exec.io.terminal, { ...stdio.channels, signal: exec.abort.signal, finish }, logger, {
        execId: stdio.guestExecId,
        started: (guestPid) => {
          exec.pid = this.hostPid();
          exec.started = true;
          logger.debug({ guestPid }, 'exec started in the guest');
          resolve(exec.pid);
        },
      }).then(
        async () => {
          // runExec returns without finish when the exec was deleted (aborted) while running.
          if (exec.exit.value === undefined) await finish({ exitCode: SIGKILL_STATUS });
        },
        async (err: unknown) => {
          logger.warn({ err: errorMessage(err) }, 'exec failed');
          if (!exec.started) reject(err);
          else await finish({ error: errorMessage(err) });
        },
      );
    });
    const pid = await started;
    await this.applyPending(task, exec, agent, logger);
    await this.deps.events.publish('/tasks/exec-started', { container_id: task.id, exec_id: execId, pid });
    return pid;
  }

  /** What came for the exec before it started: its terminal's size, then the end of its stdin. */
  private async applyPending(task: Task, exec: ExecProcess, agent: AgentClient, logger: Logger): Promise<void> {
    const { size, closeStdin } = exec.pending;
    exec.pending = { closeStdin: false };
    if (size !== undefined && exec.io.terminal) {
      await agent
        .resizeTty(task.id, exec.stdio?.guestExecId ?? '', size.height, size.width, { timeoutMs: 30_000 })
        .catch((err: unknown) => {
          // The process runs; a size it missed is the terminal's next resize's to fix, not a failed Start.
          logger.warn({ err: errorMessage(err), ...size }, 'the terminal size sent before the exec started could not be applied');
        });
    }
    if (closeStdin) exec.stdio?.closeStdin();
  }

  resizePty(id: string, execId: string, width: number, height: number): Promise<void> {
    return this.one(id, execId, () => this.resizePtyNow(id, execId, width, height));
  }

  private async resizePtyNow(id: string, execId: string, width: number, height: number): Promise<void> {
    const task = this.task(id);
    const agent = this.deps.pod.guests.agentOf(this.sandboxId as string);
    if (agent === undefined) throw precondition('TASK_NOT_RUNNING', `task ${id} is not running`);
    let guestExecId = '';
    if (execId !== '') {
      const exec = this.exec(task, execId);
      if (!exec.started) {
        exec.pending.size = { width, height };
        return;
      }
      guestExecId = exec.stdio?.guestExecId ?? '';
    }
    this.deps.logger.debug({ containerId: id, execId, guestExecId, width, height }, 'terminal resized');
    await agent.resizeTty(id, guestExecId, height, width, { timeoutMs: 30_000 });
  }

  closeIo(id: string, execId: string): Promise<void> {
    return this.one(id, execId, () => this.closeIoNow(id, execId));
  }

  private async closeIoNow(id: string, execId: string): Promise<void> {
    const task = this.task(id);
    if (execId !== '') {
      const exec = this.exec(task, execId);
      if (exec.started) exec.stdio?.closeStdin();
      else exec.pending.closeStdin = true;
      return;
    }
    if (task.kind === 'container') await this.deps.pod.containers.closeStdin(id);
  }

  update(id: string, update: ContainerResourceUpdate, ctx: RequestContext): Promise<void> {
    return this.one(id, '', () => this.updateNow(id, update, ctx));
  }

  private async updateNow(id: string, update: ContainerResourceUpdate, ctx: RequestContext): Promise<void> {
    const task = this.task(id);
    if (task.kind === 'sandbox') {
      // containerd resizes the pod's cgroup through the sandbox task; the VM's own shape follows
      // its containers' updates (UpdateContainerResources), so nothing changes here.
      ctx.logger.info({ containerId: id }, 'Update of the sandbox task: the VM is resized by its containers updates');
      return;
    }
    await this.deps.pod.resize.updateContainer(id, update, ctx);
  }

  /** The records Stats reads: the container's, or for the sandbox task the whole pod. */
  containerRecord(id: string): ContainerRecord | undefined {
    const task = this.task(id);
    return task.kind === 'container' ? this.deps.pod.containers.resolve(id) : undefined;
  }

  connect(id: string): { taskPid: number } {
    const task = this.tasks.get(id);
    return { taskPid: task?.pid ?? 0 };
  }

  /** Every task's exit watch stopped, every exec's streams closed (the shim is going away). */
  /** The task's file (node-task-records.ts): what serving it again after a crash needs. */
  private async saveTask(task: Task): Promise<void> {
    const { id, kind, bundle, io, rootfsMounted, crio, solo, started, outputHolderPid } = task;
    await writeTaskRecord(this.deps.pod.stateDir, { id, kind, bundle, io, rootfsMounted, crio, solo, started, outputHolderPid });
  }

  /** The task's output holder ended (node mode), so containerd's copy sees the FIFOs' end. */
  private async releaseOutput(task: Task): Promise<void> {
    const pid = task.outputHolderPid;
    if (pid === 0 || this.deps.outputHolder === undefined) return;
    task.outputHolderPid = 0;
    await this.deps.outputHolder.release(task.id, pid);
  }

  /**
   * The tasks again from their files, after the pod's core recovered (node mode: the node shim
   * server re-attached the pod after it died): started ones are watched for their exit again (an
   * exit that happened meanwhile is told now). Nothing is published for what containerd already
   * heard. Exec'd processes are not recovered.
   */
  async recover(): Promise<void> {
    const { records, bad } = await readTaskRecords(this.deps.pod.stateDir);
    if (bad.length > 0) this.deps.logger.warn({ files: bad }, 'task files that do not read as tasks: skipped');
    // A pod paused before the restart is still paused (the core's record says so, and which
    // containers its pause froze): the tasks report PAUSED, as they did.
    const podPause = records
      .filter((r) => r.kind === 'sandbox' || r.solo)
      .map((r) => this.deps.pod.sandboxes.find(r.id)?.record.paused ?? null)
      .find((p) => p !== null);
    for (const r of records) {
      if (this.tasks.has(r.id)) continue;
      const task: Task = {
        ...r,
        pid: 0,
        exit: new ExitLatch(),
        execs: new Map(),
        watch: new AbortController(),
        paused: podPause !== undefined && r.started && (r.kind === 'sandbox' || r.solo || podPause.frozenContainers.includes(r.id)),
        oom: undefined,
        output: undefined,
        outputHolderPid: r.outputHolderPid ?? 0,
      };
      if (r.kind === 'sandbox' || r.solo) this.sandboxId = r.id;
      if (r.kind === 'sandbox') task.pid = this.deps.pod.sandboxes.find(r.id)?.vm?.pid ?? 0;
      else {
        if (parseOutputUri(r.io.stdout, 'stdout').kind === 'fifo')
          task.output = await openTaskOutput(r.io, { dir: '', containerId: r.id, namespace: this.namespace, logger: this.deps.logger });
        else this.deps.logger.warn({ containerId: r.id }, "a file or logger output is not served again after the shim's restart");
        if (this.sandboxId !== undefined) task.pid = this.hostPid();
      }
      this.tasks.set(r.id, task);
      if (r.started) this.watchExit(task);
      this.deps.logger.info({ containerId: r.id, kind: r.kind, started: r.started }, 'task recovered');
    }
  }

  close(): void {
    this.unsubscribeOom();
    for (const task of this.tasks.values()) {
      task.watch.abort();
      for (const exec of task.execs.values()) exec.abort.abort();
    }
  }

  private task(id: string): Task {
    const task = this.tasks.get(id);
    if (task === undefined) throw notFound('TASK_NOT_FOUND', `task ${id} does not exist in this shim`);
    return task;
  }

  private exec(task: Task, execId: string): ExecProcess {
    const exec = task.execs.get(execId);
    if (exec === undefined) throw notFound('EXEC_NOT_FOUND', `exec ${execId} does not exist in task ${task.id}`);
    return exec;
  }
}

/**
 * The bundle's `linux.seccomp` filter, written as JSON to `<bundle>/kata-ts-seccomp.json` for the
 * core to read as a Localhost profile (the container gets the filter containerd computed); the
 * bundle, and the file with it, is containerd's to remove. Undefined when the spec has no filter.
 */
async function writeSeccompProfile(oci: unknown, bundle: string): Promise<string | undefined> {
  const seccomp = (oci as { linux?: { seccomp?: unknown } } | null)?.linux?.seccomp;
  if (seccomp === undefined || seccomp === null) return undefined;
  const file = path.join(bundle, SECCOMP_PROFILE_FILE);
  await fsp.writeFile(file, JSON.stringify(seccomp), { mode: 0o600 });
  return file;
}
