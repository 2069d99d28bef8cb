import net from 'node:net';
import { unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { type GuestReport, parseGuestLine } from './guest-protocol.js';
import { LineSplitter } from './line-splitter.js';

export type GuestReportListener = (report: GuestReport) => void;

/**
 * The host end of the guest's virtio-serial ready port (QEMU listens on a unix socket; we
 * connect). Keeps the first ready report and the latest report, and tells subscribers of each.
 */
export class ReadyChannel {
  private readonly lines = new LineSplitter((line) => this.onLine(line));
  private readonly listeners = new Set<GuestReportListener>();
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

  /** Connect to the ready socket QEMU listens on. */
  static connect(socketPath: string, logger: Logger): Promise<ReadyChannel> {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection(socketPath);
      const onError = (err: Error): void =>
        reject(unavailable('READY_SOCKET_CONNECT_FAILED', `ready socket ${socketPath} could not be connected.`, { cause: err }));
      socket.once('error', onError);
      socket.once('connect', () => {
        socket.off('error', onError);
        resolve(new ReadyChannel(socket, logger));
      });
    });
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

  on(listener: GuestReportListener): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  close(): void {
    this.socket.destroy();
  }

  private onLine(line: string): void {
    const message = parseGuestLine(line);
    if (message === undefined) {
      if (line.trim() !== '') this.logger.warn({ line }, 'guest sent a line outside the ready protocol');
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
