import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { ProcessOutput } from '../../../guest/agent/containers/output.js';
import type { OutputChunk } from '../../../guest/agent/containers/types.js';

const tick = () => new Promise((r) => setImmediate(r));

async function drain(it: AsyncGenerator<OutputChunk>): Promise<OutputChunk[]> {
  const out: OutputChunk[] = [];
  for await (const c of it) out.push(c);
  return out;
}

describe('process output', () => {
  it('keeps both streams in arrival order with per-stream offsets and ends when both end', async () => {
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const output = new ProcessOutput({ stdout, stderr }, 1024);
    stdout.write('ab');
    await tick();
    stderr.write('X');
    await tick();
    stdout.write('cde');
    await tick();
    stdout.end();
    stderr.end();
    const chunks = await drain(output.chunks({ autoAck: true }));
    expect(chunks.map((c) => [c.stream, c.offset, c.data.toString()])).toEqual([
      ['stdout', 0, 'ab'],
      ['stderr', 0, 'X'],
      ['stdout', 2, 'cde'],
    ]);
    expect(output.endOffset('stdout')).toBe(5);
    expect(output.ended).toBe(true);
  });

  it('pauses the source at capacity and resumes it once the consumer acknowledges', async () => {
    const stdout = new PassThrough();
    const output = new ProcessOutput({ stdout }, 8);
    stdout.write(Buffer.alloc(5));
    stdout.write(Buffer.alloc(5));
    await tick();
    expect(stdout.isPaused()).toBe(true);
    stdout.write(Buffer.alloc(5));
    await tick();
    expect(output.endOffset('stdout')).toBe(10);
    output.ack('stdout', 10);
    await tick();
    expect(stdout.isPaused()).toBe(false);
    expect(output.endOffset('stdout')).toBe(15);
  });

  it('replays from an unacknowledged offset, mid-chunk, and refuses an offset already discarded', async () => {
    const stdout = new PassThrough();
    const output = new ProcessOutput({ stdout }, 1024);
    stdout.write('hello ');
    await tick();
    stdout.end('world');
    const replay = await drain(output.chunks({ from: { stdout: 3 } }));
    expect(Buffer.concat(replay.map((c) => c.data)).toString()).toBe('lo world');
    expect(replay[0]!.offset).toBe(3);
    output.ack('stdout', 6);
    await expect(drain(output.chunks({ from: { stdout: 2 } }))).rejects.toMatchObject({ reason: 'OUTPUT_OFFSET_UNAVAILABLE' });
    expect((await drain(output.chunks())).map((c) => c.data.toString())).toEqual(['world']);
  });

  it('wakes a waiting reader when data arrives later', async () => {
    const stdout = new PassThrough();
    const output = new ProcessOutput({ stdout }, 1024);
    const pending = drain(output.chunks({ autoAck: true }));
    await tick();
    stdout.end('late');
    expect((await pending).map((c) => c.data.toString())).toEqual(['late']);
  });
});
