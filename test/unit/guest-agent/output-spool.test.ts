/**
 * The agent's reader of the reaper's spool file (guest/agent/output-spool.ts) on a file written
 * here in the reaper's frame format: chunks in order with journal offsets, the acknowledged
 * position stored for a restarted agent, which resumes there without losing or repeating bytes.
 */
import { Buffer } from 'node:buffer';
import { appendFile, mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { OutputJournal } from '../../../guest/agent/output-journal.js';
import { parseFrame, readSpoolAck, spoolJournal } from '../../../guest/agent/output-spool.js';

const frame = (stream: number, text: string): Buffer => {
  const data = Buffer.from(text);
  const head = Buffer.alloc(5);
  head[0] = stream;
  head.writeUInt32BE(data.length, 1);
  return Buffer.concat([head, data]);
};

async function readUntil(journal: OutputJournal, from: number, wantEof: boolean): Promise<Array<[string, number, string]>> {
  const out: Array<[string, number, string]> = [];
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), wantEof ? 5000 : 300);
  try {
    for await (const c of journal.read(from, abort.signal)) {
      if (c.eof) return out;
      out.push([c.stream!, c.offset!, Buffer.from(c.data!).toString()]);
    }
  } catch (err) {
    if (wantEof) throw err;
  } finally {
    clearTimeout(timer);
  }
  return out;
}

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'spool-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('parseFrame', () => {
  it('needs the whole header and data', () => {
    const f = frame(2, 'abc');
    expect(parseFrame(f, 0)).toMatchObject({ stream: 2, size: 8 });
    expect(parseFrame(f.subarray(0, 7), 0)).toBeUndefined();
    expect(parseFrame(f.subarray(0, 4), 0)).toBeUndefined();
  });
});

describe('spoolJournal', () => {
  it('feeds the frames in order, stores the acknowledged position, resumes there after a restart', async () => {
    const spool = path.join(dir, 'a.spool');
    await appendFile(spool, Buffer.concat([frame(1, 'out-1\n'), frame(2, 'err-1\n'), frame(1, 'out-2\n')]));
    const first = spoolJournal(spool, 1024 * 1024);
    expect(await readUntil(first, 0, false)).toEqual([
      ['OUTPUT_STREAM_STDOUT', 0, 'out-1\n'],
      ['OUTPUT_STREAM_STDERR', 6, 'err-1\n'],
      ['OUTPUT_STREAM_STDOUT', 12, 'out-2\n'],
    ]);
    // The host stored 8 bytes: the frame holding offset 8 starts at data 6, file 11.
    first.ack(8);
    // Written after a short delay (one write per flush of the host would cost the guest's vCPU).
    await new Promise((r) => setTimeout(r, 500));
    expect(readSpoolAck(spool)).toEqual({ data: 6, file: 11 });
    first.close();

    // "The agent restarts": more output arrived meanwhile, then the end of output.
    await appendFile(spool, Buffer.concat([frame(2, 'err-2\n'), frame(255, '')]));
    const second = spoolJournal(spool, 1024 * 1024);
    expect(second.acked).toBe(6);
    expect(await readUntil(second, 8, true)).toEqual([
      ['OUTPUT_STREAM_STDERR', 8, 'r-1\n'],
      ['OUTPUT_STREAM_STDOUT', 12, 'out-2\n'],
      ['OUTPUT_STREAM_STDERR', 18, 'err-2\n'],
    ]);
    second.ack(24);
    await new Promise((r) => setTimeout(r, 500));
    // Everything acknowledged: the exact boundary after the last data frame.
    expect((await readFile(`${spool}.ack`, 'utf8')).trim()).toBe('24 44');
  });

  it('reads no further than the bound while nothing is acknowledged', async () => {
    const spool = path.join(dir, 'b.spool');
    await appendFile(spool, Buffer.concat(Array.from({ length: 10 }, (_, i) => frame(1, `${i}`.repeat(100)))));
    const journal = spoolJournal(spool, 250);
    await new Promise((r) => setTimeout(r, 100));
    expect(journal.produced).toBeLessThan(400);
    journal.ack(journal.produced);
    await new Promise((r) => setTimeout(r, 100));
    expect(journal.produced).toBeGreaterThan(400);
    journal.close();
  });
});
