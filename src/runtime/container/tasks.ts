/**
 * The background work of running containers: each has a log pump (agent output -> CRI log) and an
 * exit watch (WaitContainer across sessions). Both survive broken sessions; after a daemon restart
 * `attach` starts them again from the stored log state and the agent's own record of the exit.
 */
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage, isKataError } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { ExitStatus } from '../../generated/agent/agent.js';
import { waitForExit } from './guest-ops.js';
import { OutputPump } from './output.js';
import type { ContainerRecord } from './record.js';

/** How long RemoveContainer waits for the rest of the output before the agent drops it. */
const DRAIN_TIMEOUT_MS = 10_000;

interface Watch {
  abort: AbortController;
  /** Settles with the exit, or undefined when the watch was stopped or the agent lost the container. */
  exited: Promise<ExitStatus | undefined>;
  pump: OutputPump;
}

export interface ContainerTasksDeps {
  stateDir: string;
  logger: Logger;
  /** Called once per container when the agent reports its exit. */
  onExit(containerId: string, exit: ExitStatus): Promise<void>;
  /** Called when the agent does not know the container (it was lost with the guest). */
  onLost(containerId: string): Promise<void>;
}

export class ContainerTasks {
  private readonly watches = new Map<string, Watch>();

  constructor(private readonly deps: ContainerTasksDeps) {}

  /** Where a container's log resume state lives. */
  logStatePath(containerId: string): string {
    return path.join(this.deps.stateDir, 'logs', `${containerId}.json`);
  }

  /** Start pumping the output and watching the exit (idempotent). */
  attach(record: ContainerRecord, agent: AgentClient): void {
    if (this.watches.has(record.id)) return;
    const logger = this.deps.logger.child({ containerId: record.id });
    const abort = new AbortController();
    const pump = OutputPump.start({
      agent,
      containerId: record.id,
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
    this.watches.set(record.id, { abort, exited, pump });
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

  /** Stop both tasks (the container is removed, its VM gone, or the daemon closes). */
  async detach(containerId: string): Promise<void> {
    const watch = this.watches.get(containerId);
    if (watch === undefined) return;
    this.watches.delete(containerId);
    watch.abort.abort();
    await watch.pump.stop();
  }

  async detachAll(): Promise<void> {
    await Promise.all([...this.watches.keys()].map((id) => this.detach(id)));
  }
}
