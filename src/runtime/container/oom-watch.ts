/**
 * The host's side of every OOM kill in a running container: the guest tells each one as it
 * happens (its GuestEvents stream, GUEST_EVENT_KIND_OOM), whether or not it ends the container's
 * init. Events are hints that a broken session loses, so the count the guest keeps (the
 * container's memory.events oom_kill, in ContainerStats) is read at the start of each
 * subscription: kills counted while no stream was open are told then, and none twice.
 */
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { epochNs } from '../../common/time.js';
import { timestampNs } from './guest-ops.js';

/** Between two subscriptions after a broken session. */
const RESUBSCRIBE_MS = 500;
/** One stats call. */
const STATS_CALL_MS = 10_000;

export interface OomWatchOptions {
  agent: AgentClient;
  containerId: string;
  signal: AbortSignal;
  logger: Logger;
  /** Kills the host has not been told of yet were counted (`atNs`: the guest's time of the event, or now). */
  onKills(atNs: string): Promise<void> | void;
}

/** Runs until `signal` aborts; never rejects. */
export async function watchContainerOoms(options: OomWatchOptions): Promise<void> {
  const { agent, containerId, signal, logger } = options;
  // The count when the watch began is what was told before it (by an earlier daemon, or nothing
  // for a new container); null until a read succeeds.
  let seen: number | null = null;
  const count = async (): Promise<number | null> => {
    try {
      const [entry] = await agent.containerStats([containerId], { timeoutMs: STATS_CALL_MS, signal });
      return entry?.memory?.oomKills ?? null;
    } catch {
      return null;
    }
  };
  const catchUp = async (): Promise<void> => {
    const now = await count();
    if (now === null) return;
    if (seen !== null && now > seen) await options.onKills(epochNs().toString());
    seen = now;
  };
  while (!signal.aborted) {
    try {
      const events = agent.guestEvents({ signal })[Symbol.asyncIterator]();
      // The subscription goes out first (the first next() sends it), then the count is read: a
      // kill between the two is in both and told once (the event's catch-up finds it counted).
      // A pending read may reject while this loop awaits something else (the session broke, the
      // watch was stopped): it is awaited in its turn, and never left unhandled meanwhile.
      const read = () => {
        const p = events.next();
        p.catch(() => undefined);
        return p;
      };
      let next = read();
      await catchUp();
      for (let r = await next; r.done !== true; r = await next) {
        const e = r.value;
        next = read();
        if (e.kind !== 'GUEST_EVENT_KIND_OOM' || e.containerId !== containerId) continue;
        const now = await count();
        // Already told by the catch-up (it came in the window above): nothing new.
        if (now !== null && seen !== null && now <= seen) continue;
        await options.onKills(timestampNs(e.at));
        if (now !== null) seen = now;
      }
    } catch (err) {
      if (signal.aborted) return;
      logger.debug({ err: errorMessage(err) }, 'the guest event stream broke; subscribing again');
    }
    await new Promise((resolve) => setTimeout(resolve, RESUBSCRIBE_MS).unref());
  }
}
