/**
 * FifoSink with real FIFOs (mkfifo in a temporary directory) driven by the same pump as the CRI
 * log: raw bytes, stdout and stderr apart (one stream with a terminal), a reader that opens late,
 * a reader that goes away and another that comes, and a sink that never waits for a reader that
 * does not read when it is closed.
 */
import { execFileSync } from 'node:child_process';
import { constants, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isReason } from '../../../src/common/errors.js';
import { FifoSink } from '../../../src/runtime/logs/fifo-sink.js';
import { pump } from '../../../src/runtime/logs/pump.js';
import { FakeAgent, type Write } from './cri-log.js';

let root: string;
let n = 0;
const readers: net.Socket[] = [];
beforeEach(() => {
  root = mkdtempSync(path.join(tmpdir(), 'kata-fifo-'));
});
afterEach(() => {
  for (const r of readers.splice(0)) r.destroy();
  rmSync(root, { recursive: true, force: true });
});

function fifo(): string {
  const p = path.join(root, `f${n++}`);
  execFileSync('mkfifo', [p]);
  return p;
}

/** A reader as containerd has one: the read end, non-blocking, everything it gets collected. */
class Reader {
  readonly chunks: Buffer[] = [];
  readonly ended: Promise<void>;
  private readonly socket: net.Socket;

  constructor(p: string, opts: { stopAfterBytes?: number } = {}) {
    const fd = openSync(p, constants.O_RDONLY | constants.O_NONBLOCK);
    this.socket = new net.Socket({ fd, readable: true, writable: false });
    readers.push(this.socket);
    this.ended = new Promise((resolve) => {
      this.socket.on('end', () => resolve());
      this.socket.on('close', () => resolve());
    });
    this.socket.on('data', (d: Buffer) => {
      this.chunks.push(d);
      if (opts.stopAfterBytes !== undefined && this.bytes.length >= opts.stopAfterBytes) this.socket.destroy();
    });
  }

  get bytes(): Buffer {
    return Buffer.concat(this.chunks);
  }

  close(): void {
    this.socket.destroy();
  }
}

/** Every byte value, invalid UTF-8 and NULs included, in writes that are not lines. */
function rawWrites(count: number, size: number): Write[] {
  return Array.from({ length: count }, (_, i) => ({
    stream: i % 3 === 0 ? 'stderr' : 'stdout',
    data: Buffer.from(Array.from({ length: size }, (_, j) => (i * 31 + j * 7) % 256)),
  }));
}

function joined(writes: readonly Write[], stream: 'stdout' | 'stderr' | 'both'): Buffer {
  return Buffer.concat(writes.filter((w) => stream === 'both' || w.stream === stream).map((w) => w.data));
}

async function waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 2));
}

describe('FifoSink', () => {
  it('writes the raw bytes, stdout and stderr apart, acknowledges what the pipes took, and ends both at eof', async () => {
    const writes = rawWrites(40, 300);
    const [out, err] = [fifo(), fifo()];
    const [outReader, errReader] = [new Reader(out), new Reader(err)];
    const agent = new FakeAgent(writes, 97);
    const sink = await FifoSink.open({ stdout: out, stderr: err, terminal: false, startOffset: 0 });
    const result = await pump(sink, agent.stream(0), (o) => agent.ack(o));
    expect(result).toEqual({ committedOffset: agent.total, eof: true });
    expect(agent.acks).toEqual([...agent.acks].sort((a, b) => a - b));
    expect(sink.eof).toBe(true);
    await Promise.all([outReader.ended, errReader.ended]);
    expect(outReader.bytes.equals(joined(writes, 'stdout'))).toBe(true);
    expect(errReader.bytes.equals(joined(writes, 'stderr'))).toBe(true);
  });

  it('with a terminal everything is one stream on stdout, and the stderr path is never opened', async () => {
    const writes = rawWrites(10, 50);
    const out = fifo();
    const reader = new Reader(out);
    const agent = new FakeAgent(writes, 13);
    const sink = await FifoSink.open({ stdout: out, stderr: path.join(root, 'no-such-fifo'), terminal: true, startOffset: 0 });
    await pump(sink, agent.stream(0), (o) => agent.ack(o));
    await reader.ended;
    expect(reader.bytes.equals(joined(writes, 'both'))).toBe(true);
  });

  it("a stream without a FIFO ('') is dropped, and counted as stored", async () => {
    const writes = rawWrites(9, 40);
    const out = fifo();
    const reader = new Reader(out);
    const agent = new FakeAgent(writes, 11);
    const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: false, startOffset: 0 });
    expect((await pump(sink, agent.stream(0), (o) => agent.ack(o))).committedOffset).toBe(agent.total);
    await reader.ended;
    expect(reader.bytes.equals(joined(writes, 'stdout'))).toBe(true);
  });

  it('a reader that opens late gets everything written before it came', async () => {
    const writes = rawWrites(6, 1000);
    const out = fifo();
    const agent = new FakeAgent(writes, 333);
    const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: true, startOffset: 0 });
    // No reader yet: opening did not wait for one, and the pipe takes the bytes.
    const result = await pump(sink, agent.stream(0, { eof: false }), (o) => agent.ack(o));
    expect(result).toEqual({ committedOffset: agent.total, eof: false });
    const reader = new Reader(out);
    await waitFor(() => reader.bytes.length === agent.total);
    await pump(sink, agent.stream(agent.total), (o) => agent.ack(o));
    await reader.ended;
    expect(reader.bytes.equals(joined(writes, 'both'))).toBe(true);
  });

  it('output that ends before any reader opened waits in the pipe for one: the reader gets all of it, then its end', async () => {
    const writes = rawWrites(5, 700);
    const out = fifo();
    const agent = new FakeAgent(writes, 500);
    const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: true, startOffset: 0 });
    let done = false;
    const pumped = pump(sink, agent.stream(0), (o) => agent.ack(o)).then((r) => {
      done = true;
      return r;
    });
    // The bytes fit the pipe and the eof follows them: a sink that took its own read-write end
    // for the reader would be done at once. The last batch is acknowledged only after the hand-over.
    await new Promise((r) => setTimeout(r, 500));
    expect(done).toBe(false);
    expect(agent.acks.at(-1) ?? 0).toBeLessThan(agent.total);
    const reader = new Reader(out);
    expect(await pumped).toEqual({ committedOffset: agent.total, eof: true });
    await reader.ended;
    expect(reader.bytes.equals(joined(writes, 'both'))).toBe(true);
  });

  it('a hand-over still waiting for a reader ends when the sink is closed', async () => {
    const out = fifo();
    const agent = new FakeAgent(rawWrites(2, 10), 50);
    const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: true, startOffset: 0 });
    const pumped = pump(sink, agent.stream(0), (o) => agent.ack(o)).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 200));
    await sink.close();
    await pumped; // resolves (or fails) instead of waiting out the reader's 30 s
    expect(sink.reusable).toBe(false);
  });

  it('a reader that goes away holds the output back (throttled, not dropped); the next reader gets the rest, once', async () => {
    // Eight times a default pipe's 64 KiB: most of it must wait for a reader.
    const writes: Write[] = Array.from({ length: 128 }, (_, i) => ({
      stream: 'stdout',
      data: Buffer.alloc(4096, i),
    }));
    const out = fifo();
    const first = new Reader(out, { stopAfterBytes: 1 });
    const agent = new FakeAgent(writes, 4096);
    const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: false, startOffset: 0 });
    const done = pump(sink, agent.stream(0), (o) => agent.ack(o), { maxBufferedBytes: 16 * 1024 });
    await first.ended;
    await new Promise((r) => setTimeout(r, 200));
    // Stuck on a full pipe: not everything acknowledged (the agent keeps the rest).
    expect(agent.acked).toBeLessThan(agent.total);
    expect(sink.eof).toBe(false);
    const second = new Reader(out);
    expect(await done).toEqual({ committedOffset: agent.total, eof: true });
    await second.ended;
    expect(Buffer.concat([first.bytes, second.bytes]).equals(joined(writes, 'both'))).toBe(true);
  });

  it('closing (or aborting) never waits for a reader that does not read: the stuck flush fails, nothing more is acknowledged', async () => {
    for (const how of ['close', 'abort'] as const) {
      const out = fifo();
      const abort = new AbortController();
      const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: false, startOffset: 0, signal: abort.signal });
      sink.accept({ stream: 'OUTPUT_STREAM_STDOUT', offset: 0, data: Buffer.alloc(1024 * 1024, 1) });
      const flushed = sink.flush();
      flushed.catch(() => undefined);
      await new Promise((r) => setTimeout(r, 50));
      if (how === 'close') await sink.close();
      else abort.abort();
      await expect(flushed).rejects.toThrow();
      expect(sink.committedOffset).toBe(0);
    }
  });

  it('resumes at its start offset: repeated bytes are skipped, a gap is an error', async () => {
    const out = fifo();
    const reader = new Reader(out);
    const sink = await FifoSink.open({ stdout: out, stderr: '', terminal: false, startOffset: 5 });
    sink.accept({ stream: 'OUTPUT_STREAM_STDOUT', offset: 0, data: Buffer.from('0123456789') });
    expect(() => sink.accept({ stream: 'OUTPUT_STREAM_STDOUT', offset: 12, data: Buffer.from('x') })).toThrow(/skips past/);
    expect(await sink.flush()).toBe(10);
    sink.accept({ stream: 'OUTPUT_STREAM_STDOUT', offset: 10, data: new Uint8Array(0), eof: true });
    await sink.flush();
    await reader.ended;
    expect(reader.bytes.toString()).toBe('56789');
  });

  it('a path that is not a FIFO, or missing, is FAILED_PRECONDITION LOGS_FIFO_UNUSABLE', async () => {
    const file = path.join(root, 'plain');
    writeFileSync(file, '');
    for (const p of [file, path.join(root, 'missing')]) {
      const err = await FifoSink.open({ stdout: p, stderr: '', terminal: false, startOffset: 0 }).catch((e: unknown) => e);
      expect(isReason(err, 'LOGS_FIFO_UNUSABLE')).toBe(true);
    }
    // The stdout FIFO opened before a bad stderr is closed again (no descriptor left behind).
    const out = fifo();
    const err = await FifoSink.open({ stdout: out, stderr: file, terminal: false, startOffset: 0 }).catch((e: unknown) => e);
    expect(isReason(err, 'LOGS_FIFO_UNUSABLE')).toBe(true);
  });
});
