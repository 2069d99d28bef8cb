import { promises as fsp, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isReason } from '../../../src/common/errors.js';
import { readLogState } from '../../../src/runtime/logs/state.js';
import { ContainerLogWriter, type ContainerLogWriterOptions } from '../../../src/runtime/logs/writer.js';
import { FakeAgent, parseCriLog, streamText, type Write } from './cri-log.js';

let root: string;
let logPath: string;
let statePath: string;
beforeEach(() => {
  root = mkdtempSync(path.join(tmpdir(), 'kata-logs-'));
  logPath = path.join(root, 'pod', 'ctr', '0.log');
  statePath = path.join(root, 'state', 'log-state.json');
  return fsp.mkdir(path.dirname(logPath), { recursive: true }).then(() => fsp.mkdir(path.dirname(statePath)));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

const w = (stream: Write['stream'], text: string): Write => ({ stream, data: Buffer.from(text) });
const opts = (extra: Partial<ContainerLogWriterOptions> = {}): ContainerLogWriterOptions => ({
  logPath,
  statePath,
  maxLineBytes: 8,
  ...extra,
});

/** Feed everything the agent sends from the writer's committed offset, flushing after each chunk. */
async function drain(writer: ContainerLogWriter, agent: FakeAgent, upTo = Number.POSITIVE_INFINITY): Promise<void> {
  let n = 0;
  for await (const c of agent.stream(writer.committedOffset)) {
    if (n++ >= upTo) break;
    writer.accept(c);
    await agent.ack(await writer.flush());
  }
}

function logOf(file = logPath) {
  return parseCriLog(readFileSync(file));
}

const WRITES = [
  w('stdout', 'first line\nsecond '),
  w('stderr', 'err partial'),
  w('stdout', 'half\nthird is long!\n'),
  w('stderr', ' done\n'),
  w('stdout', 'tail'),
];

function expectExactly(records: ReturnType<typeof logOf>, writes: readonly Write[]) {
  for (const s of ['stdout', 'stderr'] as const) {
    expect(streamText(records, s).toString()).toBe(
      writes
        .filter((x) => x.stream === s)
        .map((x) => x.data.toString())
        .join(''),
    );
  }
}

describe('ContainerLogWriter', () => {
  it('writes the CRI log (mode 0640) and stores how far the output is stored', async () => {
    const agent = new FakeAgent(WRITES);
    const writer = await ContainerLogWriter.open(opts());
    await drain(writer, agent);
    await writer.close();
    expect(statSync(logPath).mode & 0o777).toBe(0o640);
    const records = logOf();
    expectExactly(records, WRITES);
    expect(records.at(-1)).toMatchObject({ stream: 'stdout', tag: 'P' });
    const state = await readLogState(statePath);
    expect(state).toMatchObject({ committedOffset: agent.total, eof: true, fileSizeBytes: statSync(logPath).size });
    expect(agent.acked).toBe(agent.total);
  });

  it('loses and repeats nothing when the daemon dies between the append and the state write', async () => {
    const agent = new FakeAgent(WRITES, 5);
    let batches = 0;
    // Crash on the second batch that appended records (some batches only extend a partial line).
    const crashing = await ContainerLogWriter.open(
      opts({
        afterAppend: async () => {
          if (statSync(logPath).size > (await readLogState(statePath)).fileSizeBytes && ++batches === 2) throw new Error('simulated crash');
        },
      }),
    );
    await expect(drain(crashing, agent)).rejects.toThrow('simulated crash');
    await crashing.abandon();
    const before = await readLogState(statePath);
    expect(statSync(logPath).size).toBeGreaterThan(before.fileSizeBytes); // the batch reached the file
    // A torn tail from a second, half-finished write as well.
    await fsp.appendFile(logPath, '2016-10-06T00:17:09Z stdout F tor');

    const resumed = await ContainerLogWriter.open(opts());
    expect(resumed.committedOffset).toBe(before.committedOffset);
    expect(statSync(logPath).size).toBe(before.fileSizeBytes);
    await drain(resumed, agent);
    await resumed.close();
    expectExactly(logOf(), WRITES);
  });

  it('keeps a pending partial line across a restart, so a later line of the other stream is not repeated', async () => {
    const writes = [w('stdout', 'out-start '), w('stderr', 'err line\n'), w('stdout', 'out-end\n')];
    const agent = new FakeAgent(writes, 64);
    const first = await ContainerLogWriter.open(opts({ maxLineBytes: 100 }));
    await drain(first, agent, 2); // stdout fragment pending, stderr line written, state stored
    await first.abandon();
    const second = await ContainerLogWriter.open(opts({ maxLineBytes: 100 }));
    expect(second.committedOffset).toBe(19);
    await drain(second, agent);
    await second.close();
    const records = logOf();
    expect(records.map((r) => `${r.stream} ${r.tag} ${r.payload}`)).toEqual(['stderr F err line', 'stdout F out-start out-end']);
  });

  it('skips bytes it already stored when a stream resumes below them', async () => {
    const agent = new FakeAgent(WRITES, 4);
    const writer = await ContainerLogWriter.open(opts());
    for await (const c of agent.stream(0)) writer.accept(c);
    for await (const c of agent.stream(3)) writer.accept(c);
    await writer.close();
    expectExactly(logOf(), WRITES);
  });

  it('refuses a chunk that leaves a gap', async () => {
    const writer = await ContainerLogWriter.open(opts());
    expect(() => writer.accept({ stream: 'stdout', offset: 5, data: Buffer.from('x') })).toThrow(
      expect.objectContaining({ reason: 'LOGS_OUTPUT_GAP' }),
    );
    await writer.close();
  });

  it('repairs a rotated file when the kubelet renamed it between the crash and the restart', async () => {
    const agent = new FakeAgent(WRITES, 5);
    let batches = 0;
    const crashing = await ContainerLogWriter.open(
      opts({
        afterAppend: async () => {
          if (++batches === 3) throw new Error('simulated crash');
        },
      }),
    );
    await expect(drain(crashing, agent)).rejects.toThrow('simulated crash');
    await crashing.abandon();
    const recorded = (await readLogState(statePath)).fileSizeBytes;
    const rotated = `${logPath}.20261123-221500`;
    await fsp.rename(logPath, rotated);
    expect(statSync(rotated).size).toBeGreaterThan(recorded);

    const resumed = await ContainerLogWriter.open(opts());
    expect(statSync(rotated).size).toBe(recorded);
    await drain(resumed, agent);
    await resumed.close();
    expectExactly([...logOf(rotated), ...logOf()], WRITES);
  });

  it('reopen: records accepted before go to the renamed file, later ones to a new file at the path', async () => {
    const writer = await ContainerLogWriter.open(opts());
    writer.accept({ stream: 'stdout', offset: 0, data: Buffer.from('before\n') });
    await fsp.rename(logPath, `${logPath}.20261123-221500`);
    await writer.reopen();
    expect(statSync(logPath).size).toBe(0);
    writer.accept({ stream: 'stderr', offset: 7, data: Buffer.from('after\n') });
    await writer.close();
    expect(logOf(`${logPath}.20261123-221500`).map((r) => r.payload.toString())).toEqual(['before']);
    expect(logOf().map((r) => `${r.stream} ${r.payload}`)).toEqual(['stderr after']);
    expect(await readLogState(statePath)).toMatchObject({
      committedOffset: 13,
      fileSizeBytes: statSync(logPath).size,
      fileIno: String(statSync(logPath).ino),
    });
  });

  it('reopen fails with LOGS_DIR_MISSING when the directory is gone, and keeps writing the old file', async () => {
    const writer = await ContainerLogWriter.open(opts());
    writer.accept({ stream: 'stdout', offset: 0, data: Buffer.from('one\n') });
    const moved = path.join(root, 'moved');
    await fsp.rename(path.dirname(logPath), moved);
    const err = await writer.reopen().catch((e: unknown) => e);
    expect(isReason(err, 'LOGS_DIR_MISSING')).toBe(true);
    writer.accept({ stream: 'stdout', offset: 4, data: Buffer.from('two\n') });
    await writer.close();
    expect(logOf(path.join(moved, '0.log')).map((r) => r.payload.toString())).toEqual(['one', 'two']);
  });

  it('logs a terminal container all as stdout', async () => {
    const agent = new FakeAgent([w('stdout', 'prompt$ '), w('stderr', 'oops\n')]);
    const writer = await ContainerLogWriter.open(opts({ tty: true, maxLineBytes: 100 }));
    await drain(writer, agent);
    await writer.close();
    expect(logOf().map((r) => `${r.stream} ${r.tag} ${r.payload}`)).toEqual(['stdout F prompt$ oops']);
  });

  it('reports a corrupt state file', async () => {
    writeFileSync(statePath, '{"version":1}');
    await expect(ContainerLogWriter.open(opts())).rejects.toMatchObject({ reason: 'LOGS_STATE_CORRUPT' });
  });
});
