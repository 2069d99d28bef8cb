/**
 * SPDY/3 frames (draft-mbelshe-httpbis-spdy-00 section 2.2 and 2.6, with the 3.1 session-level
 * WINDOW_UPDATE on stream 0), pure: encode one frame, and an incremental reader that cuts a
 * byte stream into frames. Header blocks stay compressed here; `headers.ts` (de)compresses them,
 * because zlib's context spans every header block of a connection and is stateful.
 */
import { Buffer } from 'node:buffer';
import { invalid } from '../common/errors.js';

export const SPDY_VERSION = 3;

/** Control frame types. */
export const FrameType = {
  SYN_STREAM: 1,
  SYN_REPLY: 2,
  RST_STREAM: 3,
  SETTINGS: 4,
  PING: 6,
  GOAWAY: 7,
  HEADERS: 8,
  WINDOW_UPDATE: 9,
} as const;

export const FLAG_FIN = 0x01;
export const FLAG_UNIDIRECTIONAL = 0x02;
/** SETTINGS id: the initial window of every new stream. */
export const SETTINGS_INITIAL_WINDOW_SIZE = 7;
/** RST_STREAM status codes kata-ts sends. */
export const RstStatus = { PROTOCOL_ERROR: 1, INVALID_STREAM: 2, REFUSED_STREAM: 3, CANCEL: 5, FLOW_CONTROL_ERROR: 7 } as const;
/** Both directions start with this window, per stream and for the session (SPDY/3.1). */
export const DEFAULT_WINDOW_BYTES = 64 * 1024;
/** The largest payload a SPDY frame can carry (24-bit length). */
export const MAX_FRAME_PAYLOAD = 0xffffff;

export type SpdyFrame =
  | { type: 'data'; streamId: number; fin: boolean; data: Buffer }
  | {
      type: 'syn_stream';
      streamId: number;
      associatedId: number;
      priority: number;
      fin: boolean;
      unidirectional: boolean;
      headerBlock: Buffer;
    }
  | { type: 'syn_reply'; streamId: number; fin: boolean; headerBlock: Buffer }
  | { type: 'headers'; streamId: number; fin: boolean; headerBlock: Buffer }
  | { type: 'rst_stream'; streamId: number; status: number }
  | { type: 'settings'; entries: { flags: number; id: number; value: number }[] }
  | { type: 'ping'; id: number }
  | { type: 'goaway'; lastGoodStreamId: number; status: number }
  | { type: 'window_update'; streamId: number; delta: number }
  | { type: 'unknown'; controlType: number };

const ID_MASK = 0x7fffffff;

function control(type: number, flags: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt16BE(0x8000 | SPDY_VERSION, 0);
  head.writeUInt16BE(type, 2);
  head.writeUInt32BE(((flags & 0xff) << 24) | payload.length, 4);
  return Buffer.concat([head, payload]);
}

function words(...values: number[]): Buffer {
  const b = Buffer.alloc(values.length * 4);
  for (const [i, v] of values.entries()) b.writeUInt32BE(v >>> 0, i * 4);
  return b;
}

/** The bytes of one frame (header blocks must be compressed already). */
export function encodeFrame(frame: SpdyFrame): Buffer {
  switch (frame.type) {
    case 'data': {
      if (frame.data.length > MAX_FRAME_PAYLOAD) throw invalid('SPDY_FRAME_TOO_LARGE', 'a data frame holds at most 16 MiB.');
      const head = Buffer.alloc(8);
      head.writeUInt32BE(frame.streamId & ID_MASK, 0);
      head.writeUInt32BE(((frame.fin ? FLAG_FIN : 0) << 24) | frame.data.length, 4);
      return Buffer.concat([head, frame.data]);
    }
    case 'syn_stream': {
      const fixed = Buffer.alloc(10);
      fixed.writeUInt32BE(frame.streamId & ID_MASK, 0);
      fixed.writeUInt32BE(frame.associatedId & ID_MASK, 4);
      fixed.writeUInt8((frame.priority & 0x7) << 5, 8);
      const flags = (frame.fin ? FLAG_FIN : 0) | (frame.unidirectional ? FLAG_UNIDIRECTIONAL : 0);
      return control(FrameType.SYN_STREAM, flags, Buffer.concat([fixed, frame.headerBlock]));
    }
    case 'syn_reply':
      return control(FrameType.SYN_REPLY, frame.fin ? FLAG_FIN : 0, Buffer.concat([words(frame.streamId & ID_MASK), frame.headerBlock]));
    case 'headers':
      return control(FrameType.HEADERS, frame.fin ? FLAG_FIN : 0, Buffer.concat([words(frame.streamId & ID_MASK), frame.headerBlock]));
    case 'rst_stream':
      return control(FrameType.RST_STREAM, 0, words(frame.streamId & ID_MASK, frame.status));
    case 'settings': {
      const body = Buffer.alloc(4 + frame.entries.length * 8);
      body.writeUInt32BE(frame.entries.length, 0);
      frame.entries.forEach((e, i) => {
        body.writeUInt32BE(((e.flags & 0xff) << 24) | (e.id & 0xffffff), 4 + i * 8);
        body.writeUInt32BE(e.value >>> 0, 8 + i * 8);
      });
      return control(FrameType.SETTINGS, 0, body);
    }
    case 'ping':
      return control(FrameType.PING, 0, words(frame.id));
    case 'goaway':
      return control(FrameType.GOAWAY, 0, words(frame.lastGoodStreamId & ID_MASK, frame.status));
    case 'window_update':
      return control(FrameType.WINDOW_UPDATE, 0, words(frame.streamId & ID_MASK, frame.delta & ID_MASK));
    case 'unknown':
      throw invalid('SPDY_PROTOCOL_ERROR', 'an unknown frame type cannot be encoded.');
  }
}

function need(payload: Buffer, bytes: number, what: string): void {
  if (payload.length < bytes) throw invalid('SPDY_PROTOCOL_ERROR', `${what} frame is shorter than ${bytes} bytes.`);
}

function decodeControl(type: number, flags: number, p: Buffer): SpdyFrame {
  const fin = (flags & FLAG_FIN) !== 0;
  switch (type) {
    case FrameType.SYN_STREAM:
      need(p, 10, 'SYN_STREAM');
      return {
        type: 'syn_stream',
        streamId: p.readUInt32BE(0) & ID_MASK,
        associatedId: p.readUInt32BE(4) & ID_MASK,
        priority: p.readUInt8(8) >> 5,
        fin,
        unidirectional: (flags & FLAG_UNIDIRECTIONAL) !== 0,
        headerBlock: p.subarray(10),
      };
    case FrameType.SYN_REPLY:
    case FrameType.HEADERS:
      need(p, 4, 'SYN_REPLY/HEADERS');
      return {
        type: type === FrameType.SYN_REPLY ? 'syn_reply' : 'headers',
        streamId: p.readUInt32BE(0) & ID_MASK,
        fin,
        headerBlock: p.subarray(4),
      };
    case FrameType.RST_STREAM:
      need(p, 8, 'RST_STREAM');
      return { type: 'rst_stream', streamId: p.readUInt32BE(0) & ID_MASK, status: p.readUInt32BE(4) };
    case FrameType.SETTINGS: {
      need(p, 4, 'SETTINGS');
      const count = p.readUInt32BE(0);
      need(p, 4 + count * 8, 'SETTINGS');
      const entries = [];
      for (let i = 0; i < count; i++) {
        const idWord = p.readUInt32BE(4 + i * 8);
        entries.push({ flags: idWord >>> 24, id: idWord & 0xffffff, value: p.readUInt32BE(8 + i * 8) });
      }
      return { type: 'settings', entries };
    }
    case FrameType.PING:
      need(p, 4, 'PING');
      return { type: 'ping', id: p.readUInt32BE(0) };
    case FrameType.GOAWAY:
      need(p, 4, 'GOAWAY');
      return { type: 'goaway', lastGoodStreamId: p.readUInt32BE(0) & ID_MASK, status: p.length >= 8 ? p.readUInt32BE(4) : 0 };
    case FrameType.WINDOW_UPDATE:
      need(p, 8, 'WINDOW_UPDATE');
      return { type: 'window_update', streamId: p.readUInt32BE(0) & ID_MASK, delta: p.readUInt32BE(4) & ID_MASK };
    default:
      return { type: 'unknown', controlType: type };
  }
}

/**
 * Cuts a byte stream into frames. `maxPayloadBytes` bounds what one frame may make us buffer
 * (a peer announcing a 16 MiB frame is refused before it is read).
 */
export class FrameReader {
  private pending: Buffer[] = [];
  private pendingBytes = 0;

  constructor(private readonly maxPayloadBytes = 1024 * 1024) {}

  /** Feed bytes; returns every frame completed by them. */
  push(chunk: Buffer): SpdyFrame[] {
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    const frames: SpdyFrame[] = [];
    let buf = this.pending.length === 1 ? this.pending[0]! : Buffer.concat(this.pending);
    let at = 0;
    while (buf.length - at >= 8) {
      const first = buf.readUInt32BE(at);
      const flagsLength = buf.readUInt32BE(at + 4);
      const length = flagsLength & 0xffffff;
      const flags = flagsLength >>> 24;
      if (length > this.maxPayloadBytes) {
        throw invalid('SPDY_FRAME_TOO_LARGE', `a frame of ${length} bytes exceeds the ${this.maxPayloadBytes}-byte limit.`);
      }
      if (buf.length - at < 8 + length) break;
      const payload = buf.subarray(at + 8, at + 8 + length);
      if ((first & 0x80000000) !== 0) {
        const version = (first >>> 16) & 0x7fff;
        if (version !== SPDY_VERSION) throw invalid('SPDY_PROTOCOL_ERROR', `SPDY version ${version} is not 3.`);
        frames.push(decodeControl(first & 0xffff, flags, payload));
      } else {
        frames.push({ type: 'data', streamId: first & ID_MASK, fin: (flags & FLAG_FIN) !== 0, data: Buffer.from(payload) });
      }
      at += 8 + length;
    }
    buf = buf.subarray(at);
    this.pending = buf.length > 0 ? [buf] : [];
    this.pendingBytes = buf.length;
    return frames;
  }

  /** Bytes received that do not make a whole frame yet. */
  get bufferedBytes(): number {
    return this.pendingBytes;
  }
}
