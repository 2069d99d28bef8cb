/**
 * Pause and resume of a whole pod (issue 35): its running containers frozen by the guest's
 * freezer, then its VM's vCPUs stopped (QMP `stop`), so the pod keeps every byte of its memory
 * and spends no CPU; resume undoes both in the other order. The state is in the sandbox record
 * (`paused`), written before the VM is stopped, so that a daemon or shim that restarts finds the
 * pod paused (see recoverPausedVm) and never takes its stopped VM for a dead one.
 *
 * While a pod is paused its agent connection is held (AgentConnection.hold): every call that
 * needs the guest (exec, create/start container, stats, port-forward) is refused at once with
 * FAILED_PRECONDITION SANDBOX_PAUSED naming the pod, instead of waiting out its deadline on a
 * guest that cannot run, and the keepalive does not end the session of a guest that is only
 * stopped.
 */
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage, type KataError, precondition, unavailable } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { VmProcess } from '../../hypervisor/index.js';
import type { RequestContext } from '../context.js';
import { nowNs, type SandboxPausedRecord, type SandboxRecord } from './record.js';
import type { SandboxAccess, SandboxHandle } from './types.js';

/**
 * One freeze or thaw of a container in the guest: the agent runs the OCI runtime's pause, and the
 * freezer waits until every task is frozen. A TCG guest on a loaded host gets a sliver of a CPU
 * (a 30 s bound was overrun once with the host's load average at 60), so the bound is wide.
 */
const FREEZE_CALL_MS = 120_000;
/** One QMP `stop` or `cont`: QEMU answers at once; the bound only covers a QEMU that hangs. */
const QMP_CALL_MS = 10_000;

/** What pause needs besides the sandbox: the pod's containers as the container layer knows them. */
export interface PodPauseDeps {
  sandboxes: Pick<SandboxAccess, 'withSandbox'>;
  /** The pod's containers (any state); pause freezes those in CONTAINER_RUNNING. */
  containers: { inSandbox(sandboxId: string): ReadonlyArray<{ id: string; state: string }> };
}

/** What a pause or resume did: `changed` false when the pod already was in that state (idempotent). */
export interface PauseOutcome {
  sandboxId: string;
  changed: boolean;
}

/**
 * The error every call that needs a paused pod's guest gets, at once: FAILED_PRECONDITION
 * SANDBOX_PAUSED naming the pod.
 */
export function sandboxPausedError(sandboxId: string): KataError {
  return precondition('SANDBOX_PAUSED', `pod sandbox ${sandboxId} is paused; resume it first`, { details: { sandboxId } });
}

/**
 * Pause pod `idOrPrefix` under its lock: freeze each running container in the guest, record the
 * pause, hold the agent connection, stop the vCPUs. Idempotent (a paused pod: changed false). A
 * pod that is not running is FAILED_PRECONDITION SANDBOX_NOT_RUNNING; a step that fails undoes
 * the steps before it (the VM runs, the containers are thawed, the record says not paused) and
 * the error says which step failed.
 */
export function pausePod(deps: PodPauseDeps, idOrPrefix: string, ctx: RequestContext): Promise<PauseOutcome> {
  return deps.sandboxes.withSandbox(idOrPrefix, async (sandbox) => {
    const id = sandbox.record.id;
    ctx.annotate({ sandboxId: id });
    if (sandbox.record.paused != null) return { sandboxId: id, changed: false };
    const { vm, agent } = runningParts(sandbox, 'paused');
    const running = deps.containers
      .inSandbox(id)
      .filter((c) => c.state === 'CONTAINER_RUNNING')
      .map((c) => c.id);
    const log = ctx.logger.child({ sandboxId: id });
    const frozen: string[] = [];
    try {
      for (const containerId of running) {
        await agent.pauseContainer(containerId, { timeoutMs: FREEZE_CALL_MS });
        frozen.push(containerId);
      }
    } catch (err) {
      await thaw(agent, frozen, log);
      throw unavailable(
        'SANDBOX_PAUSE_FAILED',
        `pod sandbox ${id}: freezing container ${running[frozen.length]} failed (${errorMessage(err)}); nothing is paused`,
        {
          cause: err,
        },
      );
    }
    // Recorded before the vCPUs stop: a restart in between finds a pod meant to be paused and
    // stops it (recoverPausedVm), rather than a stopped VM with no record of why.
    const paused: SandboxPausedRecord = { atNs: nowNs(), frozenContainers: frozen };
    sandbox.record.paused = paused;
    try {
      await sandbox.persist();
      agent.connection.hold(() => sandboxPausedError(id));
      await vm.qmp.stop({ timeoutMs: QMP_CALL_MS });
    } catch (err) {
      agent.connection.hold(undefined);
      sandbox.record.paused = null;
      await sandbox.persist().catch((e: unknown) => log.error({ err: errorMessage(e) }, 'recording the failed pause failed'));
      await thaw(agent, frozen, log);
      throw unavailable(
        'SANDBOX_PAUSE_FAILED',
        `pod sandbox ${id}: stopping its VM failed (${errorMessage(err)}); its containers were thawed`,
        { cause: err },
      );
    }
    log.info({ containers: frozen.length, pid: vm.pid }, 'pod paused: containers frozen, vCPUs stopped');
    return { sandboxId: id, changed: true };
  });
}

/**
 * Resume pod `idOrPrefix` under its lock: restart the vCPUs (QMP `cont`), release the agent
 * connection, thaw the containers pause froze, clear the record. Idempotent (a pod not paused:
 * changed false). A failed `cont` leaves the pod paused as it was (SANDBOX_RESUME_FAILED); a
 * container that cannot be thawed (it may have been removed meanwhile) is logged, not fatal.
 */
export function resumePod(deps: Pick<PodPauseDeps, 'sandboxes'>, idOrPrefix: string, ctx: RequestContext): Promise<PauseOutcome> {
  return deps.sandboxes.withSandbox(idOrPrefix, async (sandbox) => {
    const id = sandbox.record.id;
    ctx.annotate({ sandboxId: id });
    const paused = sandbox.record.paused;
    if (paused == null) return { sandboxId: id, changed: false };
    const { vm, agent } = runningParts(sandbox, 'resumed');
    try {
      await vm.qmp.cont({ timeoutMs: QMP_CALL_MS });
    } catch (err) {
      throw unavailable(
        'SANDBOX_RESUME_FAILED',
        `pod sandbox ${id}: restarting its VM's vCPUs failed (${errorMessage(err)}); the pod stays paused`,
        {
          cause: err,
        },
      );
    }
    const log = ctx.logger.child({ sandboxId: id });
    agent.connection.hold(undefined);
    await thaw(agent, paused.frozenContainers, log);
    sandbox.record.paused = null;
    await sandbox.persist();
    log.info({ containers: paused.frozenContainers.length, pid: vm.pid }, 'pod resumed: vCPUs running, containers thawed');
    return { sandboxId: id, changed: true };
  });
}

/**
 * StopPodSandbox of a paused pod (under its lock, before the containers are stopped): resume
 * it, so that its containers stop with their own signals and timeouts and the guest can power
 * off. When the vCPUs cannot be restarted the pod stays held (container stops are refused at
 * once) and the stop's shutdown ends QEMU by `quit` or SIGKILL, as it does any VM that does not
 * power off. The record says not paused either way: the VM is going.
 */
export async function resumeBeforeStop(
  live: { record: SandboxRecord; vm: VmProcess | undefined; agent: AgentClient | undefined },
  persist: () => Promise<void>,
  log: Logger,
): Promise<void> {
  const paused = live.record.paused;
  if (paused == null) return;
  if (live.vm !== undefined && live.vm.exitInfo === undefined) {
    try {
      await live.vm.qmp.cont({ timeoutMs: QMP_CALL_MS });
      live.agent?.connection.hold(undefined);
      if (live.agent !== undefined) await thaw(live.agent, paused.frozenContainers, log);
      log.info('paused pod resumed for its stop');
    } catch (err) {
      log.warn({ err: errorMessage(err) }, 'a paused pod could not be resumed for its stop; its VM will be ended');
    }
  }
  live.record.paused = null;
  await persist();
}

/**
 * Recovery of a paused pod's VM (re-attached after a restart): it stays paused, READY. A VM found
 * running although its record says paused (the restart came between recording the pause and
 * `stop`, or between `cont` and clearing the record) is stopped again, so the record stays
 * true; resume then thaws what the record lists. Returns true when the VM is paused as recorded,
 * false when it is neither running nor paused (shut down, panicked: not a pod that serves).
 */
export async function recoverPausedVm(record: SandboxRecord, vm: VmProcess, status: string, log: Logger): Promise<boolean> {
  if (status === 'running') {
    await vm.qmp.stop({ timeoutMs: QMP_CALL_MS });
    log.warn({ pid: vm.pid }, 'the record says paused but the VM ran: stopped it again');
    return true;
  }
  if (status === 'paused') {
    log.info({ pid: vm.pid, since: record.paused?.atNs }, 'VM re-attached, paused as recorded');
    return true;
  }
  return false;
}

/** The refusal a re-attached paused pod's agent connection is held with (see AgentConnection.hold). */
export function pausedHold(record: SandboxRecord): (() => KataError) | undefined {
  return record.paused == null ? undefined : () => sandboxPausedError(record.id);
}

/** The VM and agent of a pod that can be paused or resumed, or FAILED_PRECONDITION SANDBOX_NOT_RUNNING. */
function runningParts(sandbox: SandboxHandle, verb: 'paused' | 'resumed'): { vm: VmProcess; agent: AgentClient } {
  const { record, vm, agent } = sandbox;
  if (
    record.phase !== 'running' ||
    record.state !== 'SANDBOX_READY' ||
    vm === undefined ||
    vm.exitInfo !== undefined ||
    agent === undefined
  ) {
    throw precondition('SANDBOX_NOT_RUNNING', `pod sandbox ${record.id} is not running; only a running pod can be ${verb}`, {
      details: { sandboxId: record.id },
    });
  }
  return { vm, agent };
}

/** Thaw each container (best effort: one removed meanwhile, or a guest that fails, is logged). */
async function thaw(agent: AgentClient, containerIds: readonly string[], log: Logger): Promise<void> {
  for (const containerId of containerIds) {
    await agent
      .resumeContainer(containerId, { timeoutMs: FREEZE_CALL_MS })
      .catch((err: unknown) => log.warn({ containerId, err: errorMessage(err) }, 'thawing a container failed'));
  }
}
