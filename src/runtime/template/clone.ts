/**
 * A clone made ready to serve (docs/templates.md, "Reseed after restore"): restored from its
 * template (src/hypervisor/template-execute.ts startClone), its agent dialled, then reseeded:
 * fresh host entropy credited to the guest kernel's pool and its CRNG reseeded, and its wall
 * clock set from the host's. Until then every clone of one template holds the template's random
 * state (the same CRNG key: the same "random" bytes in every clone) and the template's clock, so
 * nothing reports a clone ready before the reseed answered and was checked.
 */
import { randomBytes } from 'node:crypto';
import { AgentClient } from '../../agent-client/index.js';
import { errorMessage, unavailable } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { ReseedGuestResponse, Timestamp } from '../../generated/agent/agent.js';
import type { VmProcess } from '../../hypervisor/launcher.js';
import { type StartCloneOptions, startClone } from '../../hypervisor/template-execute.js';
import './reasons.js';

/** Host entropy sent per reseed: twice the CRNG's 256-bit key. */
export const RESEED_ENTROPY_BYTES = 64;
/** A guest clock read back this far past the host's clock at the answer is not the one set. */
const CLOCK_AFTER_SLACK_MS = 60_000;

/** The request: fresh bytes and the host's clock now (pure apart from the two sources given). */
export function planReseed(nowMs: number, entropy: Uint8Array): { entropy: Uint8Array; hostTime: Timestamp } {
  return { entropy, hostTime: { seconds: Math.floor(nowMs / 1000), nanos: (nowMs % 1000) * 1_000_000 } };
}

function timestampMs(t: Timestamp | null): number {
  return t === null ? Number.NaN : t.seconds * 1000 + t.nanos / 1e6;
}

/**
 * Checks the guest's answer: its clock, read after the set, lies between the time sent and the
 * answer's arrival (plus slack for a guest clock that runs a little fast), and it sampled its
 * CRNG. Throws TEMPLATE_RESEED_FAILED naming what is off. Pure.
 */
export function checkReseedAnswer(answer: ReseedGuestResponse, sentMs: number, receivedMs: number): void {
  const afterMs = timestampMs(answer.guestTimeAfter);
  // The sent time is whole milliseconds; the guest's read after the set cannot be earlier.
  if (!(afterMs >= Math.floor(sentMs) && afterMs <= receivedMs + CLOCK_AFTER_SLACK_MS)) {
    throw unavailable(
      'TEMPLATE_RESEED_FAILED',
      `the clone's clock reads ${afterMs} ms after the reseed, not between the host's ${sentMs} and ${receivedMs} ms: it was not set.`,
    );
  }
  if (answer.urandomSample.length === 0) {
    throw unavailable('TEMPLATE_RESEED_FAILED', 'the clone returned no urandom sample after the reseed.');
  }
}

export interface ReseedResult {
  answer: ReseedGuestResponse;
  /** How far the clone's clock was behind the host's before it was set (ms). */
  clockBehindMs: number;
  /** The host's clock when the request was planned and when the answer came. */
  sentMs: number;
  receivedMs: number;
}

/** Reseeds a restored clone through its agent and checks the answer. */
export async function reseedClone(agent: AgentClient, timeoutMs: number, signal?: AbortSignal): Promise<ReseedResult> {
  const sentMs = Date.now();
  const request = planReseed(sentMs, randomBytes(RESEED_ENTROPY_BYTES));
  let answer: ReseedGuestResponse;
  try {
    // Through the connection's own admission (the API features of the session's version) and rpc.
    await agent.connection.ready(timeoutMs, signal);
    agent.connection.admit('ReseedGuest', request);
    answer = await agent.connection.rpc.unary('ReseedGuest', request, { timeoutMs, ...(signal === undefined ? {} : { signal }) });
  } catch (err) {
    throw unavailable('TEMPLATE_RESEED_FAILED', `the clone's agent did not reseed the guest: ${errorMessage(err)}.`, { cause: err });
  }
  const receivedMs = Date.now();
  checkReseedAnswer(answer, sentMs, receivedMs);
  return { answer, clockBehindMs: sentMs - timestampMs(answer.guestTimeBefore), sentMs, receivedMs };
}

export interface ReadyCloneOptions extends StartCloneOptions {
  /** The daemon's version, for Hello. */
  hostVersion: string;
  /** Bound for the agent's first answer and for the reseed. */
  agentTimeoutMs: number;
  signal?: AbortSignal;
}

export interface ReadyClone {
  vm: VmProcess;
  agent: AgentClient;
  agentSocket: string;
  /** startClone: verify, QEMU, restore, cont. */
  restoreMs: number;
  /** From the start to the reseed checked: the clone may serve a pod from here. */
  readyMs: number;
  reseed: ReseedResult;
}

/**
 * Restore a clone, dial its agent and reseed it. On any failure the agent connection is closed
 * and the clone's QEMU killed (its work dir is the caller's), and the error is rethrown.
 */
export async function startReadyClone(options: ReadyCloneOptions, log: Logger): Promise<ReadyClone> {
  const started = Date.now();
  const { vm, agentSocket, restoreMs } = await startClone(options);
  let agent: AgentClient | undefined;
  try {
    agent = await AgentClient.connect(
      { socketPath: agentSocket, logger: log, hostVersion: options.hostVersion },
      options.agentTimeoutMs,
      options.signal,
    );
    const reseed = await reseedClone(agent, options.agentTimeoutMs, options.signal);
    const readyMs = Date.now() - started;
    log.info({ name: options.name, restoreMs, readyMs, clockBehindMs: reseed.clockBehindMs }, 'clone restored and reseeded');
    return { vm, agent, agentSocket, restoreMs, readyMs, reseed };
  } catch (err) {
    agent?.close();
    await vm.kill().catch(() => undefined);
    throw err;
  }
}
