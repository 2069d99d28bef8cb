/**
 * What the output pump writes a container's output to: the CRI log file (`ContainerLogWriter`) or
 * the caller's FIFOs (`FifoSink`), one loop for both (`pump`). The agent's output is one byte
 * sequence with offsets; a sink takes chunks in order, stores them in batches, and says how far the
 * output is stored (`committedOffset`): only that is acknowledged to the agent, which keeps every
 * byte from its acknowledged offset on, so a broken stream resumes at `committedOffset` with
 * nothing lost.
 */
import type { LogStream } from './format.js';

/** A chunk of container output as the agent's StreamOutput sends it (enums as names). */
export interface OutputChunkLike {
  stream: LogStream | 'OUTPUT_STREAM_STDOUT' | 'OUTPUT_STREAM_STDERR' | 'OUTPUT_STREAM_UNSPECIFIED';
  /** Offset of data[0] in the container's output sequence. */
  offset: number;
  data: Uint8Array;
  eof?: boolean;
}

/** Whether a chunk is the container's stderr (everything else is stdout). */
export function isStderrChunk(chunk: OutputChunkLike): boolean {
  return chunk.stream === 'stderr' || chunk.stream === 'OUTPUT_STREAM_STDERR';
}

export interface OutputSink {
  /** Every output byte below this is stored: the offset to acknowledge and to resume at. */
  readonly committedOffset: number;
  /** The output's end was reached and is stored: nothing more will come. */
  readonly eof: boolean;
  /** Bytes held in memory, not yet handed to a write (the pump pulls no more past its bound). */
  readonly bufferedBytes: number;
  /** Whether `flush` has anything to store. */
  readonly dirty: boolean;
  /**
   * Take a chunk into the current batch (memory only). Bytes below what was already accepted are
   * skipped (a resumed stream may repeat them); a chunk starting past it is a gap: an error.
   */
  accept(chunk: OutputChunkLike): void;
  /** Store the batch; resolves to `committedOffset`. One at a time (the pump awaits each). */
  flush(): Promise<number>;
  /**
   * Whether the sink can take the resumed stream after the pump failed (the stream broke): the
   * FIFO sink can, and must (closing the FIFOs would end the reader's stream), until one of its
   * own writes failed; the log writer is reopened instead (`open` repairs a torn batch from its
   * state file).
   */
  readonly reusable: boolean;
  /** Store what can be stored and release the sink; never waits for a reader that does not read. */
  close(): Promise<void>;
}
