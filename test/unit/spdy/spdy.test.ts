/**
 * The SPDY/3 framer and session of src/spdy: frames round-trip byte for byte,
 * header blocks survive compression with the SPDY/3 dictionary across several blocks of one
 * context, the reader cuts arbitrary chunking into frames, and the session's window accounting
 * (grants as the consumer reads; send windows enforced only for a peer that does flow control).
 */
import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import { Duplex, PassThrough } from 'node:stream';
import zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { SPDY3_DICTIONARY } from '../../../src/spdy/dictionary.js';
import { encodeFrame, FrameReader, type SpdyFrame } from '../../../src/spdy/frames.js';
import { decodeHeaderBlock, encodeHeaderBlock, HeaderCompressor, HeaderDecompressor } from '../../../src/spdy/headers.js';
import { SpdySession, type SpdyStream } from '../../../src/spdy/session.js';

describe('SPDY/3 frames', () => {
  it('the dictionary is the protocol constant (1423 bytes, known SHA-256)', () => {
    expect(SPDY3_DICTIONARY.length).toBe(1423);
    expect(createHash('sha256').update(SPDY3_DICTIONARY).digest('hex')).toBe(
      '51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02',
    );
  });

  it('every frame kind round-trips through encode and the reader, fed one byte at a time', () => {
    const frames: SpdyFrame[] = [
      { type: 'syn_stream', streamId: 1, associatedId: 0, priority: 3, fin: false, unidirectional: true, headerBlock: Buffer.from('hb') },
      { type: 'syn_reply', streamId: 1, fin: true, headerBlock: Buffer.from('x') },
      { type: 'headers', streamId: 3, fin: false, headerBlock: Buffer.alloc(0) },
      { type: 'data', streamId: 5, fin: true, data: Buffer.from('hello') },
      { type: 'data', streamId: 7, fin: false, data: Buffer.alloc(0) },
      { type: 'rst_stream', streamId: 9, status: 5 },
      { type: 'settings', entries: [{ flags: 0, id: 7, value: 1 << 20 }] },
      { type: 'ping', id: 0xfffffffe },
      { type: 'goaway', lastGoodStreamId: 11, status: 0 },
      { type: 'window_update', streamId: 0, delta: 0x7fffffff },
    ];
    const bytes = Buffer.concat(frames.map(encodeFrame));
    const reader = new FrameReader();
    const out: SpdyFrame[] = [];
    for (const b of bytes) out.push(...reader.push(Buffer.from([b])));
    expect(out).toEqual(frames);
    expect(reader.bufferedBytes).toBe(0);
  });

  it('a control frame carries version 3 and its type; a data frame has the control bit clear', () => {
    const ping = encodeFrame({ type: 'ping', id: 1 });
    expect([...ping.subarray(0, 8)]).toEqual([0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04]);
    const data = encodeFrame({ type: 'data', streamId: 3, fin: true, data: Buffer.from('ab') });
    expect([...data]).toEqual([0, 0, 0, 3, 0x01, 0, 0, 2, 0x61, 0x62]);
  });

  it('refuses a frame larger than its limit before buffering it, and another SPDY version', () => {
    const big = Buffer.from([0, 0, 0, 1, 0, 0x20, 0, 0]);
    expect(() => new FrameReader(1024).push(big)).toThrow(/exceeds/);
    const v2 = encodeFrame({ type: 'ping', id: 1 });
    v2.writeUInt16BE(0x8002, 0);
    expect(() => new FrameReader().push(v2)).toThrow(/version 2/);
  });

  it('header blocks: names lower-cased, repeated values NUL-joined, truncation refused', () => {
    const block = encodeHeaderBlock([
      ['streamType', 'error'],
      ['port', ['80', '8080']],
    ]);
    const headers = decodeHeaderBlock(block);
    expect([...headers]).toEqual([
      ['streamtype', ['error']],
      ['port', ['80', '8080']],
    ]);
    expect(() => decodeHeaderBlock(block.subarray(0, block.length - 1))).toThrow(/truncated/);
  });

  it('compression keeps one context across blocks, primed with the dictionary (zlib agrees on the dictionary id)', async () => {
    const c = new HeaderCompressor();
    const d = new HeaderDecompressor();
    const blocks = [
      [['streamtype', 'error']],
      [['streamtype', 'stdout']],
      [
        ['streamtype', 'data'],
        ['port', '80'],
        ['requestid', '0'],
      ],
    ] as [string, string][][];
    const compressed: Buffer[] = [];
    for (const b of blocks) compressed.push(await c.compress(b));
    // The zlib header names the dictionary by its Adler-32 (FDICT set).
    expect(compressed[0]![1]! & 0x20).toBe(0x20);
    // The second block refers back to the first: alone it would not decompress.
    expect(() => zlib.inflateSync(compressed[1]!, { dictionary: SPDY3_DICTIONARY })).toThrow();
    for (const [i, b] of compressed.entries()) expect([...(await d.decompress(b))]).toEqual(blocks[i]!.map(([n, v]) => [n, [v]]));
    c.close();
    d.close();
  });
});

/** A session on one end of a pair of PassThroughs; the test plays the client on the other end. */
function pair() {
  const toServer = new PassThrough();
  const toClient = new PassThrough();
  // A Duplex whose readable is toServer and writable is toClient.
  const socket = Duplex.from({ readable: toServer, writable: toClient });
  const streams: SpdyStream[] = [];
  const session = new SpdySession(socket, {
    onStream: (s) => {
      streams.push(s);
      return true;
    },
  });
  const reader = new FrameReader(16 << 20);
  const received: SpdyFrame[] = [];
  toClient.on('data', (c: Buffer) => received.push(...reader.push(c)));
  const compressor = new HeaderCompressor();
  const open = async (id: number) =>
    toServer.write(
      encodeFrame({
        type: 'syn_stream',
        streamId: id,
        associatedId: 0,
        priority: 0,
        fin: false,
        unidirectional: false,
        headerBlock: await compressor.compress([['streamtype', 'stdout']]),
      }),
    );
  const send = (f: SpdyFrame) => toServer.write(encodeFrame(f));
  const tick = () => new Promise((r) => setTimeout(r, 20));
  /** Wait (bounded) for something the session does asynchronously (zlib runs off the main thread). */
  const until = async (cond: () => boolean) => {
    for (let i = 0; i < 400 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  };
  return { session, streams, received, open, send, tick, until };
}

describe('SPDY session windows', () => {
  it('replies to a stream before any data and sends everything to a peer that never opens windows (spdystream)', async () => {
    const p = pair();
    await p.open(1);
    await p.until(() => p.streams.length > 0);
    const big = Buffer.alloc(200 * 1024, 7);
    await new Promise<void>((resolve) => p.streams[0]!.end(big, resolve));
    await p.until(() => p.received.some((f) => f.type === 'data' && f.fin));
    expect(p.received[0]!.type).toBe('syn_reply');
    const data = p.received.filter((f) => f.type === 'data');
    expect(data.reduce((n, f) => n + (f.type === 'data' ? f.data.length : 0), 0)).toBe(big.length);
    expect(data.at(-1)).toMatchObject({ fin: true });
  });

  it('holds data at the window of a peer that does flow control, and goes on when it grants more', async () => {
    const p = pair();
    p.send({ type: 'settings', entries: [{ flags: 0, id: 7, value: 1000 }] });
    await p.open(1);
    await p.until(() => p.streams.length > 0);
    let done = false;
    p.streams[0]!.write(Buffer.alloc(2500, 1), () => {
      done = true;
    });
    const sent = () => p.received.reduce((n, f) => n + (f.type === 'data' ? f.data.length : 0), 0);
    await p.until(() => sent() >= 1000);
    await p.tick();
    expect(sent()).toBe(1000);
    expect(done).toBe(false);
    p.send({ type: 'window_update', streamId: 1, delta: 1000 });
    await p.until(() => sent() >= 2000);
    await p.tick();
    expect(sent()).toBe(2000);
    p.send({ type: 'window_update', streamId: 1, delta: 5000 });
    await p.until(() => done);
    expect(sent()).toBe(2500);
    expect(done).toBe(true);
  });

  it('grants WINDOW_UPDATE (stream and session) as the consumer reads, not before', async () => {
    const p = pair();
    await p.open(1);
    await p.until(() => p.streams.length > 0);
    const stream = p.streams[0]!;
    stream.pause();
    p.send({ type: 'data', streamId: 1, fin: false, data: Buffer.alloc(40 * 1024) });
    await p.tick();
    expect(p.received.filter((f) => f.type === 'window_update')).toEqual([]);
    stream.resume();
    await p.until(() => p.received.filter((f) => f.type === 'window_update').length >= 2);
    const updates = p.received.filter((f) => f.type === 'window_update');
    expect(updates).toEqual([
      { type: 'window_update', streamId: 1, delta: 40 * 1024 },
      { type: 'window_update', streamId: 0, delta: 40 * 1024 },
    ]);
  });

  it('stops reading the socket while a stream holds a window of unread data, and reads on once it is consumed', async () => {
    const p = pair();
    await p.open(1);
    await p.until(() => p.streams.length > 0);
    const stream = p.streams[0]!;
    stream.pause();
    for (let i = 0; i < 3; i++) {
      p.send({ type: 'data', streamId: 1, fin: false, data: Buffer.alloc(32 * 1024, i) });
      await p.until(() => stream.readableLength >= Math.min(i + 1, 2) * 32 * 1024);
      await p.tick();
    }
    // Two frames fill the 64 KiB window; the third waits in the socket, unread. (Frames that one
    // socket read already carried are delivered: the pause bounds, it does not cut mid-chunk.)
    expect(stream.readableLength).toBe(64 * 1024);
    stream.resume();
    const granted = () =>
      p.received
        .filter((f) => f.type === 'window_update' && f.streamId === 1)
        .reduce((n, f) => n + (f.type === 'window_update' ? f.delta : 0), 0);
    await p.until(() => granted() >= 96 * 1024);
    expect(
      p.received
        .filter((f) => f.type === 'window_update' && f.streamId === 1)
        .reduce((n, f) => n + (f.type === 'window_update' ? f.delta : 0), 0),
    ).toBe(96 * 1024);
  });

  it('answers PING, resets a stream on RST_STREAM, refuses a second stream id going backwards', async () => {
    const p = pair();
    await p.open(3);
    await p.until(() => p.streams.length > 0);
    p.send({ type: 'ping', id: 1 });
    await p.until(() => p.received.some((f) => f.type === 'ping'));
    expect(p.received.find((f) => f.type === 'ping')).toEqual({ type: 'ping', id: 1 });
    p.send({ type: 'rst_stream', streamId: 3, status: 5 });
    await p.until(() => p.streams[0]!.destroyed);
    expect(p.streams[0]!.destroyed).toBe(true);
    expect(p.session.openStreams).toBe(0);
    await p.open(1);
    await p.until(() => p.received.some((f) => f.type === 'rst_stream'));
    expect(p.received.at(-1)).toMatchObject({ type: 'rst_stream', streamId: 1, status: 1 });
  });
});
