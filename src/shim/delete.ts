/**
 * `containerd-shim-kata-ts-v2 ... -id <id> -bundle <bundle> delete`: containerd runs it when its
 * connection to a task's shim closed (the shim died, or exited after its pod was deleted) to
 * clean up what the shim would have, and reads a DeleteResponse (pid, exit status, when) from
 * stdout. It is run for the sandbox and for each container, and must succeed (exit 0) when there
 * is nothing left to clean: every step is idempotent.
 *
 * The pod's state dir says what is left. Its lock (`daemon.lock`, held by the pod's `serve`
 * process while it lives) decides who may touch it:
 * - the shim is **gone** (the lock is free or stale): the pod's core is composed on the state dir
 *   and recovered, as the shim would have at start; then the container is removed, or for the
 *   sandbox the whole pod (containers, VM, virtiofsd, shared-dir mounts, TAP wiring, cgroup,
 *   records); `<bundle>/rootfs` is unmounted; and once the pod holds nothing, its state dir and
 *   socket go;
 * - the shim still **lives** and the id is a container: the shim owns the container. containerd
 *   closes a container's connection after deleting its task, so the shim has removed it already;
 *   `<bundle>/rootfs` is unmounted only when the shim no longer has a record of the container;
 * - the shim still lives and the id is the sandbox: containerd has given the pod up (it no longer
 *   talks to the shim), so the shim is ended (SIGTERM, then SIGKILL) and the pod is cleaned as above.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errorMessage, isReason } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { isSameLiveProcess } from '../common/procfs.js';
import type { LoadedConfig } from '../config/types.js';
import type { RuntimeFacts } from '../runtime/facts.js';
import { releaseSharedMounts } from '../runtime/sandbox/shared-dir.js';
import { acquireStateLock, STATE_LOCK_FILE, type StateLock } from '../runtime/state-lock.js';
import { readBundleConfig, type TaskRole, taskRole } from './bundle.js';
import { type DeleteResult, EXIT_STATUS_KILLED } from './delete-response.js';
import { nodeRequest } from './node-client.js';
import { endRelay } from './node-relay.js';
import {
  hasContainerRecord,
  locatePod,
  nodeServerPaths,
  podStateDir,
  readShimInfo,
  type ShimInfo,
  validateId,
  validateNamespace,
} from './paths.js';
import { composePod, shimRequestContext } from './pod.js';
import { removeStalePortForwardRules } from './port-forward.js';
import { unmountRootfs } from './rootfs.js';
import './reasons.js';

export interface DeleteOptions {
  loaded: LoadedConfig;
  namespace: string;
  id: string;
  /** The task's bundle (`-bundle`, else the working directory); it may be gone already. */
  bundle: string;
  logger: Logger;
  /** Facts decided by the caller (tests); gathered from the host when absent. */
  facts?: RuntimeFacts;
  /** How long a live shim is given to stop after SIGTERM before SIGKILL (default 10 s). */
  stopShimTimeoutMs?: number;
}

/** What `delete` did. */
export interface DeleteOutcome extends DeleteResult {
  /** `container` or `pod` when something was removed, `nothing` when nothing was there. */
  removed: 'container' | 'pod' | 'nothing';
}

/** The pod the task belongs to: from the bundle's annotations, else by looking through the pods' state. */
async function roleOf(options: DeleteOptions): Promise<TaskRole | undefined> {
  const spec = await readBundleConfig(options.bundle).catch(() => undefined);
  if (spec !== undefined) return taskRole(options.id, spec.annotations);
  const found = await locatePod(options.loaded.config.shim.stateRoot, options.namespace, options.id);
  if (found === undefined) return undefined;
  return { role: found.sandboxId === options.id ? 'sandbox' : 'container', sandboxId: found.sandboxId };
}

/** Clean up after the task's shim (see the file's comment). Idempotent. */
export async function deleteTask(options: DeleteOptions): Promise<DeleteOutcome> {
  validateNamespace(options.namespace);
  validateId(options.id);
  const log = options.logger.child({ namespace: options.namespace, id: options.id });
  const result: DeleteOutcome = { pid: 0, exitStatus: EXIT_STATUS_KILLED, exitedAt: new Date(), removed: 'nothing' };
  const rootfs = path.join(options.bundle, 'rootfs');
  const role = await roleOf(options);
  const stateDir = role === undefined ? undefined : podStateDir(options.loaded.config.shim.stateRoot, options.namespace, role.sandboxId);
  if (role === undefined || stateDir === undefined || !(await exists(stateDir))) {
    await unmountRootfs(rootfs, log);
    return result;
  }
  const lock = await lockPod(stateDir, role, options, log);
  if (lock === 'shim-owns-container') {
    // The pod's shim lives and owns the container: only a rootfs it no longer knows is ours to release.
    if (!(await hasContainerRecord(stateDir, options.id))) await unmountRootfs(rootfs, log);
    log.info({ sandboxId: role.sandboxId }, 'the pod shim still runs: it owns the container');
    return result;
  }
  if (lock === 'gone') {
    await unmountRootfs(rootfs, log);
    return result;
  }
  try {
    result.removed = await cleanPod(options, role, stateDir, lock, log);
  } finally {
    await lock.release();
  }
  await unmountRootfs(rootfs, log);
  return result;
}

async function exists(p: string): Promise<boolean> {
  return fsp.access(p).then(
    () => true,
    () => false,
  );
}

/** The pod's state-dir lock, or undefined when a live shim holds it. */
async function tryLock(stateDir: string, log: Logger): Promise<StateLock | undefined> {
  try {
    return await acquireStateLock(stateDir, log);
  } catch (err) {
    if (isReason(err, 'STATE_DIR_LOCKED')) return undefined;
    throw err;
  }
}

/** How long a dead shim's VM gets to stop before it is killed. */
const DEAD_POD_STOP_MS = 3_000;

/** How long a delete waits for another delete of the same pod (containerd may run two at once). */
const OTHER_DELETE_WAIT_MS = 60_000;

/**
 * The pod's lock, for this delete. Its holder is either the pod's live shim (named by shim.json):
 * a container's delete leaves the pod to it, a sandbox's delete ends it and takes the lock; or
 * another delete of the same pod (containerd runs one per task, and again on retries): wait for
 * that one to finish and look again, the pod may be gone by then ('gone').
 */
async function lockPod(
  stateDir: string,
  role: TaskRole,
  options: DeleteOptions,
  log: Logger,
): Promise<StateLock | 'shim-owns-container' | 'gone'> {
  const deadline = Date.now() + OTHER_DELETE_WAIT_MS;
  for (;;) {
    if (!(await exists(stateDir))) return 'gone';
    const lock = await tryLock(stateDir, log);
    if (lock !== undefined) return lock;
    const holder = await lockHolderPid(stateDir);
    const shim = await readShimInfo(stateDir).catch(() => undefined);
    if (holder !== undefined && shim !== undefined && holder === shim.pid) {
      if (role.role === 'container') return 'shim-owns-container';
      if (shim.node !== undefined) await letNodeServerGo(options, shim, log);
      else await endLiveShim(stateDir, options.stopShimTimeoutMs ?? 10_000, log);
      return acquireStateLock(stateDir, log);
    }
    if (Date.now() > deadline) return acquireStateLock(stateDir, log);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function lockHolderPid(stateDir: string): Promise<number | undefined> {
  const text = await fsp.readFile(path.join(stateDir, STATE_LOCK_FILE), 'utf8').catch(() => '');
  const m = /^([0-9]+) /.exec(text);
  return m === null ? undefined : Number(m[1]);
}

/**
 * Node mode: the pod's relay is ended first (else it would revive the node server for the pod),
 * then the node server is asked to let the pod go (its other pods stay served); the pod's lock is
 * free after that.
 */
async function letNodeServerGo(options: DeleteOptions, shim: ShimInfo, log: Logger): Promise<void> {
  const node = shim.node;
  if (node === undefined) return;
  log.warn({ pid: shim.pid }, 'the node shim server still hosts the pod but containerd gave it up: letting it go');
  await endRelay(node.relayPidFile, shim.socket);
  const control = nodeServerPaths(options.loaded.config.shim.stateRoot, node.containerdAddress).control;
  await nodeRequest(
    control,
    { detach: { namespace: shim.namespace, sandboxId: shim.sandboxId } },
    options.stopShimTimeoutMs ?? 10_000,
  ).catch((err: unknown) => log.warn({ err: errorMessage(err) }, 'the node shim server did not let the pod go'));
}

/** SIGTERM the shim holding the pod's lock (named by pid and start time), SIGKILL it after `timeoutMs`. */
async function endLiveShim(stateDir: string, timeoutMs: number, log: Logger): Promise<void> {
  const text = await fsp.readFile(path.join(stateDir, STATE_LOCK_FILE), 'utf8').catch(() => '');
  const m = /^([0-9]+) ([0-9]+)/.exec(text);
  if (m === null) return;
  const pid = Number(m[1]);
  const ticks = Number(m[2]);
  log.warn({ pid }, 'the pod shim still runs but containerd gave the pod up: stopping it');
  const deadline = Date.now() + timeoutMs;
  for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
    if (!isSameLiveProcess(pid, ticks)) return;
    try {
      process.kill(pid, signal);
    } catch {
      return;
    }
    const until = signal === 'SIGTERM' ? deadline : Date.now() + 5_000;
    while (Date.now() < until && isSameLiveProcess(pid, ticks)) await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * SIGKILL every QEMU and virtiofsd the pod's sandbox records name (by pid and start time, so a
 * reused pid is never hit). Read as plain JSON: recovery, which checks records fully, follows.
 */
async function killRecordedProcesses(stateDir: string, log: Logger): Promise<void> {
  const dir = path.join(stateDir, 'sandboxes');
  const files = await fsp.readdir(dir).catch(() => [] as string[]);
  for (const file of files.filter((f) => f.endsWith('.json'))) {
    const record = (await fsp
      .readFile(path.join(dir, file), 'utf8')
      .then((text) => JSON.parse(text) as Record<string, unknown>)
      .catch(() => undefined)) as
      | { vmm?: { pid?: unknown; startTimeTicks?: unknown } | null; virtiofsd?: { pid?: unknown; startTimeTicks?: unknown } | null }
      | undefined;
    for (const proc of [record?.vmm, record?.virtiofsd]) {
      if (typeof proc?.pid !== 'number' || typeof proc.startTimeTicks !== 'number') continue;
      if (!isSameLiveProcess(proc.pid, proc.startTimeTicks)) continue;
      try {
        process.kill(proc.pid, 'SIGKILL');
        log.info({ pid: proc.pid }, "killed a process of the dead shim's pod");
      } catch {
        // gone meanwhile
      }
    }
  }
}

/** With the pod's lock held: remove the container, or the whole pod; drop the state dir once the pod is empty. */
async function cleanPod(
  options: DeleteOptions,
  role: TaskRole,
  stateDir: string,
  lock: StateLock,
  log: Logger,
): Promise<DeleteOutcome['removed']> {
  const info = await readShimInfo(stateDir).catch(() => undefined);
  // The shim is gone and the pod with it: its VMM and virtiofsd end first, before anything that
  // could be slow (composing the pod, recovery's agent reconnects) or cut short by containerd.
  if (role.role === 'sandbox') await killRecordedProcesses(stateDir, log);
  // Node mode: the pod's relay goes with it (else it would revive the node server for a pod that is gone).
  if (role.role === 'sandbox' && info?.node !== undefined) await endRelay(info.node.relayPidFile, info.socket);
  const pod = await composePod({
    loaded: options.loaded,
    stateDir,
    cgroupDriver: info?.cgroupDriver ?? null,
    logger: log,
    ...(options.facts === undefined ? {} : { facts: options.facts }),
  });
  let removed: DeleteOutcome['removed'] = 'nothing';
  try {
    await pod.recover();
    // The shim is gone and the pod with it: its VM is not owed a long graceful stop.
    const ctx = shimRequestContext(log, 'delete', { deadlineMs: Date.now() + DEAD_POD_STOP_MS });
    if (role.role === 'container') {
      if (pod.containers.list(null).some((c) => c.id === options.id)) {
        await pod.containers.remove(options.id, ctx);
        removed = 'container';
      }
    } else {
      const containers = pod.containers.inSandbox(role.sandboxId);
      for (const c of containers) await pod.containers.remove(c.id, ctx);
      const sandbox = pod.sandboxes.list(null).some((s) => s.id === role.sandboxId);
      const network = pod.sandboxes.find(role.sandboxId)?.record.network;
      if (network?.kind === 'joined') {
        // The dead shim's port-forward rule (its helper ended with it) goes with the pod.
        await removeStalePortForwardRules(network.netnsPath).catch((err: unknown) =>
          // containerd may have removed the namespace already, and the rule with it.
          log.info({ err: errorMessage(err) }, 'port-forward rule not removed'),
        );
      }
      if (sandbox) {
        await pod.sandboxes.stop(role.sandboxId, ctx);
        await pod.sandboxes.remove(role.sandboxId, ctx);
      }
      if (sandbox || containers.length > 0) removed = 'pod';
    }
  } finally {
    await pod.close();
  }
  if (pod.taskCount() === 0) {
    // Nothing may be deleted through a mount that is still there (see releaseSharedMounts).
    await releaseSharedMounts(stateDir, log);
    if (info !== undefined) await fsp.rm(info.socket, { force: true });
    await lock.release();
    await fsp.rm(stateDir, { recursive: true, force: true });
    await fsp.rmdir(path.dirname(stateDir)).catch(() => undefined);
    log.info({ stateDir }, 'pod state removed');
  }
  log.info({ removed }, 'delete done');
  return removed;
}
