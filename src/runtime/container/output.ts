/**
 * A running container's output, from the agent's StreamOutput into the CRI log file, across
 * broken sessions and daemon restarts: the README's caller's sequence in src/runtime/logs, with
 * a retry whenever the stream ends early (the session went; StreamOutput resumes from the
 * writer's committed offset on the next one).
 */

import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { pump } from '../logs/pump.js';
import { ContainerLogWriter } from '../logs/writer.js';

const ACK_TIMEOUT_MS = 10_000;
const RETRY_DELAY_MS = 200;
/** How long a session may take to come back before the next attempt logs again. */
const READY_TIMEOUT_MS = 30_000;

export interface OutputPumpOptions {
  agent: AgentClient;
  containerId: string;
  logPath: string;
  statePath: string;
  tty: boolean;
  logger: Logger;
}

/**
 * One container's log pump. `done` settles when the output reached its end (eof stored) or the
 * pump was stopped; `reopen()` serves ReopenContainerLog.
 */
export class OutputPump {
  readonly done: Promise<void>;
  private writer: ContainerLogWriter | undefined;
  private readonly abort = new AbortController();
  private finished = false;
  private discardedTo = 0;

  private constructor(private readonly opts: OutputPumpOptions) {
    this.done = this.run();
  }

  /** Start pumping (after a restart: resume from what the log state says). */
  static start(opts: OutputPumpOptions): OutputPump {
    return new OutputPump(opts);
  }

  get eof(): boolean {
    return this.finished;
  }

  /** ReopenContainerLog: the next record goes to a new file at the log path. */
  async reopen(): Promise<void> {
    if (this.writer === undefined) return;
    await this.writer.reopen();
  }

  /** Stop without waiting for the end of the output (daemon shutdown, sandbox gone). */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.done;
  }

  /** No log path: the output is read and acknowledged so the container never blocks on it. */
  private async discard(signal: AbortSignal, ack: (offset: number) => Promise<void>): Promise<boolean> {
    const { agent, containerId } = this.opts;
    await agent.connection.ready(READY_TIMEOUT_MS, signal);
    for await (const chunk of agent.streamOutput(containerId, this.discardedTo, { signal })) {
      this.discardedTo = chunk.offset + chunk.data.length;
      await ack(this.discardedTo);
      if (chunk.eof) return true;
    }
    return false;
  }

  private async run(): Promise<void> {
    const { agent, containerId, logger } = this.opts;
    const signal = this.abort.signal;
    const ack = (offset: number) => agent.ackOutput(containerId, offset, { timeoutMs: ACK_TIMEOUT_MS });
    let writer: ContainerLogWriter | undefined;
    let eof = false;
    let failures = 0;
    while (!eof && !signal.aborted) {
      try {
        if (this.opts.logPath === '') {
          eof = await this.discard(signal, ack);
          continue;
        }
        // After a failure the writer is opened again: open() repairs the file from the state.
        if (writer === undefined) await fsp.mkdir(path.dirname(this.opts.statePath), { recursive: true, mode: 0o700 });
        writer ??= await ContainerLogWriter.open({ logPath: this.opts.logPath, statePath: this.opts.statePath, tty: this.opts.tty });
        this.writer = writer;
        if (writer.eof) {
          eof = true;
          break;
        }
        await agent.connection.ready(READY_TIMEOUT_MS, signal);
        ({ eof } = await pump(writer, agent.streamOutput(containerId, writer.committedOffset, { signal }), ack));
        if (!eof) await delay(RETRY_DELAY_MS, signal);
      } catch (err) {
        if (signal.aborted) break;
        // Logged once per run of failures: a VM that is gone fails every attempt until the pump stops.
        if (failures++ === 0)
          logger.warn({ containerId, err: errorMessage(err) }, 'container output stream broke; resuming from the stored offset');
        await writer?.close().catch(() => undefined);
        writer = undefined;
        this.writer = undefined;
        await delay(Math.min(5000, RETRY_DELAY_MS * failures), signal);
      }
    }
    this.finished = eof;
    await writer?.close().catch((err: unknown) => logger.warn({ containerId, err: errorMessage(err) }, 'closing the log writer failed'));
  }
}

function delay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
