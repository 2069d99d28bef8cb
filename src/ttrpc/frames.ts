/**
 * ttrpc's framing: every message is a 10-byte header and up to 4 MiB of data.
 *
 *     bytes 0-3  data length (u32, big endian; the header itself not counted)
 *     bytes 4-7  stream id   (u32, big endian; odd for client-opened streams)
 *     byte  8    message type (1 request, 2 response, 3 data)
 *     byte  9    flags, whose meaning depends on the type
 *
 * containerd's implementation discards a frame whose length passes the cap without reading it
 * into memory, then answers RESOURCE_EXHAUSTED on that frame's stream; the reader here does the
 * same (it reports the refused frame once its bytes have gone by), so a peer's oversized frame
 * costs us no memory and leaves the connection usable. At most one frame (header plus 4 MiB) is
 * ever held.
 */
import { Buffer } from 'node:buffer';

export const HEADER_BYTES = 10;
/** The largest data a frame may carry, as containerd's ttrpc sets it (4 << 20). */
export const MAX_DATA_BYTES = 4 * 1024 * 1024;

export const MessageType = {
  REQUEST: 0x1,
  RESPONSE: 0x2,
  /** Stream data (ttrpc 1.2's streaming): recognised, not served (see README.md). */
  DATA: 0x3,
} as const;

/** Flag bits; which apply depends on the message type. */
export const Flag = {
  /** On a request or data frame: the sender will send no more data on this stream. */
  REMOTE_CLOSED: 0x1,
  /** On a request: a streaming call, more data frames follow. */
  REMOTE_OPEN: 0x2,
  /** On a data frame: the frame carries no message at all (as opposed to an empty one). */
  NO_DATA: 0x4,
} as const;

export interface FrameHeader {
  dataBytes: number;
  streamId: number;
  type: number;
  flags: number;
}

export interface Frame {
  streamId: number;
  type: number;
  flags: number;
  data: Buffer;
}

export type ReaderEvent =
  | { kind: 'frame'; frame: Frame }
  /** A frame over MAX_DATA_BYTES went by unread; its header says whose it was. */
  | { kind: 'oversize'; header: FrameHeader };

export function encodeHeader(header: FrameHeader): Buffer {
  const out = Buffer.allocUnsafe(HEADER_BYTES);
  out.writeUInt32BE(header.dataBytes, 0);
  out.writeUInt32BE(header.streamId >>> 0, 4);
  out.writeUInt8(header.type, 8);
  out.writeUInt8(header.flags, 9);
  return out;
}

export function decodeHeader(bytes: Buffer, at = 0): FrameHeader {
  return {
    dataBytes: bytes.readUInt32BE(at),
    streamId: bytes.readUInt32BE(at + 4),
    type: bytes.readUInt8(at + 8),
    flags: bytes.readUInt8(at + 9),
  };
}

/** One frame as bytes. Throws a RangeError over the cap: callers check first and answer a status. */
export function encodeFrame(streamId: number, type: number, flags: number, data: Uint8Array = Buffer.alloc(0)): Buffer {
  if (data.length > MAX_DATA_BYTES) throw new RangeError(`frame data of ${data.length} bytes exceeds ${MAX_DATA_BYTES}`);
  const out = Buffer.allocUnsafe(HEADER_BYTES + data.length);
  encodeHeader({ dataBytes: data.length, streamId, type, flags }).copy(out, 0);
  out.set(data, HEADER_BYTES);
  return out;
}

/**
 * Bytes in, frames out. Holds a partial header (under 10 bytes) or one frame's data, which is
 * allocated once at its announced size (never more than MAX_DATA_BYTES) and filled as chunks
 * arrive, so a frame split into many chunks is not copied over and over.
 */
export class FrameReader {
  private readonly header = Buffer.alloc(HEADER_BYTES);
  private headerFill = 0;
  private current: FrameHeader | undefined;
  private data: Buffer | undefined;
  private dataFill = 0;
  /** Bytes of an oversized frame still to skip. */
  private skipBytes = 0;

  push(chunk: Buffer): ReaderEvent[] {
    const events: ReaderEvent[] = [];
    let at = 0;
    // A zero-length frame completes with no bytes left in the chunk, hence the `current` test.
    while (at < chunk.length || (this.current !== undefined && this.missing() === 0)) {
      if (this.current === undefined) {
        const take = Math.min(HEADER_BYTES - this.headerFill, chunk.length - at);
        chunk.copy(this.header, this.headerFill, at, at + take);
        this.headerFill += take;
        at += take;
        if (this.headerFill < HEADER_BYTES) break;
        this.headerFill = 0;
        this.current = decodeHeader(this.header);
        if (this.current.dataBytes > MAX_DATA_BYTES) {
          this.skipBytes = this.current.dataBytes;
        } else {
          this.data = Buffer.allocUnsafe(this.current.dataBytes);
          this.dataFill = 0;
        }
        continue;
      }
      if (this.data === undefined) {
        const take = Math.min(this.skipBytes, chunk.length - at);
        this.skipBytes -= take;
        at += take;
        if (this.skipBytes > 0) break;
        events.push({ kind: 'oversize', header: this.current });
        this.current = undefined;
        continue;
      }
      const take = Math.min(this.data.length - this.dataFill, chunk.length - at);
      chunk.copy(this.data, this.dataFill, at, at + take);
      this.dataFill += take;
      at += take;
      if (this.dataFill < this.data.length) break;
      const { streamId, type, flags } = this.current;
      events.push({ kind: 'frame', frame: { streamId, type, flags, data: this.data } });
      this.current = undefined;
      this.data = undefined;
    }
    return events;
  }

  /** Bytes the frame under way still lacks (0 once complete). */
  private missing(): number {
    if (this.data !== undefined) return this.data.length - this.dataFill;
    return this.skipBytes;
  }

  /** Bytes held that do not make a whole frame yet (a partial header or a partial frame's data). */
  get bufferedBytes(): number {
    return this.current === undefined ? this.headerFill : HEADER_BYTES + this.dataFill;
  }
}
