/**
 * The kata-ts channel's wire format: frames of `[u8 type][u32 stream id][u32 length][payload]`
 * (big endian), and an 8-byte resync marker that precedes every HELLO and HELLO_ACK.
 *
 * Why a marker: a virtio-serial port is a byte pipe that outlives the host's connection to it.
 * When the daemon dies mid-frame and a new one connects, the guest may still hold the old
 * session's partial frame, and the host may receive a write the guest had blocked in while no
 * one was connected. Both sides therefore hunt for the marker, discarding everything before it,
 * and a marker seen where a frame header should start begins a new session. The marker's first
 * byte (0xFF) is no frame type, so a stray header cannot be mistaken for one.
 */
import { Buffer } from 'node:buffer';

export const MAGIC = Buffer.from([0xff, 0x4b, 0x54, 0x53, 0x59, 0x4e, 0x43, 0x0a]); // 0xFF "KTSYNC\n"
export const HEADER_BYTES = 9;
/** The largest payload either side ever sends or accepts; larger writes are split. */
export const MAX_FRAME_PAYLOAD_BYTES = 64 * 1024;
export const PROTOCOL_VERSION = 1;

export const FrameType = {
  HELLO: 1,
  HELLO_ACK: 2,
  OPEN: 3,
  DATA: 4,
  WINDOW_UPDATE: 5,
  END: 6,
  RESET: 7,
  PING: 8,
  PONG: 9,
} as const;
export type FrameTypeValue = (typeof FrameType)[keyof typeof FrameType];

export interface Frame {
  type: FrameTypeValue;
  streamId: number;
  payload: Buffer;
}

/** Codes a RESET frame carries. */
export const ResetCode = {
  CANCELLED: 1,
  TIMEOUT: 2,
  REFUSED: 3,
  PROTOCOL: 4,
  SESSION_CLOSED: 5,
  INTERNAL: 6,
  FLOW_CONTROL: 7,
  UNKNOWN_METHOD: 8,
} as const;

export function encodeFrame(type: FrameTypeValue, streamId: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  if (payload.length > MAX_FRAME_PAYLOAD_BYTES) throw new RangeError(`frame payload of ${payload.length} bytes exceeds the maximum`);
  const out = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  out.writeUInt8(type, 0);
  out.writeUInt32BE(streamId >>> 0, 1);
  out.writeUInt32BE(payload.length, 5);
  payload.copy(out, HEADER_BYTES);
  return out;
}

/** What each side announces in HELLO / HELLO_ACK. */
export interface HelloParams {
  version: number;
  /** Credits each stream opened toward the announcer starts with (its receive window). */
  initialWindowBytes: number;
  /** Streams the peer may have open toward the announcer at once. */
  maxStreams: number;
  /** 16 random bytes naming the session (HELLO), echoed back in HELLO_ACK. */
  nonce: Buffer;
}

const HELLO_BYTES = 2 + 4 + 4 + 16;

/**
 * The nonce of a HELLO_ACK nobody asked for: a freshly started agent sends one, so that a host
 * whose connection to QEMU outlived the old agent learns at once that its session is gone.
 */
export const ANNOUNCE_NONCE = Buffer.alloc(16);

export function encodeHello(type: typeof FrameType.HELLO | typeof FrameType.HELLO_ACK, params: HelloParams): Buffer {
  const p = Buffer.alloc(HELLO_BYTES);
  p.writeUInt16BE(params.version, 0);
  p.writeUInt32BE(params.initialWindowBytes, 2);
  p.writeUInt32BE(params.maxStreams, 6);
  params.nonce.copy(p, 10, 0, 16);
  return Buffer.concat([MAGIC, encodeFrame(type, 0, p)]);
}

export function decodeHello(payload: Buffer): HelloParams | undefined {
  if (payload.length < HELLO_BYTES) return undefined;
  return {
    version: payload.readUInt16BE(0),
    initialWindowBytes: payload.readUInt32BE(2),
    maxStreams: payload.readUInt32BE(6),
    nonce: Buffer.from(payload.subarray(10, 26)),
  };
}

export function encodeOpen(method: string, timeoutMs: number): Buffer {
  const name = Buffer.from(method, 'utf8');
  const p = Buffer.allocUnsafe(6 + name.length);
  p.writeUInt32BE(Math.max(0, Math.min(0xffffffff, Math.ceil(timeoutMs))), 0);
  p.writeUInt16BE(name.length, 4);
  name.copy(p, 6);
  return p;
}

export function decodeOpen(payload: Buffer): { method: string; timeoutMs: number } | undefined {
  if (payload.length < 6) return undefined;
  const len = payload.readUInt16BE(4);
  if (payload.length !== 6 + len) return undefined;
  return { timeoutMs: payload.readUInt32BE(0), method: payload.subarray(6).toString('utf8') };
}

export function encodeReset(code: number, message: string): Buffer {
  const text = Buffer.from(message.slice(0, 1024), 'utf8');
  const p = Buffer.allocUnsafe(4 + text.length);
  p.writeUInt32BE(code, 0);
  text.copy(p, 4);
  return p;
}

export function decodeReset(payload: Buffer): { code: number; message: string } {
  if (payload.length < 4) return { code: ResetCode.PROTOCOL, message: 'malformed reset' };
  return { code: payload.readUInt32BE(0), message: payload.subarray(4).toString('utf8') };
}

export function encodeU32(n: number): Buffer {
  const p = Buffer.allocUnsafe(4);
  p.writeUInt32BE(n >>> 0, 0);
  return p;
}

export type DecoderEvent =
  | { kind: 'sync' } // a resync marker: a new session's HELLO or HELLO_ACK follows
  | { kind: 'frame'; frame: Frame }
  | { kind: 'desync'; reason: string }; // garbage where a frame header should be: hunting again

/**
 * Bytes in, events out. Starts hunting for the marker; after it, reads frames until something
 * that is not a frame (unknown type, oversized length) puts it back to hunting. Holds at most
 * one frame's worth of bytes.
 */
export class FrameDecoder {
  private buf: Buffer = Buffer.alloc(0);
  private hunting = true;
  /** Bytes thrown away while hunting, for diagnostics. */
  discardedBytes = 0;

  /** Back to hunting, forgetting any partial frame (the link went away). */
  reset(): void {
    this.discardedBytes += this.buf.length;
    this.buf = Buffer.alloc(0);
    this.hunting = true;
  }

  push(chunk: Buffer): DecoderEvent[] {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const events: DecoderEvent[] = [];
    let pos = 0;
    for (;;) {
      if (this.hunting) {
        const at = this.buf.indexOf(MAGIC, pos);
        if (at < 0) {
          // Keep a tail that may be the start of a marker split across chunks.
          const keep = Math.min(MAGIC.length - 1, this.buf.length - pos);
          this.discardedBytes += this.buf.length - pos - keep;
          pos = this.buf.length - keep;
          break;
        }
        this.discardedBytes += at - pos;
        pos = at + MAGIC.length;
        this.hunting = false;
        events.push({ kind: 'sync' });
        continue;
      }
      const left = this.buf.length - pos;
      if (left < 1) break;
      const type = this.buf[pos]!;
      if (type === MAGIC[0]) {
        if (left < MAGIC.length) break;
        if (this.buf.compare(MAGIC, 0, MAGIC.length, pos, pos + MAGIC.length) === 0) {
          pos += MAGIC.length;
          events.push({ kind: 'sync' });
          continue;
        }
        events.push({ kind: 'desync', reason: 'a broken resync marker' });
        this.hunting = true;
        pos += 1;
        continue;
      }
      if (type < FrameType.HELLO || type > FrameType.PONG) {
        events.push({ kind: 'desync', reason: `unknown frame type ${type}` });
        this.hunting = true;
        pos += 1;
        continue;
      }
      if (left < HEADER_BYTES) break;
      const length = this.buf.readUInt32BE(pos + 5);
      if (length > MAX_FRAME_PAYLOAD_BYTES) {
        events.push({ kind: 'desync', reason: `frame length ${length} exceeds the maximum` });
        this.hunting = true;
        pos += 1;
        continue;
      }
      if (left < HEADER_BYTES + length) break;
      const streamId = this.buf.readUInt32BE(pos + 1);
      const payload = Buffer.from(this.buf.subarray(pos + HEADER_BYTES, pos + HEADER_BYTES + length));
      pos += HEADER_BYTES + length;
      events.push({ kind: 'frame', frame: { type: type as FrameTypeValue, streamId, payload } });
    }
    this.buf = pos >= this.buf.length ? Buffer.alloc(0) : this.buf.subarray(pos);
    return events;
  }
}
