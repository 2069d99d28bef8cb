/**
 * The loop that moves one container's output from the agent to its sink (the CRI log file, or the
 * caller's FIFOs; `sink.ts`): pull chunks, take them into a batch, store the batch, acknowledge. While a batch is being written the next one
 * gathers in memory, so many chunks become one write; once `maxBufferedBytes` of records wait, no
 * more chunks are pulled until the write finishes. Pulling less is what throttles the container:
 * the channel's flow control stops the agent's stream, the agent's bounded buffer of unacknowledged
 * output fills, and the agent stops reading the container's pipes.
 */
import type { OutputChunkLike, OutputSink } from './sink.js';

/** Records gathered while a write is in flight before pulling pauses. */
export const DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024;

export interface PumpOptions {
  /**
   * Bound on formatted bytes waiting in memory. Memory held is at most about twice this (the batch
   * being written and the one gathering) plus the records of one chunk.
   */
  maxBufferedBytes?: number;
}

export interface PumpResult {
  /** Stored and acknowledged up to here. */
  committedOffset: number;
  /** The output reached its end (the last chunk said eof); false when the source just stopped. */
  eof: boolean;
}

type Step = { kind: 'chunk'; result: IteratorResult<OutputChunkLike> } | { kind: 'written' };

/**
 * Run until the output's end (a chunk with eof) or the source ends; a sink that already stored
 * the end returns at once without pulling. `ack(offset)` runs after the sink stored everything
 * below that offset, never before, and once at the start for what the sink already stored. Errors
 * from the source, the sink or `ack` reject; the sink's `committedOffset` is then still a correct
 * place to resume from (for the log writer: reopen it with `ContainerLogWriter.open`, which repairs
 * the file from its state, and StreamOutput from its `committedOffset`).
 */
export async function pump(
  sink: OutputSink,
  source: AsyncIterable<OutputChunkLike>,
  ack: (offset: number) => Promise<void>,
  opts: PumpOptions = {},
): Promise<PumpResult> {
  const limit = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
  // The agent may not have heard of what is already stored (a crash between the state write and
  // the acknowledgement): say it first. Acknowledging twice is harmless.
  let acked = sink.committedOffset;
  if (acked > 0) await ack(acked);
  if (sink.eof) return { committedOffset: acked, eof: true };
  const it = source[Symbol.asyncIterator]();
  let next: Promise<IteratorResult<OutputChunkLike>> | undefined;
  let inflight: Promise<void> | undefined;
  let sourceDone = false;
  let eof = false;
  const store = async (): Promise<void> => {
    const offset = await sink.flush();
    if (offset > acked) {
      await ack(offset);
      acked = offset;
    }
  };
  try {
    for (;;) {
      if (!sourceDone && next === undefined && sink.bufferedBytes < limit) next = it.next();
      if (inflight === undefined && sink.dirty) inflight = store();
      if (next === undefined && inflight === undefined) break;
      const racers: Promise<Step>[] = [];
      if (next !== undefined) racers.push(next.then((result) => ({ kind: 'chunk', result })));
      if (inflight !== undefined) racers.push(inflight.then(() => ({ kind: 'written' })));
      const step = await Promise.race(racers);
      if (step.kind === 'written') {
        inflight = undefined;
        continue;
      }
      next = undefined;
      if (step.result.done === true) {
        sourceDone = true;
        continue;
      }
      sink.accept(step.result.value);
      if (step.result.value.eof === true) {
        eof = true;
        sourceDone = true;
      }
    }
  } finally {
    // Never leave a write or a pull to fail unobserved, and release the source. Not awaited: an
    // async generator runs `return` only after a pending `next`, which may wait for output forever.
    await inflight?.catch(() => undefined);
    next?.catch(() => undefined);
    if (!sourceDone || eof) it.return?.()?.catch(() => undefined);
  }
  return { committedOffset: acked, eof };
}
