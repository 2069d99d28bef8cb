/**
 * The background work of running containers: each has an output pump (agent output -> CRI log,
 * or the caller's FIFOs), an exit watch (WaitContainer across sessions), an OOM watch (every kill
 * the guest tells) and, for a caller's stdin FIFO, the stdin forwarding. They survive broken sessions; after a daemon restart `attach` starts
 * them again from the stored log state (or the agent's acknowledged offset) and the agent's own
 * record of the exit.
 */
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage, isKataError } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { ExitStatus } from '../../generated/agent/agent.js';
import { FifoStdin } from './fifo-stdin.js';
import { waitForExit } from './guest-ops.js';
import { watchContainerOoms } from './oom-watch.js';
import { OutputPump } from './output.js';
import type { ContainerRecord } from './record.js';

/** How long RemoveContainer waits for the rest of the output before the agent drops it. */
const DRAIN_TIMEOUT_MS = 10_000;

interface Watch {
  abort: AbortController;
  /** Settles with the exit, or undefined when the watch was stopped or the agent lost the container. */
  exited: Promise<ExitStatus | undefined>;
  pump: OutputPump;
  /** The caller's stdin FIFO into the container's stdin, when it has one. */
  stdin: FifoStdin | undefined;
}

export interface ContainerTasksDeps {
  stateDir: string;
  logger: Logger;
  /** Called once per container when the agent reports its exit. */
  onExit(containerId: string, exit: ExitStatus): Promise<void>;
  /** Called when the agent does not know the container (it was lost with the guest). */
  onLost(containerId: string): Promise<void>;
  /** Called for OOM kills in the running container (each new count the guest tells; see oom-watch.ts). */
  onOom(containerId: string, atNs: string): Promise<void>;
}

export class ContainerTasks {
  private readonly watches = new Map<string, Watch>();

  constructor(private readonly deps: ContainerTasksDeps) {}

  /** Where a container's log resume state lives. */
  logStatePath(containerId: string): string {
    return path.join(this.deps.stateDir, 'logs', `${containerId}.json`);
  }

  /** Start pumping the output, forwarding a stdin FIFO and watching the exit (idempotent). */
  attach(record: ContainerRecord, agent: AgentClient): void {
    if (this.watches.has(record.id)) return;
    const logger = this.deps.logger.child({ containerId: record.id });
    const abort = new AbortController();
    const { stdio } = record;
    const stdin =
      stdio.kind === 'fifo' && stdio.stdin !== ''
        ? FifoStdin.start({ agent, containerId: record.id, fifo: stdio.stdin, logger })
        : undefined;
    const pump = OutputPump.start({
      agent,
      containerId: record.id,
      stdio,
      logPath: record.logPath,
      statePath: this.logStatePath(record.id),
      tty: record.spec.tty,
      logger,
    });
    const exited = waitForExit(agent, record.id, abort.signal).then(
      async (exit) => {
        await this.deps
          .onExit(record.id, exit)
          .catch((err: unknown) => logger.error({ err: errorMessage(err) }, 'recording the exit failed'));
        return exit;
      },
      async (err: unknown) => {
        if (abort.signal.aborted) return undefined;
        if (isKataError(err) && err.kind === 'not_found') await this.deps.onLost(record.id).catch(() => undefined);
        else logger.error({ err: errorMessage(err) }, 'watching the container exit failed');
        return undefined;
      },
    );
    void watchContainerOoms({
      agent,
      containerId: record.id,
      signal: abort.signal,
      logger,
      onKills: (atNs) =>
        this.deps.onOom(record.id, atNs).catch((err: unknown) => logger.error({ err: errorMessage(err) }, 'recording an OOM kill failed')),
    });
    this.watches.set(record.id, { abort, exited, pump, stdin });
  }

  /** Resolves when the container has exited (and the exit is recorded), or at once without a watch. */
  exited(containerId: string): Promise<unknown> {
    return this.watches.get(containerId)?.exited ?? Promise.resolve();
  }

  /** Wait (bounded) until the output's end is stored: before DeleteContainer drops the agent's buffer. */
  async drain(containerId: string, timeoutMs = DRAIN_TIMEOUT_MS): Promise<void> {
    const watch = this.watches.get(containerId);
    if (watch === undefined) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([watch.pump.done, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
  }

  async reopenLog(containerId: string): Promise<boolean> {
    const watch = this.watches.get(containerId);
    if (watch === undefined) return false;
    await watch.pump.reopen();
    return true;
  }

  /** CloseIO: the container's stdin closes once what its FIFO gave went in; false without a stdin FIFO watched. */
  closeStdin(containerId: string): boolean {
    const stdin = this.watches.get(containerId)?.stdin;
    if (stdin === undefined) return false;
    stdin.close();
    return true;
  }

  /** Stop the tasks (the container is removed, its VM gone, or the daemon closes). */
  async detach(containerId: string): Promise<void> {
    const watch = this.watches.get(containerId);
    if (watch === undefined) return;
    this.watches.delete(containerId);
    watch.abort.abort();
    await Promise.all([watch.pump.stop(), watch.stdin?.stop()]);
  }

  async detachAll(): Promise<void> {
    await Promise.all([...this.watches.keys()].map((id) => this.detach(id)));
  }
}
