/**
 * A container's stdin from the caller's FIFO (containerd's shim API): the bytes a writer puts in
 * the FIFO go to the container's stdin through the agent (WriteStdin, paced by the channel), and
 * the container's stdin is closed when the FIFO's writer closes it (end of file) or the caller
 * says so (`close`: containerd's CloseIO).
 *
 * The FIFO is opened read-only and non-blocking (never waits for a writer) and read as a libuv
 * pipe. Linux reports no hang-up on such a reader until a writer has come and gone, so a reader
 * that opens before containerd's writer (containerd opens it asynchronously, waiting for us) sees
 * the writer's bytes and then its end, not an end at once.
 *
 * Across broken agent sessions the WriteStdin stream is opened again and the chunk in hand sent
 * again (it may then arrive twice: the channel cannot say whether a write that failed with its
 * session went in). The agent closes the container's stdin at the end of a stream only for a
 * container created with stdinOnce, which is how a FIFO's container is created
 * (guest-ops.ts guestStdin); a stream cancelled (`stop`) leaves it open.
 */

import type net from 'node:net';
import type { AgentClient, StdinWriter } from '../../agent-client/index.js';
import { errorMessage, isKataError } from '../../common/errors.js';
import { openFifoSocket } from '../../common/fifo.js';
import type { Logger } from '../../common/logger.js';

/** How long a broken session may take to come back before the forwarding gives up. */
const READY_TIMEOUT_MS = 30_000;
/** Streams one chunk is tried on before the forwarding gives up. */
const MAX_ATTEMPTS = 5;

export interface FifoStdinOptions {
  agent: AgentClient;
  containerId: string;
  /** The caller's stdin FIFO. */
  fifo: string;
  logger: Logger;
}

export class FifoStdin {
  /** Settles when the forwarding ended (end of file forwarded, closed, stopped, or given up). */
  readonly done: Promise<void>;
  private socket: net.Socket | undefined;
  /** Why reading stops early: `close` ends the container's stdin, `stop` leaves it open. */
  private ending: 'close' | 'stop' | undefined;
  private writer: StdinWriter | undefined;
  private readonly abort = new AbortController();

  private constructor(private readonly opts: FifoStdinOptions) {
    this.done = this.run().catch((err: unknown) =>
      opts.logger.warn(
        { containerId: opts.containerId, err: errorMessage(err) },
        "forwarding the stdin FIFO to the container's stdin ended",
      ),
    );
  }

  static start(opts: FifoStdinOptions): FifoStdin {
    return new FifoStdin(opts);
  }

  /** CloseIO: what was read goes in, then the container's stdin is closed; nothing more is read. */
  close(): void {
    this.ending ??= 'close';
    this.socket?.destroy();
  }

  /** Stop reading (the container is removed, the daemon closes); its stdin is left as it is. */
  async stop(): Promise<void> {
    this.ending ??= 'stop';
    this.socket?.destroy();
    this.abort.abort();
    this.writer?.cancel();
    await this.done;
  }

  private async run(): Promise<void> {
    const socket = await openFifoSocket(this.opts.fifo, 'read');
    this.socket = socket;
    socket.on('error', () => undefined);
    if (this.ending !== undefined) socket.destroy();
    try {
      for await (const chunk of socket) await this.send(chunk as Buffer);
    } catch (err) {
      // A destroyed socket ends its iteration with an error: that is close() or stop().
      if (this.ending === undefined) throw err;
    }
    if (this.ending === 'stop') return;
    // End of file (the writer closed the FIFO) or CloseIO: the container's stdin closes.
    await this.endStdin();
  }

  /** One chunk into the container's stdin, again on a new stream when the session broke. */
  private async send(data: Buffer): Promise<void> {
    const { agent, containerId } = this.opts;
    for (let attempt = 1; ; attempt++) {
      this.writer ??= this.newWriter();
      try {
        await this.writer.write(data);
        return;
      } catch (err) {
        this.writer?.cancel();
        this.writer = undefined;
        // Only a session that went (unavailable) is worth another stream; anything else (no stdin
        // any more, the container gone, its stdin pipe closed) ends the forwarding.
        const sessionLost = isKataError(err) && err.kind === 'unavailable';
        if (this.abort.signal.aborted || !sessionLost || attempt >= MAX_ATTEMPTS) throw err;
        await agent.connection.ready(READY_TIMEOUT_MS, this.abort.signal);
        this.opts.logger.debug({ containerId, err: errorMessage(err) }, 'stdin stream broke; writing on a new one');
      }
    }
  }

  private newWriter(): StdinWriter {
    const writer = this.opts.agent.writeStdin(this.opts.containerId, '', { signal: this.abort.signal });
    writer.done.catch(() => undefined);
    return writer;
  }

  private async endStdin(): Promise<void> {
    const writer = this.writer ?? this.newWriter();
    this.writer = undefined;
    writer.end();
    await writer.done;
  }
}
