/**
 * FifoStdin with a real FIFO (mkfifo) and a stand-in for the agent's WriteStdin: the reader is
 * there before any writer (as containerd opens its writer only once we read), bytes go through
 * raw and in order, the writer's close closes the container's stdin, CloseIO does too, a stop
 * leaves it open, and a stream broken with its session is opened again.
 */
import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AgentClient, StdinWriter } from '../../../src/agent-client/index.js';
import { unavailable } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { FifoStdin } from '../../../src/runtime/container/fifo-stdin.js';

interface Stream {
  data: Buffer[];
  ended: boolean;
  cancelled: boolean;
}

/** The agent's side of WriteStdin: every stream, what it carried, how it ended. */
class StdinAgent {
  readonly streams: Stream[] = [];
  /** Fail the next write this many times as a lost session would. */
  breakNext = 0;
  readonly connection = { ready: async () => {} };

  writeStdin(_containerId: string, _execId: string): StdinWriter {
    const stream: Stream = { data: [], ended: false, cancelled: false };
    this.streams.push(stream);
    let settle!: () => void;
    const done = new Promise<void>((r) => {
      settle = r;
    });
    return {
      write: async (data) => {
        if (this.breakNext > 0) {
          this.breakNext--;
          throw unavailable('CHANNEL_SESSION_CLOSED', 'WriteStdin failed: the channel session closed.');
        }
        stream.data.push(Buffer.from(data));
      },
      end: () => {
        stream.ended = true;
        settle();
      },
      cancel: () => {
        stream.cancelled = true;
        settle();
      },
      done,
    };
  }

  get bytes(): string {
    return Buffer.concat(this.streams.flatMap((s) => s.data)).toString('latin1');
  }
}

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'kata-stdin-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function fifo(): string {
  const p = path.join(dir, 'stdin');
  execFileSync('mkfifo', [p]);
  return p;
}

function start(agent: StdinAgent, p: string): FifoStdin {
  return FifoStdin.start({ agent: agent as unknown as AgentClient, containerId: 'c', fifo: p, logger: silentLogger() });
}

const tick = (ms = 50) => new Promise((r) => setTimeout(r, ms));

async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await tick(5);
}

/** containerd's writer: opened once a reader exists (it does, by then), written, closed. */
function writer(p: string) {
  const fd = openSync(p, constants.O_WRONLY | constants.O_NONBLOCK);
  return {
    write: (s: string | Buffer) => writeSync(fd, typeof s === 'string' ? Buffer.from(s, 'latin1') : s),
    close: () => closeSync(fd),
  };
}

describe('FifoStdin', () => {
  it('waits for a writer, forwards its raw bytes in order, and closes the container stdin at its end', async () => {
    const agent = new StdinAgent();
    const p = fifo();
    const stdin = start(agent, p);
    await tick(100);
    // No writer yet: no end of file seen, nothing sent.
    expect(agent.streams.every((s) => !s.ended)).toBe(true);
    const w = writer(p);
    const raw = Buffer.from([0, 1, 0xff, 0xfe, 10, 13, 0x80]);
    w.write('hello ');
    w.write(raw);
    await until(() => agent.bytes.length === 6 + raw.length);
    w.close();
    await stdin.done;
    expect(agent.bytes).toBe(`hello ${raw.toString('latin1')}`);
    expect(agent.streams.at(-1)?.ended).toBe(true);
  });

  it('CloseIO closes the container stdin with the writer still open; stop leaves it open', async () => {
    for (const how of ['close', 'stop'] as const) {
      const agent = new StdinAgent();
      const p = path.join(dir, how);
      execFileSync('mkfifo', [p]);
      const stdin = start(agent, p);
      await tick(50);
      const w = writer(p);
      w.write('abc');
      await until(() => agent.bytes === 'abc');
      if (how === 'close') {
        stdin.close();
        await stdin.done;
        expect(agent.streams.at(-1)).toMatchObject({ ended: true, cancelled: false });
      } else {
        await stdin.stop();
        expect(agent.streams.at(-1)).toMatchObject({ ended: false, cancelled: true });
      }
      w.close();
    }
  });

  it('a session that breaks mid-stream: the chunk goes again on a new stream', async () => {
    const agent = new StdinAgent();
    const p = fifo();
    const stdin = start(agent, p);
    await tick(50);
    const w = writer(p);
    w.write('one ');
    await until(() => agent.bytes === 'one ');
    agent.breakNext = 2;
    w.write('two');
    await until(() => agent.bytes === 'one two');
    w.close();
    await stdin.done;
    // The first stream and the one that broke at once went; the third carried the chunk and the end.
    expect(agent.streams.length).toBe(3);
    expect(agent.streams.at(-1)?.ended).toBe(true);
  });
});
