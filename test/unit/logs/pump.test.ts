import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { pump } from '../../../src/runtime/logs/pump.js';
import type { OutputChunkLike } from '../../../src/runtime/logs/sink.js';
import { ContainerLogWriter, type ContainerLogWriterOptions } from '../../../src/runtime/logs/writer.js';
import { asKubectlShows, FakeAgent, parseCriLog, streamText, type Write } from './cri-log.js';

let root: string;
let n = 0;
beforeEach(() => {
  root = mkdtempSync(path.join(tmpdir(), 'kata-pump-'));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

function paths(): Pick<ContainerLogWriterOptions, 'logPath' | 'statePath'> {
  const dir = path.join(root, String(n++));
  mkdirSync(dir);
  return { logPath: path.join(dir, '0.log'), statePath: path.join(dir, 'state.json') };
}

function expectExactly(logPath: string, writes: readonly Write[]) {
  const records = parseCriLog(readFileSync(logPath));
  for (const s of ['stdout', 'stderr'] as const) {
    expect(streamText(records, s)).toEqual(asKubectlShows(Buffer.concat(writes.filter((x) => x.stream === s).map((x) => x.data))));
  }
}

/** Let pending promises and I/O callbacks run for a while. */
async function settle(turns = 200): Promise<void> {
  for (let i = 0; i < turns; i++) await new Promise((r) => setImmediate(r));
}

/** Wait (without a deadline of our own: vitest's test timeout is the bound) until `cond` holds. */
async function waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 1));
}

describe('pump', () => {
  it('stores the output to its end and acknowledges only stored offsets, in order', async () => {
    const writes: Write[] = Array.from({ length: 50 }, (_, i) => ({
      stream: i % 3 === 0 ? 'stderr' : 'stdout',
      data: Buffer.from(`line ${i}${i % 4 === 0 ? '' : '\n'}`),
    }));
    const agent = new FakeAgent(writes, 3);
    const p = paths();
    const writer = await ContainerLogWriter.open({ ...p, nowNs: () => 1n });
    const seen: number[] = [];
    const result = await pump(writer, agent.stream(0), async (offset) => {
      expect((JSON.parse(readFileSync(p.statePath, 'utf8')) as { committedOffset: number }).committedOffset).toBeGreaterThanOrEqual(offset);
      seen.push(offset);
      await agent.ack(offset);
    });
    await writer.close();
    expect(result).toEqual({ committedOffset: agent.total, eof: true });
    expect(seen).toEqual([...seen].sort((a, b) => a - b));
    expectExactly(p.logPath, writes);
  });

  it('bounds memory when the disk is slow, and batches many chunks into one write', async () => {
    let release!: () => void;
    let gate = new Promise<void>((r) => {
      release = r;
    });
    let appends = 0;
    const writer = await ContainerLogWriter.open({
      ...paths(),
      beforeAppend: async () => {
        appends++;
        await gate;
      },
    });
    let pulledBytes = 0;
    let pulls = 0;
    let stop = false;
    async function* endless(): AsyncGenerator<OutputChunkLike> {
      for (let offset = 0; !stop; offset += 1000) {
        pulls++;
        pulledBytes += 1000;
        yield { stream: 'stdout', offset, data: Buffer.alloc(1000, 0x61).fill(0x0a, 999) };
      }
    }
    const limit = 64 * 1024;
    const done = pump(writer, endless(), async () => undefined, { maxBufferedBytes: limit });
    await settle();
    // The first write is stuck: what was pulled is that write plus at most the bound (and one chunk).
    const stuckAt = pulledBytes;
    expect(stuckAt).toBeLessThan(2 * limit + 2000);
    await settle();
    expect(pulledBytes).toBe(stuckAt);
    expect(writer.bufferedBytes).toBeGreaterThanOrEqual(limit);
    const pullsWhileStuck = pulls;
    gate = Promise.resolve();
    release();
    await waitFor(() => pulls > pullsWhileStuck + 200);
    stop = true;
    await done;
    await writer.close();
    expect(pulls).toBeGreaterThan(pullsWhileStuck);
    expect(appends).toBeLessThan(pulls / 10);
  });

  it('keeps every byte when the kubelet rotates the file while output flows', async () => {
    const writes: Write[] = Array.from({ length: 300 }, (_, i) => ({
      stream: i % 2 === 0 ? 'stdout' : 'stderr',
      data: Buffer.from(`record ${i}\n`),
    }));
    const agent = new FakeAgent(writes, 5);
    const p = paths();
    let appends = 0;
    const writer = await ContainerLogWriter.open({
      ...p,
      beforeAppend: async () => {
        appends++;
        await settle(5);
      },
    });
    const done = pump(writer, agent.stream(0), (o) => agent.ack(o), { maxBufferedBytes: 512 });
    const rotated: string[] = [];
    for (let i = 0; i < 3; i++) {
      await waitFor(() => appends > (i + 1) * 3);
      const name = `${p.logPath}.${i}`;
      await import('node:fs/promises').then((f) => f.rename(p.logPath, name));
      await writer.reopen();
      rotated.push(name);
    }
    await done;
    await writer.close();
    const records = [...rotated, p.logPath].flatMap((f) => parseCriLog(readFileSync(f)));
    for (const s of ['stdout', 'stderr'] as const) {
      expect(streamText(records, s)).toEqual(asKubectlShows(Buffer.concat(writes.filter((x) => x.stream === s).map((x) => x.data))));
    }
    expect(rotated.every((f) => readFileSync(f).byteLength > 0)).toBe(true);
  });

  it('fails promptly while the source waits for output that never comes', async () => {
    const writer = await ContainerLogWriter.open(paths());
    async function* stalls(): AsyncGenerator<OutputChunkLike> {
      yield { stream: 'stdout', offset: 0, data: Buffer.from('one\n') };
      await new Promise(() => undefined);
    }
    await expect(
      pump(writer, stalls(), async () => {
        throw new Error('agent gone');
      }),
    ).rejects.toThrow('agent gone');
    await writer.abandon();
  });

  it('surfaces an acknowledgement failure', async () => {
    const writer = await ContainerLogWriter.open(paths());
    const agent = new FakeAgent([{ stream: 'stdout', data: Buffer.from('a\nb\n') }]);
    await expect(
      pump(writer, agent.stream(0), async () => {
        throw new Error('agent gone');
      }),
    ).rejects.toThrow('agent gone');
    await writer.abandon();
  });

  it('survives a daemon crash after any append or in any ack, with nothing lost or repeated (property)', async () => {
    const write = fc.record({
      stream: fc.constantFrom('stdout' as const, 'stderr' as const),
      data: fc
        .uint8Array({ minLength: 1, maxLength: 30 })
        .map((a) => Buffer.from(a.map((b) => (b % 4 === 0 ? 0x0a : b % 4 === 1 ? 0x0d : b)))),
    });
    await fc.assert(
      fc.asyncProperty(
        fc.array(write, { minLength: 1, maxLength: 15 }),
        fc.integer({ min: 1, max: 9 }),
        fc.integer({ min: 1, max: 12 }),
        fc.boolean(),
        fc.constantFrom('after append' as const, 'in ack' as const),
        async (writes, chunkBytes, crashAt, rotate, where) => {
          const p = paths();
          const agent = new FakeAgent(writes, chunkBytes);
          let batches = 0;
          const first = await ContainerLogWriter.open({
            ...p,
            maxLineBytes: 6,
            afterAppend: async () => {
              if (where === 'after append' && ++batches === crashAt) throw new Error('crash');
            },
          });
          // 'in ack': the state is stored, the acknowledgement never reaches the agent.
          let acks = 0;
          const ack = (o: number) => (where === 'in ack' && ++acks === crashAt ? Promise.reject(new Error('crash')) : agent.ack(o));
          const crashed = await pump(first, agent.stream(0), ack).then(
            () => false,
            () => true,
          );
          await first.abandon();
          const rotated = `${p.logPath}.1`;
          if (crashed && rotate) await import('node:fs/promises').then((f) => f.rename(p.logPath, rotated));
          const second = await ContainerLogWriter.open({ ...p, maxLineBytes: 6 });
          await pump(second, agent.stream(second.committedOffset), (o) => agent.ack(o));
          await second.close();
          const files = crashed && rotate ? [rotated, p.logPath] : [p.logPath];
          const records = files.flatMap((f) => parseCriLog(readFileSync(f)));
          for (const s of ['stdout', 'stderr'] as const) {
            expect(streamText(records, s)).toEqual(asKubectlShows(Buffer.concat(writes.filter((x) => x.stream === s).map((x) => x.data))));
          }
          expect(agent.acked).toBe(agent.total);
        },
      ),
      { numRuns: 80 },
    );
  });
});
