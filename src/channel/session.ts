import { Buffer } from 'node:buffer';
import { randomBytes } from 'node:crypto';
import { exhausted, timedOut, unavailable } from '../common/errors.js';
import { decodeOpen, encodeFrame, encodeOpen, encodeReset, type Frame, FrameType, type HelloParams, ResetCode } from './frames.js';
import { ChannelStream, type StreamOwner } from './stream.js';

/** Where a session's bytes go. One link carries one session at a time. */
export interface Link {
  /** Hand bytes over; resolves when the link can take more, rejects when it is gone. */
  send(bytes: Buffer): Promise<void>;
}

export interface SessionOptions {
  /** The client (host) opens odd stream ids, the server (guest) even ones. */
  role: 'client' | 'server';
  /** What this side announced. */
  local: HelloParams;
  /** What the peer announced. */
  remote: HelloParams;
  link: Link;
}

/** Called for every stream the peer opens. */
export type StreamHandler = (stream: ChannelStream, method: string, timeoutMs: number) => void;

/**
 * Control frames (PONGs, RESETs, WINDOW_UPDATEs) queued and not yet taken by the link. Each
 * answers a frame of the peer, so a peer that sends PINGs or bad OPENs and never reads would
 * grow this queue without end; past the bound the session ends (CHANNEL_CONTROL_FLOOD). An
 * honest peer keeps a handful queued: 1 MiB is tens of thousands of frames.
 */
export const CONTROL_QUEUE_MAX_BYTES = 1024 * 1024;

/** Bytes the writer hands to the link at once: frames queued together go in one write. */
const BATCH_BYTES = 256 * 1024;

/**
 * One handshaken session over a link: the stream table, credits and the single writer that
 * interleaves streams round-robin (control frames first) and waits for the link between
 * batches, so nothing queues here beyond one frame per stream plus control frames. A session
 * never outlives its link: when the link goes (EOF, error, a new HELLO), `close` fails every
 * open stream with CHANNEL_SESSION_CLOSED and the next session starts from nothing.
 */
export class Session implements StreamOwner {
  private readonly streams = new Map<number, ChannelStream>();
  private readonly control: Buffer[] = [];
  private controlBytes = 0;
  private readonly ready = new Set<ChannelStream>();
  private readonly pings = new Map<string, (rttMs: number) => void>();
  /** Streams opened here beyond the peer's maxStreams: their OPEN waits for a free slot. */
  private readonly waiting: { stream: ChannelStream; open: Buffer }[] = [];
  private readonly unopened = new Set<ChannelStream>();
  private readonly deferred = new Set<ChannelStream>();
  private localOpen = 0;
  private nextId: number;
  private pumping = false;
  private closedFlag = false;
  private handler: StreamHandler | undefined;
  private readonly closeListeners = new Set<(err: Error) => void>();
  closeError: Error | undefined;

  constructor(readonly options: SessionOptions) {
    this.nextId = options.role === 'client' ? 1 : 2;
  }

  get closed(): boolean {
    return this.closedFlag;
  }

  /** Streams currently open (both directions). */
  get openStreams(): number {
    return this.streams.size;
  }

  /** Accept the streams the peer opens. */
  onStream(handler: StreamHandler): void {
    this.handler = handler;
  }

  onClose(listener: (err: Error) => void): () => void {
    if (this.closedFlag) {
      listener(this.closeError!);
      return () => {};
    }
    this.closeListeners.add(listener);
    return () => this.closeListeners.delete(listener);
  }

  /** Open a stream for `method`; the peer learns `timeoutMs` (0: none) so it can give up too. */
  open(method: string, timeoutMs = 0): ChannelStream {
    if (this.closedFlag) throw this.closeError ?? unavailable('CHANNEL_SESSION_CLOSED', 'the channel session is closed.');
    const id = this.nextId;
    this.nextId += 2;
    const stream = new ChannelStream(id, method, this, this.options.remote.initialWindowBytes, this.options.local.initialWindowBytes);
    this.streams.set(id, stream);
    const open = encodeFrame(FrameType.OPEN, id, encodeOpen(method, timeoutMs));
    if (this.localOpen >= this.options.remote.maxStreams) {
      this.unopened.add(stream);
      this.waiting.push({ stream, open });
    } else {
      this.localOpen += 1;
      this.sendControl(open);
    }
    return stream;
  }

  /** Round trip time of a PING, or a timeout KataError. */
  ping(timeoutMs: number): Promise<number> {
    if (this.closedFlag) return Promise.reject(this.closeError);
    const token = randomBytes(8);
    const started = performance.now();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pings.delete(token.toString('hex'));
        reject(timedOut('CHANNEL_PING_TIMEOUT', `the peer did not answer a ping within ${timeoutMs} ms.`));
      }, timeoutMs);
      this.pings.set(token.toString('hex'), () => {
        clearTimeout(timer);
        resolve(performance.now() - started);
      });
      this.sendControl(encodeFrame(FrameType.PING, 0, token));
    });
  }

  /** Feed one frame received from the peer. */
  onFrame(frame: Frame): void {
    if (this.closedFlag) return;
    const { type, streamId, payload } = frame;
    if (type === FrameType.PING) {
      this.sendControl(encodeFrame(FrameType.PONG, 0, payload));
      return;
    }
    if (type === FrameType.PONG) {
      this.pings.get(payload.toString('hex'))?.(0);
      this.pings.delete(payload.toString('hex'));
      return;
    }
    if (type === FrameType.OPEN) {
      this.onOpen(streamId, payload);
      return;
    }
    const stream = this.streams.get(streamId);
    // Frames for a stream we already closed or reset are late, not wrong.
    if (stream === undefined) return;
    if (type === FrameType.DATA) stream.onData(payload);
    else if (type === FrameType.WINDOW_UPDATE) stream.onWindowUpdate(payload);
    else if (type === FrameType.END) stream.onEnd();
    else if (type === FrameType.RESET) stream.onReset(payload);
  }

  /** End the session: every stream fails with `err`, nothing more is written. */
  close(err: Error): void {
    if (this.closedFlag) return;
    this.closedFlag = true;
    this.closeError = err;
    this.control.length = 0;
    this.controlBytes = 0;
    this.ready.clear();
    for (const stream of [...this.streams.values()]) stream.onSessionClosed(err);
    this.streams.clear();
    for (const listener of [...this.closeListeners]) listener(err);
    this.closeListeners.clear();
  }

  sendControl(frame: Buffer): void {
    if (this.closedFlag) return;
    if (this.controlBytes + frame.length > CONTROL_QUEUE_MAX_BYTES) {
      this.close(
        exhausted('CHANNEL_CONTROL_FLOOD', `over ${CONTROL_QUEUE_MAX_BYTES} bytes of control frames queued: the peer does not read.`),
      );
      return;
    }
    this.control.push(frame);
    this.controlBytes += frame.length;
    this.pump();
  }

  schedule(stream: ChannelStream): void {
    if (this.closedFlag) return;
    if (this.unopened.has(stream)) {
      this.deferred.add(stream);
      return;
    }
    this.ready.add(stream);
    this.pump();
  }

  forget(stream: ChannelStream): void {
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    this.ready.delete(stream);
    this.deferred.delete(stream);
    const localParity = this.options.role === 'client' ? 1 : 0;
    if (stream.id % 2 !== localParity) return;
    if (this.unopened.delete(stream)) {
      const at = this.waiting.findIndex((w) => w.stream === stream);
      if (at >= 0) this.waiting.splice(at, 1);
      return;
    }
    this.localOpen -= 1;
    const next = this.waiting.shift();
    if (next === undefined) return;
    this.unopened.delete(next.stream);
    this.localOpen += 1;
    this.sendControl(next.open);
    if (this.deferred.delete(next.stream)) this.schedule(next.stream);
  }

  private onOpen(streamId: number, payload: Buffer): void {
    const peerParity = this.options.role === 'client' ? 0 : 1;
    const open = decodeOpen(payload);
    if (streamId % 2 !== peerParity || this.streams.has(streamId) || open === undefined) {
      this.sendControl(encodeFrame(FrameType.RESET, streamId, encodeReset(ResetCode.PROTOCOL, 'bad OPEN frame')));
      return;
    }
    let peerOpened = 0;
    for (const id of this.streams.keys()) if (id % 2 === peerParity) peerOpened += 1;
    if (peerOpened >= this.options.local.maxStreams || this.handler === undefined) {
      this.sendControl(encodeFrame(FrameType.RESET, streamId, encodeReset(ResetCode.REFUSED, 'too many open streams')));
      return;
    }
    const stream = new ChannelStream(
      streamId,
      open.method,
      this,
      this.options.remote.initialWindowBytes,
      this.options.local.initialWindowBytes,
    );
    this.streams.set(streamId, stream);
    this.handler(stream, open.method, open.timeoutMs);
  }

  /** Collect what can be sent now: control frames, then one frame per ready stream, in turns. */
  private takeBatch(): Buffer[] {
    const out: Buffer[] = [];
    let bytes = 0;
    while (this.control.length > 0 && bytes < BATCH_BYTES) {
      const frame = this.control.shift()!;
      this.controlBytes -= frame.length;
      out.push(frame);
      bytes += frame.length;
    }
    while (bytes < BATCH_BYTES && this.ready.size > 0) {
      let progressed = false;
      for (const stream of [...this.ready]) {
        const frame = stream.hasWork() ? stream.nextFrame() : undefined;
        if (frame === undefined || !stream.hasWork()) this.ready.delete(stream);
        if (frame !== undefined) {
          out.push(frame);
          bytes += frame.length;
          progressed = true;
        }
        if (bytes >= BATCH_BYTES) break;
      }
      if (!progressed) break;
    }
    return out;
  }

  private pump(): void {
    if (this.pumping) return;
    this.pumping = true;
    void this.drain();
  }

  private async drain(): Promise<void> {
    try {
      for (;;) {
        // Let the writes of this tick gather into one batch.
        await new Promise<void>((resolve) => setImmediate(resolve));
        if (this.closedFlag) return;
        const batch = this.takeBatch();
        if (batch.length === 0) return;
        await this.options.link.send(batch.length === 1 ? batch[0]! : Buffer.concat(batch));
      }
    } catch (err) {
      this.close(unavailable('CHANNEL_LINK_LOST', 'the channel link failed while writing.', { cause: err }));
    } finally {
      this.pumping = false;
      if (!this.closedFlag && (this.control.length > 0 || this.ready.size > 0)) this.pump();
    }
  }
}
