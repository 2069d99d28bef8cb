import type { Init, MethodsOfKind } from '../channel/index.js';
import type { AgentMethods } from '../generated/agent/agent.js';

/** The agent's unary calls (the ones AgentClient may send again). */
export type AgentUnaryMethod = MethodsOfKind<AgentMethods, 'unary'>;

/**
 * Signals whose second delivery a process cannot tell from the first: SIGKILL and SIGSTOP cannot
 * be caught, a second SIGCONT continues what already runs, and 0 only checks that the target
 * exists. A catchable signal (SIGTERM, SIGINT, SIGHUP, ...) is left out: a program may count it
 * (Go's signal.NotifyContext lets a second SIGTERM kill at once, skipping the graceful shutdown
 * the first one started), so sending it twice is not the same as sending it once.
 */
export const REPEATABLE_SIGNALS: ReadonlySet<number> = new Set([0, 9, 18, 19]);

type Rule<K extends AgentUnaryMethod> = boolean | ((request: Init<AgentMethods[K]['request']>) => boolean);

/**
 * Whether a unary call may be sent again when the session it was in flight on ended before its
 * answer came (so the agent may or may not have acted on it). Every unary call is named, so a new
 * one does not compile until it is classified (ReseedGuest is not sent again: the same entropy
 * credited twice would count as fresh twice):
 * - reads (facts, lists, stats, a path's stat, a TPM quote) change nothing;
 * - waits for an exit answer the same exit again (the agent keeps it until the delete);
 * - pause, resume, an update to absolute limits, an acknowledged output offset, a terminal's size,
 *   CreatePod and ConfigureNetwork (which the agent answers as done when they already are) leave
 *   the guest as one call would;
 * - a signal only when its repetition cannot be seen (REPEATABLE_SIGNALS);
 * - creating or starting a container, starting an exec, deleting (a second delete of a deleted
 *   container answers NOT_FOUND, which would misreport a delete that worked) and DestroyPod are
 *   not: they fail with AGENT_SESSION_ENDED and the caller decides.
 */
const RETRY_RULES: { readonly [K in AgentUnaryMethod]: Rule<K> } = {
  Hello: false,
  GetGuestFacts: true,
  CreateContainer: false,
  StartContainer: false,
  SignalContainer: (r) => REPEATABLE_SIGNALS.has(r.signal ?? 0),
  PauseContainer: true,
  ResumeContainer: true,
  UpdateContainer: true,
  WaitContainer: true,
  DeleteContainer: false,
  ListContainers: true,
  ContainerStats: true,
  GuestStats: true,
  AckOutput: true,
  ExecProcess: false,
  SignalProcess: (r) => REPEATABLE_SIGNALS.has(r.signal ?? 0),
  ResizeTty: true,
  WaitProcess: true,
  DeleteProcess: false,
  CreatePod: true,
  DestroyPod: false,
  StatSharedPath: true,
  ConfigureNetwork: true,
  GetTpmQuote: true,
  ReseedGuest: false,
};

/** True when `method` with `request` may be sent once more on a new session (see RETRY_RULES). */
export function retryableAfterSessionEnd<K extends AgentUnaryMethod>(method: K, request: Init<AgentMethods[K]['request']>): boolean {
  const rule = RETRY_RULES[method] as Rule<K>;
  return typeof rule === 'boolean' ? rule : rule(request);
}
