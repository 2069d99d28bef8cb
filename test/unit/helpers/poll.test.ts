import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { until, untilLogLines, untilProgress } from '../../helpers/poll.js';
import { timeScale } from '../../helpers/time-scale.js';

describe('timeScale', () => {
  it('takes TEST_TIME_SCALE when set, and refuses a value that is not a positive number', () => {
    expect(timeScale({ TEST_TIME_SCALE: '2.5', CI: 'true' }, 1)).toBe(2.5);
    expect(() => timeScale({ TEST_TIME_SCALE: '0' }, 2)).toThrow(/TEST_TIME_SCALE/);
    expect(() => timeScale({ TEST_TIME_SCALE: 'slow' }, 2)).toThrow(/TEST_TIME_SCALE/);
  });

  it('is generous under CI and grows on machines with fewer cores than the reference two', () => {
    expect(timeScale({}, 2)).toBe(1);
    expect(timeScale({}, 16)).toBe(1);
    expect(timeScale({}, 1)).toBe(2);
    expect(timeScale({ CI: 'true' }, 2)).toBe(3);
    expect(timeScale({ CI: 'true' }, 1)).toBe(6);
    expect(timeScale({ CI: 'false' }, 2)).toBe(1);
  });
});

describe('until', () => {
  it('resolves with the first defined answer', async () => {
    let n = 0;
    expect(await until('three polls', async () => (++n === 3 ? 'there' : undefined), 60_000, 1)).toBe('there');
    expect(n).toBe(3);
  });

  it('gives up with what the probe noted last', async () => {
    let n = 0;
    const err = await until(
      'a state that never comes',
      async (note) => {
        note({ state: 'CONTAINER_RUNNING', polls: ++n });
        return undefined;
      },
      1,
      1,
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toMatch(/^timed out after .* waiting for a state that never comes/);
    expect((err as Error).message).toContain(`last seen: {"state":"CONTAINER_RUNNING","polls":${n}}`);
  });

  it('says so when the probe noted nothing', async () => {
    const err = await until('silence', async () => undefined, 1, 1).catch((e: unknown) => e);
    expect((err as Error).message).toContain('last seen: nothing');
  });
});

describe('untilProgress', () => {
  it('keeps waiting while every look shows progress, however long that takes', async () => {
    let n = 0;
    // A stall bound far below the whole wait: only the absence of progress may end it.
    const done = await untilProgress('ten steps', async () => ({ done: ++n === 10 ? n : undefined, progress: n }), 0, 1);
    expect(done).toBe(10);
  });

  it('fails once nothing moves, with how far it got', async () => {
    let n = 0;
    const err = await untilProgress(
      'ticks',
      async () => {
        n = Math.min(n + 1, 3);
        return { done: undefined, progress: n, seen: `${n} ticks` };
      },
      1,
      1,
    ).catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/^gave up waiting for ticks: nothing new for /);
    expect((err as Error).message).toContain('last seen: 3 ticks');
  });
});

describe('untilLogLines', () => {
  it('joins the files in order and reports the last line when it gives up', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-poll-'));
    try {
      const rotated = path.join(dir, 'c.log.1');
      const current = path.join(dir, 'c.log');
      await fsp.writeFile(rotated, '2024-01-01T00:00:00Z stdout F tick-0\n');
      await fsp.writeFile(current, '2024-01-01T00:00:01Z stdout F tick-1\n');
      expect(await untilLogLines('two ticks', [rotated, current], (l) => l.length === 2)).toEqual(['stdout F tick-0', 'stdout F tick-1']);
      const err = await untilLogLines('tick-9', [rotated, current], (l) => l.includes('stdout F tick-9'), 1).catch((e: unknown) => e);
      expect((err as Error).message).toContain('last seen: 2 lines, the last "stdout F tick-1"');
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
