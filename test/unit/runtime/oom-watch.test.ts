/**
 * The host's OOM watch over a scripted agent: each OOM event of the container is told once, with
 * the guest's time; kills counted while no stream was open (before the first subscription, or
 * across a broken one) are told by the catch-up read of the guest's count, and never twice.
 */
import { describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import type { GuestEvent } from '../../../src/generated/agent/agent.js';
import { watchContainerOoms } from '../../../src/runtime/container/oom-watch.js';

/** An agent whose event streams are fed by the test and whose oom_kill count it sets. */
function scriptedAgent() {
  let kills = 0;
  const streams: Array<{ push(e: Partial<GuestEvent>): void; fail(): void }> = [];
  const agent = {
    containerStats: async (ids: string[]) => ids.map((id) => ({ containerId: id, memory: { oomKills: kills } })),
    guestEvents: ({ signal }: { signal: AbortSignal }) =>
      (async function* () {
        const queue: Array<Partial<GuestEvent> | 'fail'> = [];
        let wake: (() => void) | undefined;
        streams.push({
          push: (e) => {
            queue.push(e);
            wake?.();
          },
          fail: () => {
            queue.push('fail');
            wake?.();
          },
        });
        while (!signal.aborted) {
          const e = queue.shift();
          if (e === 'fail') throw new Error('the session broke');
          if (e !== undefined) {
            yield e as GuestEvent;
            continue;
          }
          await new Promise<void>((r) => {
            wake = r;
            signal.addEventListener('abort', () => r(), { once: true });
          });
        }
      })(),
  } as unknown as AgentClient;
  return {
    agent,
    streams,
    setKills: (n: number) => {
      kills = n;
    },
  };
}

const until = async (cond: () => boolean) => {
  for (let i = 0; i < 500 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  expect(cond()).toBe(true);
};

describe('watchContainerOoms', () => {
  it('tells each OOM event of its container once, ignores other containers and kinds, and catches up after a broken stream', async () => {
    const { agent, streams, setKills } = scriptedAgent();
    const told: string[] = [];
    const abort = new AbortController();
    setKills(2); // told before this watch (an earlier daemon): the baseline, not told again
    const done = watchContainerOoms({
      agent,
      containerId: 'c1',
      signal: abort.signal,
      logger: silentLogger(),
      onKills: (atNs) => void told.push(atNs),
    });
    await until(() => streams.length === 1);
    setKills(3);
    streams[0]!.push({ kind: 'GUEST_EVENT_KIND_OOM', containerId: 'c1', at: { seconds: 7, nanos: 0 } });
    streams[0]!.push({ kind: 'GUEST_EVENT_KIND_OOM', containerId: 'other', at: { seconds: 8, nanos: 0 } });
    streams[0]!.push({ kind: 'GUEST_EVENT_KIND_CONTAINER_EXITED', containerId: 'c1', at: { seconds: 9, nanos: 0 } });
    await until(() => told.length === 1);
    expect(told).toEqual(['7000000000']);
    // A kill while the session is broken: no event reaches the host; the next subscription's read tells it.
    streams[0]!.fail();
    setKills(4);
    await until(() => streams.length === 2);
    await until(() => told.length === 2);
    // Its event, arriving late on the new stream, is not told again.
    streams[1]!.push({ kind: 'GUEST_EVENT_KIND_OOM', containerId: 'c1', at: { seconds: 10, nanos: 0 } });
    await new Promise((r) => setTimeout(r, 50));
    expect(told).toHaveLength(2);
    abort.abort();
    await done;
  });
});
