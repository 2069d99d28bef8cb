/** How long creating and starting a container in the guest may take: the kubelet's bound, cut to the caller's deadline. */
import { describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import { createAndStart, START_CALL_MS } from '../../../src/runtime/container/guest-ops.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import { boundedTimeoutMs } from '../../../src/runtime/deadline.js';

const record = {
  id: 'c1',
  spec: { tty: false, stdin: false, stdin_once: false },
  stdio: { kind: 'cri' },
  guest: { ociSpec: {}, rootfsGuestPath: '/run/kata-ts/shared/containers/c1/rootfs', guestDevices: [] },
} as unknown as ContainerRecord;

/** An agent that answers at once and records the bound each call was given. */
function recordingAgent(): { agent: AgentClient; bounds: Array<[string, number | undefined]> } {
  const bounds: Array<[string, number | undefined]> = [];
  const agent = {
    createContainer: async (_req: unknown, options: { timeoutMs?: number }) => {
      bounds.push(['createContainer', options.timeoutMs]);
      return { pid: 7 };
    },
    startContainer: async (_id: string, options: { timeoutMs?: number }) => {
      bounds.push(['startContainer', options.timeoutMs]);
      return { startedAt: { seconds: 1, nanos: 0 } };
    },
  } as unknown as AgentClient;
  return { agent, bounds };
}

describe('createAndStart bounds', () => {
  it("gives both agent calls the kubelet's 2 minutes when the caller sets no deadline", async () => {
    expect(START_CALL_MS).toBe(120_000);
    const { agent, bounds } = recordingAgent();
    expect(await createAndStart(agent, record)).toEqual({ startedAtNs: '1000000000', pid: 7 });
    expect(bounds).toEqual([
      ['createContainer', 120_000],
      ['startContainer', 120_000],
    ]);
  });

  it("cuts the bound to the caller's deadline, keeping the rollback's reserve", async () => {
    const { agent, bounds } = recordingAgent();
    const bound = boundedTimeoutMs(START_CALL_MS, { deadlineMs: Date.now() + 20_000 });
    expect(bound).toBeGreaterThan(16_000);
    expect(bound).toBeLessThanOrEqual(17_000);
    await createAndStart(agent, record, bound);
    expect(bounds.map(([, ms]) => ms)).toEqual([bound, bound]);
  });
});
