/** StopContainer racing a container's own exit: crun's kill fails on a process that just died, the stop still succeeds. */
import { describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import { internal } from '../../../src/common/errors.js';
import { stopInGuest } from '../../../src/runtime/container/guest-ops.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';

const record = { id: 'c1', guest: { stopSignal: 'SIGTERM' } } as unknown as ContainerRecord;
const failingAgent = {
  signalContainer: async () => {
    throw internal('RUNTIME_FAILED', 'The OCI runtime failed to signal c1.');
  },
} as unknown as AgentClient;

describe('stopInGuest', () => {
  it('succeeds when the signal fails because the container exited just before it', async () => {
    const exited = new Promise((r) => setTimeout(r, 100));
    await expect(stopInGuest(failingAgent, record, 0, exited)).resolves.toBeUndefined();
  });

  it('still fails when the container does not exit after a failed signal', async () => {
    await expect(stopInGuest(failingAgent, record, 0, new Promise(() => undefined))).rejects.toThrow(/failed to signal/);
  }, 10_000);
});
