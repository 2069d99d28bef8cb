import type net from 'node:net';
import { exhausted, isReason, type KataError, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { connectUnixNoFollow } from '../common/nofollow.js';
import { type GuestReport, parseGuestLine } from './guest-protocol.js';
import { LineSplitter } from './line-splitter.js';

export type GuestReportListener = (report: GuestReport) => void;

/**
 * The longest line the guest may send on its ready port. Its lines are about 100 bytes (see
 * guest-protocol.ts); 4 KiB leaves room for fields added later and bounds what a hostile guest
 * makes the daemon hold.
 */
export const READY_LINE_MAX_BYTES = 4 * 1024;
/**
 * Lines outside the protocol the guest may send before it is judged hostile: guest/init writes
 * only protocol lines to this port, and each stray one is logged, so a flood of them would fill
 * the daemon's log instead of its heap.
 */
export const READY_STRAY_LINES_MAX = 64;
/** How much of a stray line goes into the log. */
const LOGGED_LINE_CHARS = 200;

/**
 * The host end of the guest's virtio-serial ready port (QEMU listens on a unix socket; we
 * connect). Keeps the first ready report and the latest report, and tells subscribers of each.
 */
export class ReadyChannel {
  private readonly lines = new LineSplitter((line) => this.onLine(line), {
    maxLineBytes: READY_LINE_MAX_BYTES,
    onOverflow: ({ heldBytes }) =>
      this.violate(
        exhausted('READY_CHANNEL_VIOLATION', `the guest sent a ready-port line of over ${READY_LINE_MAX_BYTES} bytes (${heldBytes} held).`),
      ),
  });
  private readonly listeners = new Set<GuestReportListener>();
  private readonly violationListeners = new Set<(err: KataError) => void>();
  private violationValue: KataError | undefined;
  private strayLines = 0;
  private readyValue: GuestReport | undefined;
  private latestValue: GuestReport | undefined;
  private poweroffSeen = false;
  /** Settles when the socket closes (QEMU exited, or close() was called). */
  readonly closed: Promise<void>;

  private constructor(
    private readonly socket: net.Socket,
    private readonly logger: Logger,
  ) {
    this.closed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.on('error', (err) => this.logger.debug({ err: err.message }, 'ready channel error'));
    socket.on('data', (chunk: Buffer) => this.lines.push(chunk));
  }

  /** Connect to the ready socket QEMU listens on, never through a link (it is in QEMU's directory). */
  static async connect(socketPath: string, logger: Logger): Promise<ReadyChannel> {
    const socket = await connectUnixNoFollow(socketPath).catch((err: unknown) => {
      if (isReason(err, 'UNIX_SOCKET_UNSAFE')) throw err;
      throw unavailable('READY_SOCKET_CONNECT_FAILED', `ready socket ${socketPath} could not be connected.`, { cause: err });
    });
    return new ReadyChannel(socket, logger);
  }

  /** The guest's first KATA_TS_READY report, once received. */
  get ready(): GuestReport | undefined {
    return this.readyValue;
  }

  /** The most recent report (ready or update). */
  get latest(): GuestReport | undefined {
    return this.latestValue;
  }

  /** True once the guest announced it is powering off. */
  get poweringOff(): boolean {
    return this.poweroffSeen;
  }

  /** Why the channel was given up on the guest's account (a line too long, too many stray lines). */
  get violation(): KataError | undefined {
    return this.violationValue;
  }

  /**
   * Called once if the guest breaks the protocol so that the channel is closed: its VM can no
   * longer be trusted to report, and the owner fails it.
   */
  onViolation(listener: (err: KataError) => void): () => void {
    if (this.violationValue !== undefined) {
      listener(this.violationValue);
      return () => undefined;
    }
    this.violationListeners.add(listener);
    return () => {
      this.violationListeners.delete(listener);
    };
  }

  on(listener: GuestReportListener): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  close(): void {
    this.socket.destroy();
  }

  private violate(err: KataError): void {
    if (this.violationValue !== undefined) return;
    this.violationValue = err;
    this.logger.error({ reason: err.reason, err: err.message }, 'ready channel given up: the guest broke the protocol');
    this.socket.destroy();
    for (const listener of [...this.violationListeners]) {
      try {
        listener(err);
      } catch (listenerErr) {
        this.logger.error({ err: listenerErr }, 'ready channel violation listener threw');
      }
    }
    this.violationListeners.clear();
  }

  private onLine(line: string): void {
    if (this.violationValue !== undefined) return;
    const message = parseGuestLine(line);
    if (message === undefined) {
      if (line.trim() === '') return;
      this.strayLines += 1;
      if (this.strayLines > READY_STRAY_LINES_MAX) {
        this.violate(
          exhausted('READY_CHANNEL_VIOLATION', `the guest sent over ${READY_STRAY_LINES_MAX} lines outside the ready protocol.`),
        );
        return;
      }
      this.logger.warn({ line: line.slice(0, LOGGED_LINE_CHARS) }, 'guest sent a line outside the ready protocol');
      return;
    }
    if (message.kind === 'poweroff') {
      this.poweroffSeen = true;
      this.logger.info('guest is powering off');
      return;
    }
    this.logger.debug({ report: message }, 'guest report');
    if (message.kind === 'ready' && this.readyValue === undefined) this.readyValue = message;
    this.latestValue = message;
    for (const listener of [...this.listeners]) {
      try {
        listener(message);
      } catch (err) {
        this.logger.error({ err }, 'guest report listener threw');
      }
    }
  }
}
