/**
 * The server side of a SPDY/3.1 connection, as Go's spdystream (k8s.io/apimachinery's httpstream)
 * speaks it from the client end: the client opens every stream (SYN_STREAM with its headers), we
 * answer each with SYN_REPLY before any data, data flows both ways, FIN half-closes, RST_STREAM
 * cancels, PING is echoed, GOAWAY ends the connection.
 *
 * Flow control: our receive side grants WINDOW_UPDATEs (stream and session) as the consumer reads,
 * and when a stream's unread bytes pass its window the socket is paused (a peer that ignores
 * windows, as spdystream does, is slowed by TCP instead). Our send side keeps per-stream and
 * session send windows and waits on them once the peer shows it does flow control (a
 * WINDOW_UPDATE or SETTINGS_INITIAL_WINDOW_SIZE from it): spdystream never sends either, and a
 * window enforced against it would stall every stream at 64 KiB. Writes always wait for the
 * socket to drain, so a slow reader slows the writer either way.
 */
import { Buffer } from 'node:buffer';
import { EventEmitter } from 'node:events';
import { Duplex } from 'node:stream';
import { DEFAULT_WINDOW_BYTES, encodeFrame, FrameReader, RstStatus, SETTINGS_INITIAL_WINDOW_SIZE, type SpdyFrame } from './frames.js';
import { HeaderCompressor, HeaderDecompressor, type SpdyHeaders } from './headers.js';

/** Payload of the data frames we send: small enough to interleave streams. */
const DATA_FRAME_BYTES = 32 * 1024;

export interface SpdySessionOptions {
  /** Called for each new stream; false refuses it (RST_STREAM REFUSED_STREAM). */
  onStream: (stream: SpdyStream) => boolean;
  /** Streams open at once before new ones are refused. */
  maxStreams?: number;
}

/** One SPDY stream as a Duplex: readable = the peer's data, writable = ours (end() sends FIN). */
export class SpdyStream extends Duplex {
  sendWindow: number;
  private received = 0;
  private granted = 0;
  private remoteFin = false;
  private localFin = false;
  private windowWaiters: (() => void)[] = [];
  private markReplied!: () => void;
  /** Settles once our SYN_REPLY is written: nothing of ours may precede it. */
  readonly replied = new Promise<void>((resolve) => {
    this.markReplied = resolve;
  });

  constructor(
    readonly id: number,
    readonly headers: SpdyHeaders,
    private readonly session: SpdySession,
    initialSendWindow: number,
    readonly receiveWindow: number,
  ) {
    super({ allowHalfOpen: true, highWaterMark: receiveWindow });
    this.sendWindow = initialSendWindow;
  }

  /** First value of a header of the SYN_STREAM. */
  header(name: string): string | undefined {
    return this.headers.get(name.toLowerCase())?.[0];
  }

  /** @internal data from the peer. */
  deliver(data: Buffer, fin: boolean): void {
    if (this.remoteFin || this.destroyed) return;
    if (data.length > 0) {
      this.received += data.length;
      this.push(data);
      if (this.readableLength >= this.receiveWindow) this.session.pauseReading(this);
    }
    if (fin) {
      this.remoteFin = true;
      this.push(null);
      this.maybeDone();
    }
  }

  /** @internal our SYN_REPLY is out (or the stream is gone). */
  repliedNow(): void {
    this.markReplied();
  }

  /** @internal the peer's window grew. */
  grow(delta: number): void {
    this.sendWindow += delta;
    const waiters = this.windowWaiters;
    this.windowWaiters = [];
    for (const w of waiters) w();
  }

  /** @internal the peer reset the stream: no RST back. */
  reset(): void {
    this.remoteFin = true;
    this.localFin = true;
    this.destroy();
  }

  override _read(): void {
    this.session.resumeReading(this);
  }

  // Grants follow what the consumer took: read() is where both flowing mode and iteration take
  // data (_read alone is not called again until the next push).
  override read(size?: number): unknown {
    const chunk = super.read(size);
    const consumed = this.received - this.readableLength;
    const grant = consumed - this.granted;
    if (grant >= this.receiveWindow / 2 || (grant > 0 && this.readableLength === 0)) {
      this.granted += grant;
      this.session.grant(this.id, grant);
    }
    if (this.readableLength < this.receiveWindow) this.session.resumeReading(this);
    return chunk;
  }

  override async _write(chunk: Buffer, _enc: BufferEncoding, callback: (err?: Error | null) => void): Promise<void> {
    try {
      await this.replied;
      let at = 0;
      while (at < chunk.length) {
        const allowed = await this.session.sendAllowance(this);
        const n = Math.min(chunk.length - at, DATA_FRAME_BYTES, allowed);
        await this.session.writeData(this, chunk.subarray(at, at + n), false);
        at += n;
      }
      callback();
    } catch (err) {
      callback(err as Error);
    }
  }

  override async _final(callback: (err?: Error | null) => void): Promise<void> {
    try {
      await this.replied;
      this.localFin = true;
      await this.session.writeData(this, Buffer.alloc(0), true);
      this.maybeDone();
      callback();
    } catch (err) {
      callback(err as Error);
    }
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    if (!(this.localFin && this.remoteFin)) this.session.rst(this.id, RstStatus.CANCEL);
    this.localFin = this.remoteFin = true;
    for (const w of this.windowWaiters) w();
    this.windowWaiters = [];
    this.markReplied();
    this.session.forget(this);
    callback(err);
  }

  /** @internal wait until the send window opens (or the stream goes). */
  waitWindow(): Promise<void> {
    return new Promise((resolve) => this.windowWaiters.push(resolve));
  }

  private maybeDone(): void {
    if (this.localFin && this.remoteFin) this.session.forget(this);
  }
}

/** One upgraded connection. Emits 'close' once the socket is gone. */
export class SpdySession extends EventEmitter {
  private readonly reader = new FrameReader();
  private readonly compressor = new HeaderCompressor();
  private readonly decompressor = new HeaderDecompressor();
  private readonly streams = new Map<number, SpdyStream>();
  private readonly paused = new Set<SpdyStream>();
  private inChain: Promise<void> = Promise.resolve();
  private lastStreamId = 0;
  private initialSendWindow = DEFAULT_WINDOW_BYTES;
  private sessionSendWindow = DEFAULT_WINDOW_BYTES;
  private sessionWindowWaiters: (() => void)[] = [];
  /** The peer sent a WINDOW_UPDATE or an initial window: it does flow control. */
  private peerFlowControl = false;
  private peerSessionFlowControl = false;
  private closed = false;

  constructor(
    private readonly socket: Duplex,
    private readonly options: SpdySessionOptions,
  ) {
    super();
    socket.on('data', (chunk: Buffer) => {
      let frames: SpdyFrame[];
      try {
        frames = this.reader.push(chunk);
      } catch {
        this.goaway(1);
        return;
      }
      for (const frame of frames) this.inChain = this.inChain.then(() => this.handle(frame)).catch(() => this.goaway(1));
    });
    socket.on('error', () => {});
    socket.on('close', () => this.teardown());
    socket.on('end', () => this.teardown());
  }

  /** Streams open now. */
  get openStreams(): number {
    return this.streams.size;
  }

  /** End the connection: GOAWAY, then close the socket once what was written is flushed. */
  close(): void {
    if (this.closed) return;
    this.goaway(0);
  }

  private goaway(status: number): void {
    if (this.closed) return;
    this.write(encodeFrame({ type: 'goaway', lastGoodStreamId: this.lastStreamId, status }));
    this.socket.end();
    this.teardown();
  }

  private teardown(): void {
    if (this.closed) return;
    this.closed = true;
    for (const s of [...this.streams.values()]) s.reset();
    this.streams.clear();
    for (const w of this.sessionWindowWaiters) w();
    this.compressor.close();
    this.decompressor.close();
    // Upgraded HTTP sockets allow half-open: our side must end too, or the peer's EOF hangs.
    if (!this.socket.writableEnded) this.socket.end();
    queueMicrotask(() => this.emit('close'));
    setTimeout(() => this.socket.destroy(), 5000).unref();
  }

  private async handle(frame: SpdyFrame): Promise<void> {
    if (this.closed) return;
    switch (frame.type) {
      case 'syn_stream': {
        const headers = await this.decompressor.decompress(frame.headerBlock);
        if (frame.streamId <= this.lastStreamId || frame.streamId % 2 === 0) {
          this.rst(frame.streamId, RstStatus.PROTOCOL_ERROR);
          return;
        }
        this.lastStreamId = frame.streamId;
        if (this.streams.size >= (this.options.maxStreams ?? 64)) {
          this.rst(frame.streamId, RstStatus.REFUSED_STREAM);
          return;
        }
        const stream = new SpdyStream(frame.streamId, headers, this, this.initialSendWindow, DEFAULT_WINDOW_BYTES);
        this.streams.set(frame.streamId, stream);
        if (!this.options.onStream(stream)) {
          this.streams.delete(frame.streamId);
          this.rst(frame.streamId, RstStatus.REFUSED_STREAM);
          return;
        }
        // SYN_REPLY goes out before any data of ours: spdystream drops data on an unreplied stream.
        this.write(
          encodeFrame({ type: 'syn_reply', streamId: frame.streamId, fin: false, headerBlock: await this.compressor.compress([]) }),
        );
        stream.repliedNow();
        if (frame.fin) stream.deliver(Buffer.alloc(0), true);
        return;
      }
      case 'data': {
        const stream = this.streams.get(frame.streamId);
        if (stream === undefined) return;
        stream.deliver(frame.data, frame.fin);
        return;
      }
      case 'headers':
        await this.decompressor.decompress(frame.headerBlock);
        if (frame.fin) this.streams.get(frame.streamId)?.deliver(Buffer.alloc(0), true);
        return;
      case 'syn_reply':
        await this.decompressor.decompress(frame.headerBlock);
        return;
      case 'rst_stream':
        this.streams.get(frame.streamId)?.reset();
        return;
      case 'ping':
        this.write(encodeFrame(frame));
        return;
      case 'goaway':
        this.socket.end();
        this.teardown();
        return;
      case 'window_update':
        this.peerFlowControl = true;
        if (frame.streamId === 0) {
          this.peerSessionFlowControl = true;
          this.sessionSendWindow += frame.delta;
          const waiters = this.sessionWindowWaiters;
          this.sessionWindowWaiters = [];
          for (const w of waiters) w();
        } else this.streams.get(frame.streamId)?.grow(frame.delta);
        return;
      case 'settings':
        for (const e of frame.entries) {
          if (e.id !== SETTINGS_INITIAL_WINDOW_SIZE) continue;
          this.peerFlowControl = true;
          const diff = e.value - this.initialSendWindow;
          this.initialSendWindow = e.value;
          for (const s of this.streams.values()) s.grow(diff);
        }
        return;
      case 'unknown':
        return;
    }
  }

  /** @internal how many bytes `stream` may send now (waits while the windows are shut). */
  async sendAllowance(stream: SpdyStream): Promise<number> {
    for (;;) {
      if (this.closed || stream.destroyed) throw new Error('the SPDY stream is closed');
      if (!this.peerFlowControl) return DATA_FRAME_BYTES;
      const session = this.peerSessionFlowControl ? this.sessionSendWindow : DATA_FRAME_BYTES;
      const allowed = Math.min(stream.sendWindow, session);
      if (allowed > 0) return allowed;
      if (stream.sendWindow <= 0) await stream.waitWindow();
      else await new Promise<void>((resolve) => this.sessionWindowWaiters.push(resolve));
    }
  }

  /** @internal one data frame; resolves when the socket took it (backpressure). */
  async writeData(stream: SpdyStream, data: Buffer, fin: boolean): Promise<void> {
    if (this.closed) throw new Error('the SPDY connection is closed');
    stream.sendWindow -= data.length;
    if (this.peerSessionFlowControl) this.sessionSendWindow -= data.length;
    if (!this.write(encodeFrame({ type: 'data', streamId: stream.id, fin, data }))) {
      await new Promise<void>((resolve) => {
        const done = () => {
          this.socket.off('drain', done);
          this.socket.off('close', done);
          resolve();
        };
        this.socket.on('drain', done);
        this.socket.on('close', done);
      });
    }
  }

  /** @internal WINDOW_UPDATE for bytes a stream's consumer took, on the stream and the session. */
  grant(streamId: number, bytes: number): void {
    if (this.closed || bytes <= 0) return;
    this.write(encodeFrame({ type: 'window_update', streamId, delta: bytes }));
    this.write(encodeFrame({ type: 'window_update', streamId: 0, delta: bytes }));
  }

  /** @internal */
  rst(streamId: number, status: number): void {
    if (!this.closed) this.write(encodeFrame({ type: 'rst_stream', streamId, status }));
  }

  /** @internal a stream was done with (both halves closed, reset, or destroyed). */
  forget(stream: SpdyStream): void {
    if (this.streams.get(stream.id) === stream) this.streams.delete(stream.id);
    this.resumeReading(stream);
  }

  /** @internal a stream's consumer fell a window behind: stop reading the socket. */
  pauseReading(stream: SpdyStream): void {
    this.paused.add(stream);
    this.socket.pause();
  }

  /** @internal */
  resumeReading(stream: SpdyStream): void {
    if (this.paused.delete(stream) && this.paused.size === 0 && !this.closed) this.socket.resume();
  }

  private write(bytes: Buffer): boolean {
    if (this.socket.destroyed || this.socket.writableEnded) return true;
    return this.socket.write(bytes);
  }
}
