import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { guestTrimSteps, hasReportingBalloon, IdleTrim, type TrimStep } from '../../../guest/agent/idle-trim.js';
import { AgentService } from '../../../guest/agent/server.js';
import { silentLogger } from '../../../src/common/logger.js';
import type { CreateContainerRequest } from '../../../src/generated/agent/agent.js';
import { until } from '../../helpers/poll.js';
import { FakeContainerBackend } from '../agent-client/fake-backend.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-idle-trim-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

function counting(): { steps: TrimStep[]; runs: string[] } {
  const runs: string[] = [];
  return { runs, steps: ['a', 'b'].map((name) => ({ name, run: () => void runs.push(name) })) };
}

describe('guest memory trim', () => {
  it('runs a full GC, drops the clean page cache and compacts, in that order, under the vm sysctl directory', async () => {
    // Files standing in for /proc/sys/vm: the steps write what the kernel reads.
    writeFileSync(path.join(dir, 'drop_caches'), '');
    writeFileSync(path.join(dir, 'compact_memory'), '');
    const steps = guestTrimSteps(dir);
    expect(steps.map((s) => s.name)).toEqual(['gc', 'drop_caches', 'compact_memory']);
    const failed = await new IdleTrim({ delayMs: 0, steps, logger: silentLogger() }).run();
    expect(failed).toEqual([]);
    expect(readFileSync(path.join(dir, 'drop_caches'), 'utf8')).toBe('1');
    expect(readFileSync(path.join(dir, 'compact_memory'), 'utf8')).toBe('1');
  });

  it('runs no step in a VM whose freed pages cannot reach the host (no balloon: a template clone), and does once one is bound', async () => {
    // A stand-in for /sys/bus/virtio/drivers/virtio_balloon: the driver without a device, then with one.
    const driver = path.join(dir, 'virtio_balloon');
    mkdirSync(driver);
    writeFileSync(path.join(driver, 'bind'), '');
    const { steps, runs } = counting();
    const trim = new IdleTrim({ delayMs: 0, steps, logger: silentLogger(), worthwhile: () => hasReportingBalloon(driver) });
    expect(await trim.run()).toEqual([]);
    expect(runs).toEqual([]);
    expect({ trims: trim.trims, skipped: trim.skipped }).toEqual({ trims: 0, skipped: 1 });
    // No driver at all (virtio_balloon not loaded) is the same.
    expect(await hasReportingBalloon(path.join(dir, 'missing'))).toBe(false);
    mkdirSync(path.join(driver, 'virtio3'));
    expect(await trim.run()).toEqual([]);
    expect(runs).toEqual(['a', 'b']);
    expect(trim.trims).toBe(1);
  });

  it('logs a failing step and still runs the others', async () => {
    // No such directory: both sysctl writes fail; the GC still runs.
    const trim = new IdleTrim({ delayMs: 0, steps: guestTrimSteps(path.join(dir, 'missing')), logger: silentLogger() });
    expect(await trim.run()).toEqual(['drop_caches', 'compact_memory']);
    expect(trim.trims).toBe(1);
  });

  it('trims once per quiet period: work moves the trim later, an idle guest is not trimmed again', async () => {
    const { steps, runs } = counting();
    const trim = new IdleTrim({ delayMs: 300, steps, logger: silentLogger() });
    try {
      trim.note();
      trim.note();
      // Not before the quiet period.
      expect(runs).toEqual([]);
      await until('the first trim', async () => (trim.trims === 1 ? true : undefined));
      expect(runs).toEqual(['a', 'b']);
      trim.note();
      await until('the second trim', async () => (trim.trims === 2 ? true : undefined));
      // Two notes before the first trim gave one trim, one note after it one more.
      expect(runs).toEqual(['a', 'b', 'a', 'b']);
    } finally {
      trim.stop();
    }
  });

  it('keeps two trims at least minIntervalMs apart, however soon the guest is quiet again', async () => {
    const { steps } = counting();
    const trim = new IdleTrim({ delayMs: 10, minIntervalMs: 600, steps, logger: silentLogger() });
    const at: number[] = [];
    try {
      const t0 = performance.now();
      trim.note();
      await until('the first trim', async () => (trim.trims === 1 ? true : undefined));
      at.push(performance.now() - t0);
      trim.note();
      await until('the second trim', async () => (trim.trims === 2 ? true : undefined));
      at.push(performance.now() - t0);
      // The second waited for the interval, not only for its 10 ms quiet period.
      expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(500);
    } finally {
      trim.stop();
    }
  });

  it('holds no trim while container work is in flight: the quiet period starts when the last call ends', async () => {
    const { steps, runs } = counting();
    const trim = new IdleTrim({ delayMs: 100, steps, logger: silentLogger() });
    try {
      // The agent served (a note), then a create starts before the quiet period is over and runs
      // well past it, with a second call overlapping it.
      trim.note();
      const endCreate = trim.begin();
      const endExec = trim.begin();
      await new Promise((r) => setTimeout(r, 400));
      expect(runs).toEqual([]);
      endCreate();
      endCreate(); // ending twice counts once
      await new Promise((r) => setTimeout(r, 300));
      // One call still in flight: still no trim.
      expect(runs).toEqual([]);
      const endedAt = performance.now();
      endExec();
      await until('the trim after the last call ended', async () => (trim.trims === 1 ? true : undefined));
      expect(performance.now() - endedAt).toBeGreaterThanOrEqual(90);
      expect(runs).toEqual(['a', 'b']);
    } finally {
      trim.stop();
    }
  });

  it('is held off by the agent during container work and told at its end, also when the work failed, and not for reads', async () => {
    const calls: string[] = [];
    let inFlight = 0;
    const service = new AgentService({
      backend: new FakeContainerBackend(),
      agentVersion: 't',
      logger: silentLogger(),
      idleTrim: {
        note: () => void calls.push('note'),
        begin: () => {
          inFlight++;
          calls.push('begin');
          return () => {
            inFlight--;
            calls.push('end');
          };
        },
      },
    });
    const h = service.handlers();
    const ctx = { method: 'test', signal: new AbortController().signal };
    await h.CreateContainer({ containerId: 'c1' } as CreateContainerRequest, ctx);
    expect(calls).toEqual(['begin', 'end']);
    await h.StartContainer({ containerId: 'c1' }, ctx);
    expect(calls).toEqual(['begin', 'end', 'begin', 'end']);
    await h.ListContainers({ containerIds: [] }, ctx);
    await h.ContainerStats({ containerIds: [] }, ctx);
    expect(calls.length).toBe(4);
    await h
      .ExecProcess({ containerId: 'c1', execId: 'e1', ociProcessJson: '{}', tty: false, stdin: false } as never, ctx)
      .catch(() => undefined);
    expect(calls.length).toBe(6);
    await h.DeleteContainer({ containerId: 'c1', force: false }, ctx);
    expect(calls.length).toBe(8);
    await expect(h.StartContainer({ containerId: 'gone' }, ctx)).rejects.toThrow();
    expect(calls.slice(8)).toEqual(['begin', 'end']);
    expect(inFlight).toBe(0);
  });
});
