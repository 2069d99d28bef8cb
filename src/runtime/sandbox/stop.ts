import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { KataConfig } from '../../config/types.js';
import type { RequestContext } from '../context.js';
import { boundedTimeoutMs } from '../deadline.js';
import type { LiveSandbox, SandboxListener } from './types.js';

/** The containers' share of a stop when the request has no (or a long) deadline. */
export const CONTAINERS_STOP_MAX_MS = 30_000;
/** DestroyPod's deadline at stop (best effort). */
const DESTROY_POD_TIMEOUT_MS = 2_000;
/** How long past its deadline sandboxStopping may run before the VM is stopped regardless. */
const STOPPING_GRACE_MS = 500;

export interface StopBudget {
  /** The VM's graceful shutdown (then quit, then SIGKILL). */
  vmMs: number;
  /** listener.sandboxStopping. */
  containersMs: number;
}

/**
 * How a stop's time is shared: the VM's shutdown gets its configured timeout (cut to the
 * request's deadline, 1 s kept for the teardown), the containers what is left before that,
 * at most CONTAINERS_STOP_MAX_MS.
 */
export function stopBudget(config: KataConfig, ctx: Pick<RequestContext, 'deadlineMs'>): StopBudget {
  const vmMs = boundedTimeoutMs(config.hypervisor.stopTimeoutMs, ctx, 1000);
  const containersMs = boundedTimeoutMs(CONTAINERS_STOP_MAX_MS, ctx, vmMs + 1000);
  return { vmMs, containersMs };
}

/** DestroyPod in the guest before the VM goes (best effort: the VM's end ends the pod anyway). */
export async function destroyGuestPod(live: LiveSandbox, log: Logger): Promise<void> {
  if (live.agent === undefined || live.record.guestPod === null) return;
  try {
    await live.agent.destroyPod(live.record.id, { timeoutMs: DESTROY_POD_TIMEOUT_MS });
  } catch (err) {
    log.warn({ err: errorMessage(err) }, 'DestroyPod failed; the VM is stopped anyway');
  }
}

/** listener.sandboxStopping, bounded by `deadlineMs`: a failure or overrun is logged, the stop goes on. */
export async function tellStopping(listener: SandboxListener, sandboxId: string, deadlineMs: number, log: Logger): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const overrun = new Promise<'overrun'>((resolve) => {
    timer = setTimeout(() => resolve('overrun'), deadlineMs + STOPPING_GRACE_MS);
  });
  try {
    const outcome = await Promise.race([listener.sandboxStopping(sandboxId, deadlineMs), overrun]);
    if (outcome === 'overrun') log.warn({ deadlineMs }, 'stopping the containers overran its deadline; stopping the VM anyway');
  } catch (err) {
    log.error({ err: errorMessage(err) }, 'stopping the containers failed; stopping the VM anyway');
  } finally {
    clearTimeout(timer);
  }
}
