/**
 * Task events to containerd: the shim's half of containerd's event exchange. Each event goes to
 * `containerd.services.events.ttrpc.v1.Events/Forward` on containerd's ttrpc socket (the
 * TTRPC_ADDRESS the shim was started with), wrapped in an Envelope that carries the time it was
 * published, the shim's namespace, its topic and the event as an Any.
 *
 * containerd applies task events as they arrive (a container's exit must not overtake its
 * start), so events leave one at a time, in the order published: an event that fails is retried, with a
 * growing pause, before the next is sent, and dropped (logged) after a few attempts so that a
 * containerd that is gone for long does not stop the events after it forever.
 *
 * CRI-O (`runtime_type = "vm"`) starts the shim with an empty TTRPC_ADDRESS: it has no events
 * service and learns exits through Wait (and OOM kills from `<bundle>/oom`). With no address the
 * publisher sends nothing: events are dropped where they are published, said once in the log,
 * without connecting, retrying or queueing.
 */
import type { Buffer } from 'node:buffer';
import { cancelled } from '../common/errors.js';
import { type Logger, silentLogger } from '../common/logger.js';
import { epochNs } from '../common/time.js';
import { connectTtrpc, type TtrpcClient, TtrpcStatusError } from '../ttrpc/index.js';
import {
  anyOf,
  EVENTS_FORWARD,
  EVENTS_SERVICE,
  encodeMessage,
  type MessageInput,
  type MessageName,
  NAMESPACE_METADATA_KEY,
  timestampOfNs,
} from './proto.js';
import './proto-reasons.js';

/** Each task topic and the event message published on it (containerd v1.6.20 runtime/events.go). */
export const TASK_EVENT_TYPES = {
  '/tasks/create': 'containerd.events.TaskCreate',
  '/tasks/start': 'containerd.events.TaskStart',
  '/tasks/exit': 'containerd.events.TaskExit',
  '/tasks/delete': 'containerd.events.TaskDelete',
  '/tasks/oom': 'containerd.events.TaskOOM',
  '/tasks/exec-added': 'containerd.events.TaskExecAdded',
  '/tasks/exec-started': 'containerd.events.TaskExecStarted',
  '/tasks/paused': 'containerd.events.TaskPaused',
  '/tasks/resumed': 'containerd.events.TaskResumed',
  '/tasks/checkpointed': 'containerd.events.TaskCheckpointed',
} as const satisfies Record<string, MessageName>;

export type TaskTopic = keyof typeof TASK_EVENT_TYPES;
/** The event message a topic carries, as encoding accepts it. */
export type TaskEventOf<T extends TaskTopic> = MessageInput<(typeof TASK_EVENT_TYPES)[T]>;

export interface EventPublisherOptions {
  /**
   * containerd's ttrpc socket, the shim's TTRPC_ADDRESS: a path (a `unix://` prefix is accepted).
   * '' (CRI-O, which has no events service): every event is dropped at once.
   */
  address: string;
  /** The containerd namespace the shim serves (its -namespace flag); every envelope carries it. */
  namespace: string;
  logger?: Logger;
  /** Attempts at one event before it is dropped (default 5). */
  maxAttempts?: number;
  /** The pause after an event's first failed attempt, doubled after each further one (default 200 ms)... */
  initialBackoffMs?: number;
  /** ...up to this (default 2000 ms). */
  maxBackoffMs?: number;
  /** Bound of one attempt's connect and of its Forward call (default 5000 ms, as containerd's own shims wait). */
  callTimeoutMs?: number;
  /** Events waiting beyond which a new one is dropped, logged (default 2048, containerd's own shims' queue). */
  maxQueued?: number;
  /** Now, in ns since the epoch: the envelopes' timestamp (tests pin it). */
  nowNs?: () => bigint;
}

interface Queued {
  topic: TaskTopic;
  /** The encoded ForwardRequest, built once when published so retries send the same envelope. */
  request: Buffer;
  attempts: number;
}

export class EventPublisher {
  private readonly socketPath: string;
  private readonly logger: Logger;
  private readonly maxAttempts: number;
  private readonly initialBackoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly callTimeoutMs: number;
  private readonly maxQueued: number;
  private readonly nowNs: () => bigint;
  private readonly queue: Queued[] = [];
  /** The loop sending the queue, while it runs. */
  private running: Promise<void> | undefined;
  private client: TtrpcClient | undefined;
  private closing = false;
  /** No events address: events are dropped as they are published (and that said once). */
  private readonly disabled: boolean;
  private disabledSaid = false;
  /** Aborted when close() runs out of time: the pause or call in progress ends at once. */
  private readonly stop = new AbortController();

  constructor(private readonly options: EventPublisherOptions) {
    this.socketPath = options.address.replace(/^unix:\/\//, '');
    this.disabled = this.socketPath.trim() === '';
    this.logger = options.logger ?? silentLogger();
    this.maxAttempts = options.maxAttempts ?? 5;
    this.initialBackoffMs = options.initialBackoffMs ?? 200;
    this.maxBackoffMs = options.maxBackoffMs ?? 2000;
    this.callTimeoutMs = options.callTimeoutMs ?? 5000;
    this.maxQueued = options.maxQueued ?? 2048;
    this.nowNs = options.nowNs ?? epochNs;
  }

  /** Events published and neither forwarded nor dropped yet. */
  get queued(): number {
    return this.queue.length;
  }

  /**
   * Queues `event` for the topic `topic` (the compiler checks that the two belong together),
   * stamped now. Returns at once; delivery happens in the background, in publish order.
   */
  publish<T extends TaskTopic>(topic: T, event: TaskEventOf<T>): void {
    if (this.disabled) {
      if (!this.disabledSaid) {
        this.disabledSaid = true;
        this.logger.info(
          { topic },
          'no events address (TTRPC_ADDRESS is empty): task events are not sent; the caller learns exits through Wait',
        );
      }
      return;
    }
    if (this.closing) {
      this.logger.warn({ topic }, 'event published after the publisher closed: dropped');
      return;
    }
    if (this.queue.length >= this.maxQueued) {
      this.logger.error({ topic, queued: this.queue.length }, 'event queue full: event dropped');
      return;
    }
    // Built whole here: containerd 1.6 dereferences the envelope without checking it, so a
    // ForwardRequest without one must never leave this process.
    const request = encodeMessage('containerd.services.events.ttrpc.v1.ForwardRequest', {
      envelope: {
        timestamp: timestampOfNs(this.nowNs()),
        namespace: this.options.namespace,
        topic,
        event: anyOf(TASK_EVENT_TYPES[topic], event),
      },
    });
    this.queue.push({ topic, request, attempts: 0 });
    this.kick();
  }

  /** Resolves once every event published so far has been forwarded or dropped. */
  async idle(): Promise<void> {
    while (this.running !== undefined) await this.running;
  }

  /**
   * Stops taking events, sends those still queued for at most `timeoutMs`, then drops the rest
   * (logged) and closes the connection.
   */
  async close(timeoutMs = 5000): Promise<void> {
    this.closing = true;
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
    });
    await Promise.race([this.idle(), deadline]);
    clearTimeout(timer);
    this.stop.abort();
    if (this.queue.length > 0) {
      this.logger.error({ dropped: this.queue.map((q) => q.topic) }, 'events still queued when the publisher closed: dropped');
      this.queue.length = 0;
    }
    await this.dropConnection();
  }

  private kick(): void {
    if (this.running !== undefined || this.stop.signal.aborted) return;
    this.running = this.drain()
      .catch((err: unknown) => this.logger.error({ err }, 'event publisher failed'))
      .finally(() => {
        this.running = undefined;
        // An event queued after the loop saw the queue empty, but before it ended.
        if (this.queue.length > 0) this.kick();
      });
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0 && !this.stop.signal.aborted) {
      const item = this.queue[0]!;
      item.attempts += 1;
      try {
        await this.forward(item.request);
        this.queue.shift();
      } catch (err) {
        if (this.stop.signal.aborted) return;
        // A status came over a working connection; anything else may have left it unusable.
        if (!(err instanceof TtrpcStatusError)) await this.dropConnection();
        if (item.attempts >= this.maxAttempts || isPermanent(err)) {
          this.logger.error({ err, topic: item.topic, attempts: item.attempts }, 'event not forwarded to containerd: dropped');
          this.queue.shift();
          continue;
        }
        const pauseMs = Math.min(this.maxBackoffMs, this.initialBackoffMs * 2 ** (item.attempts - 1));
        this.logger.warn({ err, topic: item.topic, attempts: item.attempts, pauseMs }, 'event not forwarded to containerd: retrying');
        await pause(pauseMs, this.stop.signal);
      }
    }
  }

  private async forward(request: Buffer): Promise<void> {
    const client = await this.connection();
    await client.call(EVENTS_SERVICE, EVENTS_FORWARD, request, {
      timeoutMs: this.callTimeoutMs,
      signal: this.stop.signal,
      metadata: { [NAMESPACE_METADATA_KEY]: this.options.namespace },
    });
  }

  /** The connection to containerd, made on first use and again after it was lost. */
  private async connection(): Promise<TtrpcClient> {
    if (this.client !== undefined) return this.client;
    const client = await connectTtrpc(this.socketPath, { logger: this.logger, timeoutMs: this.callTimeoutMs });
    if (this.stop.signal.aborted) {
      // close() gave up while this connect was under way.
      await client.close();
      throw cancelled('SHIM_EVENTS_CLOSED', 'the event publisher closed while connecting to containerd.');
    }
    this.client = client;
    void client.closed.then(() => {
      if (this.client === client) this.client = undefined;
    });
    return client;
  }

  private async dropConnection(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    await client?.close();
  }
}

/**
 * Answers that another attempt would only repeat: containerd refused the envelope itself
 * (INVALID_ARGUMENT: a bad namespace or topic), or the peer has no such service.
 */
function isPermanent(err: unknown): boolean {
  return err instanceof TtrpcStatusError && (err.kind === 'invalid' || err.kind === 'unimplemented');
}

function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) {
      resolve();
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
