/**
 * A container's output through the reaper's spool file (guest/agent/containers/native/reaper.c,
 * `-s`): the reaper, not the agent, holds the container's pipes and appends frames to the file,
 * so an agent that dies and restarts loses nothing: the new agent resumes at the position the
 * host had acknowledged, which this side keeps in `<spool>.ack` ("DATA_OFFSET FILE_OFFSET").
 * The reaper reads the same file to bound the unacknowledged part and release the rest.
 *
 * Frame: 1 byte stream (1 stdout, 2 stderr, 255 end of output), 4 bytes length (big endian), data.
 */
import { Buffer } from 'node:buffer';
import { type FSWatcher, readFileSync, watch } from 'node:fs';
import { type FileHandle, open, writeFile } from 'node:fs/promises';
import type { OutputStream } from '../../src/generated/agent/agent.js';
import { OutputJournal } from './output-journal.js';

const HEADER_BYTES = 5;
const STREAMS: Record<number, OutputStream> = { 1: 'OUTPUT_STREAM_STDOUT', 2: 'OUTPUT_STREAM_STDERR' };
const END = 255;
/** Checked this often as well as on inotify events (a missed event must not stall the output). */
const POLL_MS = 1000;
/** The acknowledged position is written this long after an acknowledgement, or at once after this much progress. */
const ACK_WRITE_DELAY_MS = 250;
const ACK_WRITE_BYTES = 256 * 1024;

export interface SpoolPosition {
  /** Offset in the journal's numbering (output bytes only). */
  data: number;
  /** Offset in the spool file (frames). */
  file: number;
}

/** One parsed frame of a buffer, or undefined when the buffer holds only part of one. */
export function parseFrame(buf: Buffer, at: number): { stream: number; data: Buffer; size: number } | undefined {
  if (buf.length - at < HEADER_BYTES) return undefined;
  const length = buf.readUInt32BE(at + 1);
  if (buf.length - at - HEADER_BYTES < length) return undefined;
  return { stream: buf[at]!, data: buf.subarray(at + HEADER_BYTES, at + HEADER_BYTES + length), size: HEADER_BYTES + length };
}

/** The acknowledged position a previous agent stored, or the start. */
export function readSpoolAck(spoolPath: string): SpoolPosition {
  try {
    const [data, file] = readFileSync(`${spoolPath}.ack`, 'utf8').trim().split(' ').map(Number);
    if (Number.isSafeInteger(data) && Number.isSafeInteger(file) && data! >= 0 && file! >= 0) return { data: data!, file: file! };
  } catch {
    // no acknowledgement yet
  }
  return { data: 0, file: 0 };
}

/**
 * A journal fed from the spool file, starting at the stored acknowledged position. Reads only
 * while the journal has room (the reaper then stops reading the container, which blocks).
 */
export function spoolJournal(spoolPath: string, limitBytes: number): OutputJournal {
  const start = readSpoolAck(spoolPath);
  const journal = new OutputJournal([], limitBytes, start.data);
  const tail = new SpoolTail(spoolPath, start, journal);
  journal.onAck((offset) => tail.acked(offset));
  journal.onClose(() => tail.close());
  tail.start();
  return journal;
}

class SpoolTail {
  private readonly feed: ReturnType<OutputJournal['openFeed']>;
  /** Start of each frame fed and not yet wholly acknowledged. */
  private readonly frames: SpoolPosition[] = [];
  private fd: FileHandle | undefined;
  private pending = Buffer.alloc(0);
  private chunk: Buffer | undefined;
  private filePos: number;
  private dataPos: number;
  private reading = false;
  private again = false;
  private stopped = false;
  private closed = false;
  private watcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private ackWrite: Promise<void> = Promise.resolve();
  private ackWanted: SpoolPosition | undefined;
  private ackTimer: NodeJS.Timeout | undefined;
  private ackStored = 0;

  constructor(
    private readonly spoolPath: string,
    start: SpoolPosition,
    private readonly journal: OutputJournal,
  ) {
    this.feed = journal.openFeed();
    this.filePos = start.file;
    this.dataPos = start.data;
    this.ackStored = start.data;
  }

  start(): void {
    try {
      this.watcher = watch(this.spoolPath, () => this.kick());
      this.watcher.on('error', () => {});
    } catch {
      // no inotify: the timer alone
    }
    this.timer = setInterval(() => this.kick(), POLL_MS);
    this.timer.unref();
    this.kick();
  }

  /**
   * The journal is closed (the container is being deleted): stop reading, and write no
   * acknowledged position any more, since a late write would recreate `.ack` in a bundle that
   * DeleteContainer is removing (found by the soak: ENOTEMPTY from rm).
   */
  close(): void {
    this.closed = true;
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    this.ackWanted = undefined;
    this.stop();
  }

  /** Stop reading (the end frame, or close()); acknowledgements are still stored until close(). */
  stop(): void {
    this.stopped = true;
    this.watcher?.close();
    clearInterval(this.timer);
    void this.fd?.close().catch(() => {});
    this.fd = undefined;
    this.feed.end();
  }

  /** The host stored everything below `dataOffset`: remember the last frame start at or below it. */
  acked(dataOffset: number): void {
    if (dataOffset === this.dataPos) {
      // Everything fed is stored: the exact frame boundary after it.
      this.frames.length = 0;
      this.storeAck({ data: this.dataPos, file: this.filePos });
      this.kick();
      return;
    }
    let last: SpoolPosition | undefined;
    while (this.frames.length > 0 && this.frames[0]!.data <= dataOffset) last = this.frames.shift();
    if (last !== undefined) {
      // The frame `last` starts may be partly acknowledged: it stays first, to be re-sent whole.
      this.frames.unshift(last);
      this.storeAck(last);
    }
    this.kick();
  }

  /**
   * Remember the position, written at most every ACK_WRITE_DELAY_MS or ACK_WRITE_BYTES of
   * progress: the host acknowledges every flush (a line at a time for a slow writer), and a file
   * write per line costs the guest's one emulated vCPU. An older stored position only means a
   * restarted agent re-sends a little more (the host drops what it has), and the reaper, which
   * releases spool space up to the stored position, sees progress a little later.
   */
  private storeAck(pos: SpoolPosition): void {
    this.ackWanted = pos;
    if (pos.data - this.ackStored >= ACK_WRITE_BYTES) {
      this.flushAck();
      return;
    }
    if (this.ackTimer === undefined) {
      this.ackTimer = setTimeout(() => this.flushAck(), ACK_WRITE_DELAY_MS);
      this.ackTimer.unref();
    }
  }

  private flushAck(): void {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    const want = this.ackWanted;
    if (want === undefined || this.closed) return;
    this.ackWanted = undefined;
    this.ackStored = want.data;
    // One write at a time, in order.
    this.ackWrite = this.ackWrite.then(() => writeFile(`${this.spoolPath}.ack`, `${want.data} ${want.file}\n`).catch(() => {}));
  }

  private kick(): void {
    if (this.stopped) return;
    if (this.reading) {
      this.again = true;
      return;
    }
    this.reading = true;
    void this.read()
      .catch(() => {})
      .finally(() => {
        this.reading = false;
        if (this.again) {
          this.again = false;
          this.kick();
        }
      });
  }

  private async read(): Promise<void> {
    this.fd ??= await open(this.spoolPath, 'r');
    // One buffer per tail, reused: a zero-filled 64 KiB per read costs under TCG (pending copies).
    this.chunk ??= Buffer.allocUnsafe(64 * 1024);
    const chunk = this.chunk;
    while (!this.stopped) {
      // Frames already read come first: the bound may have stopped us in the middle of them.
      let at = 0;
      for (let f = parseFrame(this.pending, at); f !== undefined && this.journal.hasRoom; f = parseFrame(this.pending, at)) {
        if (f.stream === END) {
          // Positions stay paired (data offset, file offset) for the acknowledgements to come.
          this.filePos += at;
          this.pending = Buffer.alloc(0);
          this.stop();
          return;
        }
        const stream = STREAMS[f.stream];
        if (stream !== undefined && f.data.length > 0) {
          this.frames.push({ data: this.dataPos, file: this.filePos + at });
          this.feed.push(stream, Buffer.from(f.data));
          this.dataPos += f.data.length;
        }
        at += f.size;
      }
      this.filePos += at;
      this.pending = this.pending.subarray(at);
      if (!this.journal.hasRoom) return;
      const { bytesRead } = await this.fd.read(chunk, 0, chunk.length, this.filePos + this.pending.length);
      if (bytesRead === 0) return;
      this.pending = Buffer.concat([this.pending, chunk.subarray(0, bytesRead)]);
    }
  }
}
