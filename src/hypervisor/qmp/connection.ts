import type { Duplex } from 'node:stream';
import { errorMessage, exhausted, type KataError, timedOut, unavailable } from '../../common/errors.js';
import { type Logger, silentLogger } from '../../common/logger.js';
import { LineSplitter } from '../line-splitter.js';
import { QmpError } from './error.js';
import type { QmpEvent, QmpGreeting } from './types.js';

export interface QmpClientOptions {
  logger?: Logger;
  /** Default deadline of each command (and of the greeting); 10 s unless given. */
  timeoutMs?: number;
}

export interface ExecuteOptions {
  /** Deadline of this command, overriding the client's default. */
  timeoutMs?: number;
}

/** Why the connection ended: `error` is set when the stream failed rather than closed cleanly. */
export interface QmpCloseInfo {
  error?: Error;
  /**
   * Set when this side closed the connection because the peer broke the protocol (a message
   * over QMP_LINE_MAX_BYTES, too many lines that are not JSON): the QEMU behind it is not
   * trusted any more, and its owner fails the VM (reason QMP_PROTOCOL_VIOLATION).
   */
  violation?: KataError;
}

export type QmpEventListener = (event: QmpEvent) => void;

interface Pending {
  id: number;
  command: string;
  resolve: (value: unknown) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

const DEFAULT_TIMEOUT_MS = 10_000;
/**
 * The longest QMP message accepted, in bytes. The largest reply the runtime asks for is
 * `query-pci` of a VM with hundreds of root ports (well under 1 MiB); 8 MiB leaves a wide margin
 * and still bounds what a QEMU sending bytes without a newline makes the daemon hold.
 */
export const QMP_LINE_MAX_BYTES = 8 * 1024 * 1024;
/**
 * Lines that are not JSON objects accepted before the peer is judged not to be QEMU: QEMU never
 * sends one, and each is logged, so a stream of them would flood the daemon's log.
 */
export const QMP_GARBAGE_LINES_MAX = 16;
/** How much of a bad line goes into the log. */
const LOGGED_LINE_CHARS = 200;
/** Subscribe with this name to receive every event. */
export const ANY_EVENT = '*';

/**
 * The QMP wire protocol over any Duplex stream (a unix socket in production, an in-memory pair replaying a
 * recorded transcript in unit tests). Commands carry numeric ids and are matched to replies by id;
 * QEMU executes them in order but a timed-out command's late reply must not be taken for the next.
 */
export class QmpConnection {
  private readonly logger: Logger;
  protected readonly defaultTimeoutMs: number;
  private readonly lines = new LineSplitter(
    (line) => {
      if (line.trim() !== '') this.onLine(line.trim());
    },
    {
      maxLineBytes: QMP_LINE_MAX_BYTES,
      onOverflow: ({ heldBytes }) =>
        this.violate(
          exhausted('QMP_PROTOCOL_VIOLATION', `QMP peer sent a message of over ${QMP_LINE_MAX_BYTES} bytes (${heldBytes} held).`),
        ),
    },
  );
  private garbageLines = 0;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly listeners = new Map<string, Set<QmpEventListener>>();
  private greetingValue: QmpGreeting | undefined;
  private greetingWaiters: Array<(g: QmpGreeting | undefined) => void> = [];
  private closeInfo: QmpCloseInfo | undefined;
  private resolveClosed!: (info: QmpCloseInfo) => void;

  /** Settles (never rejects) once the stream has closed, for whatever reason. */
  readonly closed: Promise<QmpCloseInfo>;

  constructor(
    private readonly stream: Duplex,
    options: QmpClientOptions = {},
  ) {
    this.logger = options.logger ?? silentLogger();
    this.defaultTimeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.closed = new Promise((resolve) => (this.resolveClosed = resolve));
    stream.on('data', (chunk: Buffer | string) => this.lines.push(chunk));
    stream.on('error', (err: Error) => this.onClose(err));
    stream.on('end', () => this.onClose(undefined));
    stream.on('close', () => this.onClose(undefined));
  }

  /**
   * Wrap `stream`, wait for QEMU's greeting and negotiate capabilities (leaving the monitor's
   * capabilities-negotiation mode, without which QEMU refuses every other command).
   */
  static async open<T extends QmpConnection>(
    this: new (
      stream: Duplex,
      options?: QmpClientOptions,
    ) => T,
    stream: Duplex,
    options: QmpClientOptions = {},
  ): Promise<T> {
    const client = new this(stream, options);
    try {
      await client.negotiate();
    } catch (err) {
      client.close();
      throw err;
    }
    return client;
  }

  /** The greeting, once received. */
  get greeting(): QmpGreeting | undefined {
    return this.greetingValue;
  }

  get isClosed(): boolean {
    return this.closeInfo !== undefined;
  }

  /** Wait for the greeting, then send `qmp_capabilities`. */
  async negotiate(options: ExecuteOptions = {}): Promise<QmpGreeting> {
    const timeoutMs = options.timeoutMs ?? this.defaultTimeoutMs;
    const greeting = await this.waitForGreeting(timeoutMs);
    await this.execute('qmp_capabilities', undefined, { timeoutMs });
    return greeting;
  }

  /** Send one command and resolve with its `return` value; QEMU errors reject with `QmpError`. */
  execute<T = unknown>(command: string, args?: Record<string, unknown>, options: ExecuteOptions = {}): Promise<T> {
    if (this.closeInfo !== undefined) return Promise.reject(this.closedError(command, this.closeInfo.error));
    const id = this.nextId++;
    const timeoutMs = options.timeoutMs ?? this.defaultTimeoutMs;
    const message: Record<string, unknown> = { execute: command };
    if (args !== undefined) message.arguments = args;
    message.id = id;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(timedOut('QMP_TIMEOUT', `QMP command ${command} got no reply within ${timeoutMs} ms.`));
      }, timeoutMs);
      this.pending.set(id, { id, command, resolve: resolve as (v: unknown) => void, reject, timer });
      this.logger.debug({ qmp: message }, 'qmp send');
      this.stream.write(`${JSON.stringify(message)}\n`);
    });
  }

  /**
   * Subscribe to an event by name (or `ANY_EVENT`); returns the unsubscribe function. Listeners run
   * synchronously in arrival order, before any reply that follows the event on the wire.
   */
  on(event: string, listener: QmpEventListener): () => void {
    let set = this.listeners.get(event);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(event, set);
    }
    set.add(listener);
    return () => {
      set.delete(listener);
    };
  }

  /** Like `on`, for the next matching event only. */
  once(event: string, listener: QmpEventListener): () => void {
    const off = this.on(event, (e) => {
      off();
      listener(e);
    });
    return off;
  }

  /**
   * Resolve with the next `name` event for which `predicate` holds. Subscribe BEFORE sending the
   * command that causes the event (for example before `device_del`), or the event may be missed.
   * Rejects on timeout and when the connection closes first.
   */
  waitForEvent(name: string, predicate: (e: QmpEvent) => boolean = () => true, timeoutMs = this.defaultTimeoutMs): Promise<QmpEvent> {
    if (this.closeInfo !== undefined) return Promise.reject(this.closedError(`wait for ${name}`, this.closeInfo.error));
    return new Promise((resolve, reject) => {
      let active = true;
      const finish = (): void => {
        active = false;
        clearTimeout(timer);
        off();
      };
      const timer = setTimeout(() => {
        finish();
        reject(timedOut('QMP_EVENT_TIMEOUT', `QMP event ${name} did not arrive within ${timeoutMs} ms.`));
      }, timeoutMs);
      const off = this.on(name, (e) => {
        let match: boolean;
        try {
          match = predicate(e);
        } catch (err) {
          finish();
          reject(err instanceof Error ? err : new Error(String(err)));
          return;
        }
        if (match) {
          finish();
          resolve(e);
        }
      });
      void this.closed.then((info) => {
        if (!active) return;
        finish();
        reject(this.closedError(`wait for ${name}`, info.error));
      });
    });
  }

  /** Close the stream; pending commands and waits fail with QMP_CLOSED. */
  close(): void {
    this.stream.destroy();
    this.onClose(undefined);
  }

  // ---- wire handling -------------------------------------------------------------------------

  private onLine(line: string): void {
    // Lines that arrived in the same chunk after the peer was given up are not read.
    if (this.closeInfo !== undefined) return;
    let message: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(line);
      if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error('not an object');
      message = parsed as Record<string, unknown>;
    } catch (err) {
      this.garbageLines += 1;
      if (this.garbageLines > QMP_GARBAGE_LINES_MAX) {
        this.violate(exhausted('QMP_PROTOCOL_VIOLATION', `QMP peer sent over ${QMP_GARBAGE_LINES_MAX} lines that are not JSON objects.`));
        return;
      }
      this.logger.warn(
        { line: line.slice(0, LOGGED_LINE_CHARS), err: errorMessage(err) },
        'qmp: ignoring a line that is not a JSON object',
      );
      return;
    }
    this.logger.debug({ qmp: message }, 'qmp recv');
    if ('QMP' in message) {
      this.greetingValue = message.QMP as QmpGreeting;
      const waiters = this.greetingWaiters;
      this.greetingWaiters = [];
      for (const w of waiters) w(this.greetingValue);
    } else if ('event' in message) {
      this.dispatchEvent(message as unknown as QmpEvent);
    } else if ('return' in message || 'error' in message) {
      this.onReply(message);
    } else {
      this.logger.warn({ qmp: message }, 'qmp: ignoring an unknown message');
    }
  }

  private onReply(message: Record<string, unknown>): void {
    const id = message.id;
    let entry = typeof id === 'number' ? this.pending.get(id) : undefined;
    if (entry === undefined && id === undefined && 'error' in message) {
      // QEMU answers a line it could not parse with an id-less error: it belongs to the oldest command.
      entry = this.pending.values().next().value;
    }
    if (entry === undefined) {
      this.logger.debug({ qmp: message }, 'qmp: reply for no pending command (timed out earlier?)');
      return;
    }
    this.pending.delete(entry.id);
    clearTimeout(entry.timer);
    if ('error' in message) {
      const error = (message.error ?? {}) as { class?: unknown; desc?: unknown };
      entry.reject(new QmpError(entry.command, String(error.class ?? 'GenericError'), String(error.desc ?? '')));
    } else {
      entry.resolve(message.return);
    }
  }

  private dispatchEvent(event: QmpEvent): void {
    for (const key of [event.event, ANY_EVENT]) {
      const set = this.listeners.get(key);
      if (set === undefined) continue;
      for (const listener of [...set]) {
        try {
          listener(event);
        } catch (err) {
          this.logger.error({ event: event.event, err: errorMessage(err) }, 'qmp: event listener threw');
        }
      }
    }
  }

  private waitForGreeting(timeoutMs: number): Promise<QmpGreeting> {
    if (this.greetingValue !== undefined) return Promise.resolve(this.greetingValue);
    if (this.closeInfo !== undefined) return Promise.reject(this.closedError('greeting', this.closeInfo.error));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.greetingWaiters = this.greetingWaiters.filter((w) => w !== waiter);
        reject(timedOut('QMP_TIMEOUT', `QMP greeting did not arrive within ${timeoutMs} ms.`));
      }, timeoutMs);
      const waiter = (g: QmpGreeting | undefined): void => {
        clearTimeout(timer);
        if (g === undefined) reject(this.closedError('greeting', this.closeInfo?.error));
        else resolve(g);
      };
      this.greetingWaiters.push(waiter);
    });
  }

  /** The peer broke the protocol: close with `err`, which every waiter and `closed` carry. */
  private violate(err: KataError): void {
    if (this.closeInfo !== undefined) return;
    this.logger.error({ reason: err.reason, err: err.message }, 'qmp: closing the connection, the peer broke the protocol');
    this.onClose(err, err);
  }

  private onClose(error: Error | undefined, violation?: KataError): void {
    if (this.closeInfo !== undefined) return;
    this.closeInfo = { ...(error === undefined ? {} : { error }), ...(violation === undefined ? {} : { violation }) };
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending) {
      clearTimeout(p.timer);
      p.reject(this.closedError(p.command, error));
    }
    const waiters = this.greetingWaiters;
    this.greetingWaiters = [];
    for (const w of waiters) w(undefined);
    this.resolveClosed(this.closeInfo);
    if (!this.stream.destroyed) this.stream.destroy();
  }

  private closedError(what: string, cause: Error | undefined): KataError {
    return unavailable('QMP_CLOSED', `QMP connection closed before ${what} completed.`, cause === undefined ? {} : { cause });
  }
}
