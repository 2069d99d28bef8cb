import type { Duplex } from 'node:stream';
import { connectSession, protobufCodec, RpcClient, type Session } from '../channel/index.js';
import { cancelled, errorMessage, exhausted, isReason, type KataError, timedOut, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { connectUnixNoFollow } from '../common/nofollow.js';
import { AGENT_API_VERSION, AGENT_DESCRIPTOR, AGENT_METHODS, type AgentMethods, type HelloResponse } from '../generated/agent/agent.js';
import { checkApiFeatures, missingFeatures, negotiateApiVersion } from './api-features.js';

export interface AgentConnectionOptions {
  /** QEMU's `-chardev socket,server=on` path for the org.kata-ts.agent port. */
  socketPath: string;
  logger: Logger;
  /** This daemon's version, told to the agent. */
  hostVersion: string;
  /** One handshake attempt (HELLO and the Hello call) may take this long. */
  handshakeTimeoutMs?: number;
  /** Wait between reconnect attempts, doubling up to maxBackoffMs. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * A PING this often (AGENT_KEEPALIVE_DEFAULTS.intervalMs by default; 0: never), each answered
   * within the same time or counted as missed: a guest that hangs (or an agent that died without
   * a successor) ends the session, so the connection starts over instead of waiting on a dead
   * peer (calls in flight are sent again when they may be: see AgentClient).
   */
  keepaliveIntervalMs?: number;
  /**
   * Unanswered PINGs in a row that end the session (AGENT_KEEPALIVE_DEFAULTS.misses by default):
   * a loaded TCG host can leave a healthy guest unscheduled longer than one interval.
   */
  keepaliveMisses?: number;
  /** How to reach the agent; a unix socket connection by default (tests pass pairs). */
  dial?: () => Duplex;
  /** Protocol violations in a row that end the connection (AGENT_PROTOCOL_VIOLATIONS_MAX). */
  maxProtocolViolations?: number;
  /** Bytes accepted before a HELLO_ACK (the channel's HELLO_FLOOD_MAX_BYTES); tests pass less. */
  helloFloodMaxBytes?: number;
}

/**
 * Channel protocol violations in a row (no Hello completed between them) after which the host
 * stops reconnecting and the connection ends with AGENT_PROTOCOL_VIOLATION: a guest that writes
 * what is not the channel's framing (CHANNEL_DESYNC), floods before answering HELLO
 * (CHANNEL_HELLO_FLOOD) or queues answers it never reads (CHANNEL_CONTROL_FLOOD) would otherwise
 * keep the host re-dialling forever. An honest agent can break framing once (it died in the middle
 * of a frame and its successor's announcement follows), never three times without a Hello.
 */
export const AGENT_PROTOCOL_VIOLATIONS_MAX = 3;

/**
 * The channel's error that says the peer broke the protocol (not that it was slow or gone), also
 * as the cause of a failed Hello (the session broke while it was being asked); undefined if none.
 */
function violationOf(err: unknown): KataError | undefined {
  for (let e = err, depth = 0; e !== undefined && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    if (isReason(e, 'CHANNEL_DESYNC', 'CHANNEL_HELLO_FLOOD', 'CHANNEL_CONTROL_FLOOD')) return e;
    if (typeof e !== 'object' || e === null) return undefined;
  }
  return undefined;
}

export const codec = protobufCodec(AGENT_DESCRIPTOR);

/**
 * The keepalive when nothing is configured: a PING every 10 s, and three unanswered in a row end
 * the session. One was too few: in a burst of 8 pods booting under TCG on 2 cores (the density
 * bench, load 20), healthy guests went unscheduled past one interval, and 5 of 8 StartContainer
 * calls failed with their session (not idempotent: never sent twice).
 */
export const AGENT_KEEPALIVE_DEFAULTS = { intervalMs: 10_000, misses: 3 } as const;

/**
 * A session with the agent that comes back by itself: when the link drops (the guest agent
 * restarted, QEMU's socket closed, framing broke), it dials again with backoff, says HELLO and
 * Hello, and tells its listeners so they can resynchronise (list containers, resume output at
 * their stored offsets). Calls wait for a session within their own deadline.
 */
export class AgentConnection {
  readonly rpc: RpcClient<AgentMethods>;
  private session: Session | undefined;
  private helloValue: HelloResponse | undefined;
  private closedFlag = false;
  /** The current session finished Hello and passed the version check. */
  private live = false;
  private readonly waiters = new Set<() => void>();
  private readonly sessionListeners = new Set<(hello: HelloResponse) => void>();
  private loop: Promise<void> | undefined;
  /** Why the latest attempt failed, for the error of a caller that gave up waiting. */
  private lastError: unknown;
  /** Reasons of the protocol violations since the last completed Hello. */
  private violationsInARow: string[] = [];
  /** Set when the connection ended because the agent broke the protocol too often. */
  private violationError: KataError | undefined;
  private readonly violationListeners = new Set<(err: KataError) => void>();
  /** While set (see hold): why every call is refused at once. */
  private heldBy: (() => KataError) | undefined;
  /** Woken when the hold is released or the connection closes (the dial loop waits on it). */
  private readonly unholdWaiters = new Set<() => void>();

  constructor(private readonly options: AgentConnectionOptions) {
    this.rpc = new RpcClient<AgentMethods>(
      () => {
        if (this.session === undefined || this.session.closed) throw unavailable('AGENT_NOT_CONNECTED', 'the agent is not connected.');
        return this.session;
      },
      AGENT_METHODS,
      codec,
    );
  }

  /** The agent's answer to the latest Hello. */
  get hello(): HelloResponse | undefined {
    return this.helloValue;
  }

  /**
   * The API version of the latest session (the agent's, current or one back: see
   * api-features.ts); undefined before the first Hello.
   */
  get apiVersion(): number | undefined {
    return this.helloValue?.apiVersion;
  }

  /**
   * Refuses (AGENT_API_FEATURE_MISSING) a call that uses what the agent's API lacks, before it
   * is sent: an older agent would drop an unknown field without a word. Before the first Hello
   * nothing is known and nothing is refused (the client's calls wait for Hello first).
   */
  admit(method: keyof AgentMethods, request: unknown): void {
    if (this.heldBy !== undefined) throw this.heldBy();
    const version = this.apiVersion;
    if (version !== undefined) checkApiFeatures(version, method, request);
  }

  /** The logger the connection was given (the client logs its retries there). */
  get logger(): Logger {
    return this.options.logger;
  }

  /** The session calls are sent on now (undefined between sessions): AgentClient tells by it whether a call's session ended. */
  get currentSession(): Session | undefined {
    return this.session;
  }

  get connected(): boolean {
    return this.live && this.session !== undefined && !this.session.closed;
  }

  /** Start connecting (and reconnecting); resolves at the first session or rejects at the deadline. */
  async start(timeoutMs: number, signal?: AbortSignal): Promise<HelloResponse> {
    this.loop ??= this.run();
    await this.ready(timeoutMs, signal);
    return this.helloValue!;
  }

  /** Called with every new session's Hello answer (the first one included). */
  onSession(listener: (hello: HelloResponse) => void): () => void {
    this.sessionListeners.add(listener);
    return () => this.sessionListeners.delete(listener);
  }

  /**
   * Called once if the connection ends because the agent broke the channel protocol
   * AGENT_PROTOCOL_VIOLATIONS_MAX times in a row (at once when it already has): its owner fails
   * the VM, as it does for the ready port's and QMP's bounds.
   */
  onViolation(listener: (err: KataError) => void): () => void {
    if (this.violationError !== undefined) {
      listener(this.violationError);
      return () => {};
    }
    this.violationListeners.add(listener);
    return () => this.violationListeners.delete(listener);
  }

  /**
   * Hold the connection while the guest cannot run (its VM's vCPUs are stopped: a paused pod):
   * every call is refused at once with `refusal()` instead of waiting on a guest that cannot
   * answer, no PING is sent and a failed one does not end the session (a stopped guest is not a
   * hung one), and no new session is dialled (its HELLO would only queue in the stopped guest's
   * port). undefined releases the hold: calls, pings and dialling go on as before.
   */
  hold(refusal: (() => KataError) | undefined): void {
    this.heldBy = refusal;
    if (refusal === undefined) for (const w of [...this.unholdWaiters]) w();
  }

  /** True while hold() refuses calls. */
  get held(): boolean {
    return this.heldBy !== undefined;
  }

  /** Resolves once no hold is in place (or the connection closed). */
  private unheld(): Promise<void> {
    if (this.heldBy === undefined || this.closedFlag) return Promise.resolve();
    return new Promise((resolve) => {
      const wake = (): void => {
        this.unholdWaiters.delete(wake);
        resolve();
      };
      this.unholdWaiters.add(wake);
    });
  }

  /** Wait for a live session, at most `timeoutMs`. */
  ready(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if (this.heldBy !== undefined) return Promise.reject(this.heldBy());
    if (this.connected) return Promise.resolve();
    if (this.closedFlag) return Promise.reject(this.closedError());
    return new Promise((resolve, reject) => {
      const finish = (err?: Error): void => {
        clearTimeout(timer);
        this.waiters.delete(wake);
        signal?.removeEventListener('abort', onAbort);
        if (err) reject(err);
        else resolve();
      };
      const wake = (): void => finish(this.connected ? undefined : this.closedError());
      const onAbort = (): void => finish(cancelled('AGENT_CALL_CANCELLED', 'the call was cancelled while waiting for the agent.'));
      const timer = setTimeout(
        () => finish(timedOut('AGENT_NOT_CONNECTED', `the agent did not connect within ${timeoutMs} ms.`, { cause: this.lastError })),
        timeoutMs,
      );
      this.waiters.add(wake);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  close(): void {
    this.closedFlag = true;
    this.session?.close(unavailable('AGENT_CLIENT_CLOSED', 'the agent client is closed.'));
    for (const w of [...this.waiters]) w();
    for (const w of [...this.unholdWaiters]) w();
  }

  /** Why a closed connection serves no more: the agent's violations, or close(). */
  private closedError(): KataError {
    return this.violationError ?? unavailable('AGENT_CLIENT_CLOSED', 'the agent client is closed.');
  }

  /**
   * Count a session or attempt that ended with `err`; past the bound, end the connection with
   * AGENT_PROTOCOL_VIOLATION and tell the listeners. True when the connection ended.
   */
  private countViolation(err: unknown): boolean {
    const violation = violationOf(err);
    if (violation === undefined) return false;
    this.violationsInARow.push(violation.reason);
    const count = this.violationsInARow.length;
    const max = this.options.maxProtocolViolations ?? AGENT_PROTOCOL_VIOLATIONS_MAX;
    this.options.logger.warn(
      { err: errorMessage(violation), reason: violation.reason, count, max },
      'the agent broke the channel protocol',
    );
    if (count < max) return false;
    this.violationError = exhausted(
      'AGENT_PROTOCOL_VIOLATION',
      `the agent broke the channel protocol ${count} times in a row (${this.violationsInARow.join(', ')}; last: ${violation.message}); it is not reconnected to.`,
      { cause: violation },
    );
    this.options.logger.error({ err: this.violationError.message }, 'giving up on the agent');
    this.close();
    for (const l of [...this.violationListeners]) l(this.violationError);
    this.violationListeners.clear();
    return true;
  }

  private async run(): Promise<void> {
    let backoffMs = this.options.minBackoffMs ?? 100;
    const maxBackoffMs = this.options.maxBackoffMs ?? 2000;
    while (!this.closedFlag) {
      await this.unheld();
      if (this.closedFlag) return;
      try {
        const session = await this.attempt();
        backoffMs = this.options.minBackoffMs ?? 100;
        const keepalive = this.keepalive(session);
        await new Promise<void>((resolve) => session.onClose(() => resolve()));
        clearInterval(keepalive);
        if (this.closedFlag || this.countViolation(session.closeError)) return;
        this.options.logger.warn({ err: errorMessage(session.closeError) }, 'agent session ended; reconnecting');
      } catch (err) {
        this.lastError = err;
        if (this.closedFlag || this.countViolation(err)) return;
        this.options.logger.debug({ err: errorMessage(err) }, 'agent connect attempt failed');
        await new Promise((resolve) => setTimeout(resolve, backoffMs));
        backoffMs = Math.min(maxBackoffMs, backoffMs * 2);
      }
    }
  }

  /**
   * PING `session` every interval; `misses` unanswered in a row close it with
   * AGENT_KEEPALIVE_FAILED (any answer starts the count again). The timer, or undefined when off.
   */
  private keepalive(session: Session): ReturnType<typeof setInterval> | undefined {
    const intervalMs = this.options.keepaliveIntervalMs ?? AGENT_KEEPALIVE_DEFAULTS.intervalMs;
    const misses = this.options.keepaliveMisses ?? AGENT_KEEPALIVE_DEFAULTS.misses;
    if (intervalMs <= 0) return undefined;
    let missed = 0;
    return setInterval(() => {
      if (this.heldBy !== undefined) {
        missed = 0;
        return;
      }
      session.ping(intervalMs).then(
        () => {
          missed = 0;
        },
        (err: unknown) => {
          // A ping sent just before the guest was stopped goes unanswered: not a hang.
          if (this.heldBy !== undefined || session.closed) return;
          missed += 1;
          if (missed < misses) {
            this.options.logger.warn({ missed, misses, intervalMs }, 'the agent did not answer a ping in time; waiting for the next');
            return;
          }
          session.close(
            unavailable('AGENT_KEEPALIVE_FAILED', `the agent did not answer ${missed} ping(s) in a row, each within ${intervalMs} ms.`, {
              cause: err,
            }),
          );
        },
      );
    }, intervalMs);
  }

  private async attempt(): Promise<Session> {
    const timeoutMs = this.options.handshakeTimeoutMs ?? 5000;
    // The agent's port socket is in a directory a confined QEMU owns: never reached through a link.
    const duplex = this.options.dial?.() ?? (await connectUnixNoFollow(this.options.socketPath));
    const helloFloodMaxBytes = this.options.helloFloodMaxBytes;
    const session = await connectSession(duplex, { timeoutMs, ...(helloFloodMaxBytes === undefined ? {} : { helloFloodMaxBytes }) }).catch(
      (err: unknown) => {
        duplex.destroy();
        throw err;
      },
    );
    session.onClose(() => {
      this.live = false;
      duplex.destroy();
    });
    this.session = session;
    this.live = false;
    try {
      const hello = await this.rpc.unary('Hello', { apiVersion: AGENT_API_VERSION, hostVersion: this.options.hostVersion }, { timeoutMs });
      // The agent's version if this host speaks it (current or one back), else AGENT_API_MISMATCH.
      negotiateApiVersion(hello.apiVersion);
      this.helloValue = hello;
    } catch (err) {
      this.session = undefined;
      // A session that broke the protocol while Hello was asked: that is what counts.
      const why = (session.closed ? violationOf(session.closeError) : undefined) ?? err;
      session.close(unavailable('AGENT_HELLO_FAILED', 'the agent did not complete Hello.', { cause: err }));
      throw why;
    }
    if (this.closedFlag) {
      session.close(unavailable('AGENT_CLIENT_CLOSED', 'the agent client is closed.'));
      return session;
    }
    this.live = true;
    this.violationsInARow = [];
    const { apiVersion } = this.helloValue;
    const missing = missingFeatures(apiVersion).map((f) => f.feature);
    this.options.logger.info(
      {
        agentVersion: this.helloValue.agentVersion,
        instance: this.helloValue.agentInstanceId,
        apiVersion,
        hostApiVersion: AGENT_API_VERSION,
        ...(missing.length === 0 ? {} : { refusedFeatures: missing }),
      },
      apiVersion === AGENT_API_VERSION
        ? 'agent session started'
        : `agent session started at the previous API ${apiVersion} (this daemon speaks ${AGENT_API_VERSION}); refused with it: ${missing.join(', ') || 'nothing'}`,
    );
    for (const w of [...this.waiters]) w();
    for (const l of [...this.sessionListeners]) l(this.helloValue);
    return session;
  }
}
