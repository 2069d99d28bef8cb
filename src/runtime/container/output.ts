/**
 * A running container's output, from the agent's StreamOutput into its sink (the CRI log file, or
 * the caller's FIFOs), across broken sessions and daemon restarts: the README's caller's sequence
 * in src/runtime/logs, with a retry whenever the stream ends early (the session went; StreamOutput
 * resumes from the sink's committed offset on the next one).
 */

import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { FifoSink } from '../logs/fifo-sink.js';
import { pump } from '../logs/pump.js';
import type { OutputChunkLike, OutputSink } from '../logs/sink.js';
import { ContainerLogWriter } from '../logs/writer.js';
import type { ContainerStdio } from './record.js';

const ACK_TIMEOUT_MS = 10_000;
const RETRY_DELAY_MS = 200;
/** How long a session may take to come back before the next attempt logs again. */
const READY_TIMEOUT_MS = 30_000;

export interface OutputPumpOptions {
  agent: AgentClient;
  containerId: string;
  /** The CRI log (at `logPath`; none when it is '': the output is read and dropped) or the caller's FIFOs. */
  stdio: ContainerStdio;
  logPath: string;
  statePath: string;
  tty: boolean;
  logger: Logger;
}

/**
 * One container's output pump. `done` settles when the output reached its end (eof stored) or the
 * pump was stopped; `reopen()` serves ReopenContainerLog.
 */
export class OutputPump {
  readonly done: Promise<void>;
  private writer: ContainerLogWriter | undefined;
  private readonly abort = new AbortController();
  private finished = false;
  /** Where a sink without a state file of its own resumes: the last one's committed offset. */
  private resumeAt: number | undefined;

  private constructor(private readonly opts: OutputPumpOptions) {
    this.done = this.run();
  }

  /** Start pumping (after a restart: resume from what the log state, or the agent, says). */
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

  /**
   * The sink for the next attempt. The log writer resumes from its state file; the others from
   * the last sink's offset or, first, from what the agent says it has acknowledged (after a
   * restart: the bytes below are gone from the agent and were stored before).
   */
  private async openSink(signal: AbortSignal): Promise<OutputSink> {
    const { agent, containerId, stdio } = this.opts;
    if (stdio.kind === 'cri-log' && this.opts.logPath !== '') {
      await fsp.mkdir(path.dirname(this.opts.statePath), { recursive: true, mode: 0o700 });
      const writer = await ContainerLogWriter.open({ logPath: this.opts.logPath, statePath: this.opts.statePath, tty: this.opts.tty });
      this.writer = writer;
      return writer;
    }
    if (this.resumeAt === undefined) {
      await agent.connection.ready(READY_TIMEOUT_MS, signal);
      const [state] = await agent.listContainers([containerId], { timeoutMs: ACK_TIMEOUT_MS, signal });
      this.resumeAt = state?.outputAckedOffset ?? 0;
    }
    if (stdio.kind === 'cri-log') return new DiscardSink(this.resumeAt);
    return FifoSink.open({ stdout: stdio.stdout, stderr: stdio.stderr, terminal: stdio.terminal, startOffset: this.resumeAt, signal });
  }

  private async run(): Promise<void> {
    const { agent, containerId, logger } = this.opts;
    const signal = this.abort.signal;
    const ack = (offset: number) => agent.ackOutput(containerId, offset, { timeoutMs: ACK_TIMEOUT_MS });
    let sink: OutputSink | undefined;
    let eof = false;
    let failures = 0;
    while (!eof && !signal.aborted) {
      try {
        sink ??= await this.openSink(signal);
        if (sink.eof) {
          eof = true;
          break;
        }
        await agent.connection.ready(READY_TIMEOUT_MS, signal);
        ({ eof } = await pump(sink, agent.streamOutput(containerId, sink.committedOffset, { signal }), ack));
        if (!eof) await delay(RETRY_DELAY_MS, signal);
      } catch (err) {
        if (signal.aborted) break;
        // Logged once per run of failures: a VM that is gone fails every attempt until the pump stops.
        if (failures++ === 0)
          logger.warn({ containerId, err: errorMessage(err) }, 'container output stream broke; resuming from the stored offset');
        if (sink !== undefined && !sink.reusable) {
          this.resumeAt = sink.committedOffset;
          await sink.close().catch(() => undefined);
          sink = undefined;
          this.writer = undefined;
        }
        await delay(Math.min(5000, RETRY_DELAY_MS * failures), signal);
      }
    }
    this.finished = eof;
    await sink?.close().catch((err: unknown) => logger.warn({ containerId, err: errorMessage(err) }, 'closing the output sink failed'));
  }
}

/**
 * No log path: the output is read and acknowledged (so the container never blocks on it) and
 * dropped.
 */
class DiscardSink implements OutputSink {
  private accepted: number;
  private committed: number;
  private eofSeen = false;
  private eofStored = false;
  readonly bufferedBytes = 0;
  readonly reusable = true;

  constructor(startOffset: number) {
    this.accepted = startOffset;
    this.committed = startOffset;
  }

  get committedOffset(): number {
    return this.committed;
  }

  get eof(): boolean {
    return this.eofStored;
  }

  get dirty(): boolean {
    return this.accepted !== this.committed || this.eofSeen !== this.eofStored;
  }

  accept(chunk: OutputChunkLike): void {
    this.accepted = Math.max(this.accepted, chunk.offset + chunk.data.byteLength);
    if (chunk.eof === true) this.eofSeen = true;
  }

  async flush(): Promise<number> {
    this.committed = this.accepted;
    this.eofStored = this.eofSeen;
    return this.committed;
  }

  async close(): Promise<void> {}
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
