import type { Buffer } from 'node:buffer';
import { randomBytes } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { cancelled, exhausted, timedOut, unavailable } from '../common/errors.js';
import {
  ANNOUNCE_NONCE,
  decodeHello,
  encodeHello,
  type Frame,
  FrameDecoder,
  FrameType,
  type HelloParams,
  PROTOCOL_VERSION,
} from './frames.js';
import { type Link, Session } from './session.js';

/** Per-side limits announced in HELLO. */
export interface ChannelLimits {
  /** Receive window per stream: the most bytes one stream may buffer here. */
  initialWindowBytes: number;
  /** Streams the peer may have open toward this side at once. */
  maxStreams: number;
}

/** Worst-case inbound buffering is initialWindowBytes x maxStreams; both are small on purpose. */
export const DEFAULT_LIMITS: ChannelLimits = { initialWindowBytes: 256 * 1024, maxStreams: 256 };

/**
 * Bytes a connecting host accepts before the HELLO_ACK that answers it. An honest guest sends at
 * most the tail of an older session it had blocked in writing (one writer batch of 256 KiB and
 * what its streams still had credit for) before it reads our HELLO; a peer that keeps sending
 * past this is flooding, and the attempt fails with CHANNEL_HELLO_FLOOD instead of hunting on.
 */
export const HELLO_FLOOD_MAX_BYTES = 4 * 1024 * 1024;

/** A Link over a node Duplex (the host's unix socket to QEMU's chardev, or a test pair). */
export function duplexLink(duplex: Duplex): Link {
  return {
    send: (bytes) =>
      new Promise<void>((resolve, reject) => {
        if (duplex.destroyed || duplex.writableEnded) {
          reject(unavailable('CHANNEL_LINK_CLOSED', 'the channel link is closed.'));
          return;
        }
        const ok = duplex.write(bytes, (err) => {
          if (err) reject(err);
        });
        if (ok) return resolve();
        const onDrain = (): void => {
          duplex.off('close', onClose);
          resolve();
        };
        const onClose = (): void => {
          duplex.off('drain', onDrain);
          reject(unavailable('CHANNEL_LINK_CLOSED', 'the channel link closed while writing.'));
        };
        duplex.once('drain', onDrain);
        duplex.once('close', onClose);
      }),
  };
}

export interface ConnectOptions {
  limits?: ChannelLimits;
  /** Give up after this long without a HELLO_ACK. */
  timeoutMs: number;
  /** HELLO is repeated this often until answered (200 ms): a HELLO sent before the agent opened its port is lost, so this bounds how long a booting VM waits after its agent starts. */
  helloIntervalMs?: number;
  /** Bytes accepted before the HELLO_ACK (HELLO_FLOOD_MAX_BYTES); tests pass less. */
  helloFloodMaxBytes?: number;
  signal?: AbortSignal;
}

/**
 * The host side: send HELLO over `duplex` until the guest answers with a HELLO_ACK that echoes
 * this attempt's nonce (anything before it, such as the tail of an older session the guest had
 * blocked in writing, is discarded, up to HELLO_FLOOD_MAX_BYTES), then run a Session until the
 * duplex closes.
 */
export function connectSession(duplex: Duplex, options: ConnectOptions): Promise<Session> {
  const limits = options.limits ?? DEFAULT_LIMITS;
  const local: HelloParams = { version: PROTOCOL_VERSION, ...limits, nonce: randomBytes(16) };
  const link = duplexLink(duplex);
  const decoder = new FrameDecoder();
  const floodMaxBytes = options.helloFloodMaxBytes ?? HELLO_FLOOD_MAX_BYTES;
  let bytesBeforeAck = 0;
  let session: Session | undefined;
  return new Promise<Session>((resolve, reject) => {
    const hello = encodeHello(FrameType.HELLO, local);
    const sendHello = (): void => {
      link.send(hello).catch(() => {});
    };
    const cleanup = (): void => {
      clearInterval(repeat);
      clearTimeout(deadline);
      options.signal?.removeEventListener('abort', onAbort);
    };
    const fail = (err: Error): void => {
      cleanup();
      duplex.off('data', onData);
      reject(err);
    };
    const onAbort = (): void => fail(cancelled('CHANNEL_CONNECT_ABORTED', 'connecting to the agent was aborted.'));
    const repeat = setInterval(sendHello, options.helloIntervalMs ?? 200);
    const deadline = setTimeout(
      () => fail(timedOut('CHANNEL_HELLO_TIMEOUT', `the agent did not answer HELLO within ${options.timeoutMs} ms.`)),
      options.timeoutMs,
    );
    options.signal?.addEventListener('abort', onAbort, { once: true });
    const onFrame = (frame: Frame): void => {
      if (session !== undefined) {
        if (frame.type === FrameType.HELLO_ACK && decodeHello(frame.payload)?.nonce.equals(ANNOUNCE_NONCE)) {
          // The agent started afresh (QEMU's socket stayed up): this session's peer is gone.
          session.close(unavailable('CHANNEL_PEER_RESTARTED', 'the agent restarted.'));
          duplex.destroy();
          return;
        }
        session.onFrame(frame);
        return;
      }
      if (frame.type !== FrameType.HELLO_ACK) return;
      const remote = decodeHello(frame.payload);
      if (remote === undefined || !remote.nonce.equals(local.nonce)) return; // an answer to someone else's HELLO
      if (remote.version !== PROTOCOL_VERSION) {
        fail(unavailable('CHANNEL_VERSION_MISMATCH', `the agent speaks channel protocol ${remote.version}, not ${PROTOCOL_VERSION}.`));
        return;
      }
      cleanup();
      session = new Session({ role: 'client', local, remote, link });
      resolve(session);
    };
    const onData = (chunk: Buffer): void => {
      if (session === undefined) {
        bytesBeforeAck += chunk.length;
        if (bytesBeforeAck > floodMaxBytes) {
          fail(exhausted('CHANNEL_HELLO_FLOOD', `the agent sent over ${floodMaxBytes} bytes without answering HELLO.`));
          duplex.destroy();
          return;
        }
      }
      for (const event of decoder.push(chunk)) {
        if (event.kind === 'frame') onFrame(event.frame);
        else if (event.kind === 'desync' && session !== undefined) {
          session.close(unavailable('CHANNEL_DESYNC', `the channel lost framing: ${event.reason}.`));
          duplex.destroy();
        }
      }
    };
    duplex.on('data', onData);
    duplex.once('close', () => {
      const err = unavailable('CHANNEL_LINK_LOST', 'the connection to the agent closed.');
      if (session !== undefined) session.close(err);
      else fail(err);
    });
    duplex.on('error', () => {}); // 'close' follows and says what matters
    sendHello();
  });
}

/**
 * The guest side: fed with whatever the port delivers, it answers every HELLO and runs one
 * Session at a time. A HELLO with a new nonce (a new daemon, or the same daemon reconnecting)
 * ends the current session first; a repeated HELLO of the current session is answered again.
 * `linkLost` is for the port's EOF: the host end went away, so the session ends and any partial
 * frame is dropped.
 */
export class ChannelServer {
  private readonly decoder = new FrameDecoder();
  private session: Session | undefined;
  private awaitingHello = false;

  constructor(
    private readonly link: Link,
    private readonly onSession: (session: Session) => void,
    private readonly limits: ChannelLimits = DEFAULT_LIMITS,
  ) {}

  get current(): Session | undefined {
    return this.session;
  }

  feed(chunk: Buffer): void {
    for (const event of this.decoder.push(chunk)) {
      if (event.kind === 'sync') this.awaitingHello = true;
      else if (event.kind === 'desync') this.endSession(unavailable('CHANNEL_DESYNC', `the channel lost framing: ${event.reason}.`));
      else if (this.awaitingHello) this.onHelloFrame(event.frame);
      else this.session?.onFrame(event.frame);
    }
  }

  /**
   * Tell a host that may still hold a session with a previous agent that it is gone (sent once
   * at start; while no host is connected the write waits, and it lands before any HELLO_ACK).
   */
  announce(): void {
    const params: HelloParams = { version: PROTOCOL_VERSION, ...this.limits, nonce: ANNOUNCE_NONCE };
    this.link.send(encodeHello(FrameType.HELLO_ACK, params)).catch(() => {});
  }

  linkLost(): void {
    this.decoder.reset();
    this.endSession(unavailable('CHANNEL_LINK_LOST', 'the host went away.'));
  }

  private onHelloFrame(frame: Frame): void {
    this.awaitingHello = false;
    const remote = frame.type === FrameType.HELLO ? decodeHello(frame.payload) : undefined;
    if (remote === undefined) return;
    const local: HelloParams = { version: PROTOCOL_VERSION, ...this.limits, nonce: remote.nonce };
    if (this.session?.options.remote.nonce.equals(remote.nonce)) {
      this.link.send(encodeHello(FrameType.HELLO_ACK, local)).catch(() => {});
      return;
    }
    this.endSession(unavailable('CHANNEL_SESSION_REPLACED', 'a new host session started.'));
    if (remote.version !== PROTOCOL_VERSION) {
      // Answer anyway: the host reads our version from the ACK and gives up with a clear error.
      this.link.send(encodeHello(FrameType.HELLO_ACK, local)).catch(() => {});
      return;
    }
    const session = new Session({ role: 'server', local, remote, link: this.link });
    this.session = session;
    this.link.send(encodeHello(FrameType.HELLO_ACK, local)).catch(() => {});
    this.onSession(session);
  }

  private endSession(err: Error): void {
    const session = this.session;
    this.session = undefined;
    session?.close(err);
  }
}

/** Serve a Duplex as the guest would serve its port (for tests, and a socket-based agent). */
export function serveDuplex(duplex: Duplex, onSession: (session: Session) => void, limits?: ChannelLimits): ChannelServer {
  const server = new ChannelServer(duplexLink(duplex), onSession, limits);
  duplex.on('data', (chunk: Buffer) => server.feed(chunk));
  duplex.on('error', () => {});
  duplex.once('close', () => server.linkLost());
  return server;
}
