import type { Buffer } from 'node:buffer';
import { Duplex } from 'node:stream';
import { cancelled, isKataError, KataError, timedOut, unavailable } from '../common/errors.js';
import { decodeReset, encodeFrame, encodeReset, encodeU32, FrameType, MAX_FRAME_PAYLOAD_BYTES, ResetCode } from './frames.js';

/** What a stream needs from its session (kept narrow so the two files stay apart). */
export interface StreamOwner {
  readonly closed: boolean;
  /** Queue a control frame (ahead of data). */
  sendControl(frame: Buffer): void;
  /** This stream has data or an END it could send now. */
  schedule(stream: ChannelStream): void;
  /** The stream is done with the wire: forget its id. */
  forget(stream: ChannelStream): void;
}

/** The error a RESET frame stands for on the side that receives it. */
export function resetError(code: number, message: string): KataError {
  const text = message || 'the peer reset the stream';
  if (code === ResetCode.TIMEOUT) return timedOut('CHANNEL_STREAM_TIMEOUT', text);
  if (code === ResetCode.CANCELLED) return cancelled('CHANNEL_STREAM_CANCELLED', text);
  if (code === ResetCode.SESSION_CLOSED) return unavailable('CHANNEL_SESSION_CLOSED', text);
  if (code === ResetCode.REFUSED) return unavailable('CHANNEL_STREAM_REFUSED', text);
  return new KataError('internal', 'CHANNEL_STREAM_RESET', text, { details: { code } });
}

function resetCodeOf(err: Error): number {
  if (isKataError(err) && err.kind === 'timeout') return ResetCode.TIMEOUT;
  if (isKataError(err) && err.kind === 'cancelled') return ResetCode.CANCELLED;
  return ResetCode.INTERNAL;
}

/**
 * One multiplexed stream: a byte Duplex. Writing waits for the peer's credits (a peer that stops
 * reading stops this writer once its window is used up); reading grants the peer new credits as
 * the consumer takes bytes out of the readable buffer, never beyond the window, so inbound bytes
 * buffered here stay below `windowBytes`. `end()` sends END (half-close); `destroy(err)` sends
 * RESET, and a RESET from the peer destroys this stream with the matching KataError.
 */
export class ChannelStream extends Duplex {
  private sendCredit: number;
  private pending: { chunk: Buffer; offset: number; cb: (err?: Error | null) => void } | undefined;
  private finalCb: ((err?: Error | null) => void) | undefined;
  private endSent = false;
  private remoteEnded = false;
  private resetSeen = false;
  private received = 0;
  private granted: number;
  /** Received bytes not yet handed to node's readable buffer (which is kept small). */
  private readonly inbound: Buffer[] = [];
  private inboundBytes = 0;
  private wantData = false;
  private nullPushed = false;

  constructor(
    readonly id: number,
    /** The call this stream carries (OPEN's method name). */
    readonly method: string,
    private readonly owner: StreamOwner,
    peerWindowBytes: number,
    private readonly windowBytes: number,
  ) {
    super({ allowHalfOpen: true, readableHighWaterMark: READABLE_BUFFER_BYTES, writableHighWaterMark: MAX_FRAME_PAYLOAD_BYTES });
    this.sendCredit = peerWindowBytes;
    this.granted = windowBytes;
    // A peer's RESET must never end the agent or the daemon as an unheard 'error' event; the
    // error still reaches whoever reads (the iterator throws), writes (the callback) or waits
    // for 'close' (stream.errored).
    this.on('error', () => {});
  }

  /** Bytes the peer may still send before it must wait for credits (for tests and metrics). */
  get peerCreditBytes(): number {
    return this.granted - this.received;
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    if (this.owner.closed) {
      cb(unavailable('CHANNEL_SESSION_CLOSED', 'the channel session is closed.'));
      return;
    }
    this.pending = { chunk, offset: 0, cb };
    this.owner.schedule(this);
  }

  override _final(cb: (err?: Error | null) => void): void {
    this.finalCb = cb;
    this.owner.schedule(this);
  }

  override _read(): void {
    this.wantData = true;
    this.flush();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    const done = this.endSent && this.remoteEnded;
    if (!done && !this.resetSeen && !this.owner.closed) {
      const why = err ?? cancelled('CHANNEL_STREAM_CANCELLED', 'the stream was closed before it ended.');
      this.owner.sendControl(encodeFrame(FrameType.RESET, this.id, encodeReset(resetCodeOf(why), why.message)));
    }
    const pending = this.pending;
    this.pending = undefined;
    pending?.cb(err ?? cancelled('CHANNEL_STREAM_CANCELLED', 'the stream was destroyed.'));
    this.owner.forget(this);
    cb(err);
  }

  /** True when the session may take a frame from this stream now. */
  hasWork(): boolean {
    if (this.destroyed) return false;
    if (this.pending !== undefined) return this.sendCredit > 0;
    return this.finalCb !== undefined && !this.endSent;
  }

  /** The next frame to send, within credits; undefined when there is none. */
  nextFrame(): Buffer | undefined {
    const p = this.pending;
    if (p !== undefined) {
      const n = Math.min(this.sendCredit, MAX_FRAME_PAYLOAD_BYTES, p.chunk.length - p.offset);
      if (n <= 0) return undefined;
      const frame = encodeFrame(FrameType.DATA, this.id, p.chunk.subarray(p.offset, p.offset + n));
      this.sendCredit -= n;
      p.offset += n;
      if (p.offset >= p.chunk.length) {
        this.pending = undefined;
        queueMicrotask(() => p.cb());
      }
      return frame;
    }
    const finalCb = this.finalCb;
    if (finalCb !== undefined && !this.endSent) {
      this.endSent = true;
      queueMicrotask(() => {
        finalCb();
        this.settleIfDone();
      });
      return encodeFrame(FrameType.END, this.id);
    }
    return undefined;
  }

  onData(payload: Buffer): void {
    if (this.remoteEnded || this.destroyed) return;
    this.received += payload.length;
    if (this.received > this.granted) {
      this.destroy(new KataError('internal', 'CHANNEL_FLOW_CONTROL', 'the peer sent more than its credits allow.'));
      return;
    }
    this.inbound.push(payload);
    this.inboundBytes += payload.length;
    this.flush();
  }

  onWindowUpdate(payload: Buffer): void {
    if (payload.length < 4) return;
    this.sendCredit += payload.readUInt32BE(0);
    if (this.hasWork()) this.owner.schedule(this);
  }

  onEnd(): void {
    if (this.remoteEnded) return;
    this.remoteEnded = true;
    this.flush();
    this.settleIfDone();
  }

  onReset(payload: Buffer): void {
    const { code, message } = decodeReset(payload);
    this.resetSeen = true;
    this.destroy(resetError(code, message));
  }

  /** The session went away under this stream. */
  onSessionClosed(err: Error): void {
    this.resetSeen = true;
    this.destroy(err);
  }

  /**
   * Hand queued bytes to node as fast as the consumer takes them, and grant the peer what left
   * the queue. Node's own readable buffer is not watched (it does not say when a consumer
   * drained it); it is kept at READABLE_BUFFER_BYTES, so what one stream holds stays below
   * windowBytes + READABLE_BUFFER_BYTES + one frame.
   */
  private flush(): void {
    if (this.destroyed) return;
    while (this.wantData && this.inbound.length > 0) {
      const chunk = this.inbound.shift()!;
      this.inboundBytes -= chunk.length;
      this.wantData = this.push(chunk);
    }
    if (this.remoteEnded && this.inbound.length === 0 && !this.nullPushed) {
      this.nullPushed = true;
      this.push(null);
    }
    this.maybeGrant();
  }

  private maybeGrant(): void {
    if (this.remoteEnded || this.destroyed) return;
    const avail = this.windowBytes - this.inboundBytes - (this.granted - this.received);
    // Batch small grants: a WINDOW_UPDATE per tiny read would cost more than the data.
    if (avail <= 0 || avail < Math.min(this.windowBytes / 4, 16 * 1024)) return;
    this.granted += avail;
    this.owner.sendControl(encodeFrame(FrameType.WINDOW_UPDATE, this.id, encodeU32(avail)));
  }

  private settleIfDone(): void {
    if (this.endSent && this.remoteEnded) this.owner.forget(this);
  }
}

/** Node's readable buffer per stream; the window is held in the stream's own queue. */
const READABLE_BUFFER_BYTES = 64 * 1024;
