/**
 * The order and the rollback of a pod's pause and resume (src/runtime/sandbox/pause.ts) against a
 * scripted sandbox: a VM whose QMP `stop` or `cont` can be made to fail, an agent whose freeze of
 * a given container fails, and the record as the lock hands it over. The real QEMU, agent and
 * freezer run in test/integration/pause.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { AgentConnection } from '../../../src/agent-client/connection.js';
import { isReason, unavailable } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { pausePod, resumeBeforeStop, resumePod, sandboxPausedError } from '../../../src/runtime/sandbox/pause.js';
import type { SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { SandboxHandle } from '../../../src/runtime/sandbox/types.js';

const ctx: RequestContext = {
  method: 'test',
  logger: silentLogger(),
  signal: new AbortController().signal,
  deadlineMs: undefined,
  annotate: () => undefined,
};

function scripted(options: { failFreezeOf?: string; failStop?: boolean; failCont?: boolean; state?: string } = {}) {
  const calls: string[] = [];
  const record = { id: 'pod1', phase: 'running', state: options.state ?? 'SANDBOX_READY', paused: null } as unknown as SandboxRecord;
  const vm = {
    pid: 7,
    exitInfo: undefined,
    qmp: {
      stop: async () => {
        calls.push('stop');
        if (options.failStop === true) throw unavailable('QMP_CLOSED', 'QMP went away.');
      },
      cont: async () => {
        calls.push('cont');
        if (options.failCont === true) throw unavailable('QMP_CLOSED', 'QMP went away.');
      },
    },
  };
  const agent = {
    pauseContainer: async (id: string) => {
      if (id === options.failFreezeOf) throw unavailable('AGENT_NOT_CONNECTED', 'no agent.');
      calls.push(`freeze ${id}`);
    },
    resumeContainer: async (id: string) => {
      calls.push(`thaw ${id}`);
    },
    connection: {
      hold: (refusal: unknown) => calls.push(refusal === undefined ? 'release' : 'hold'),
    },
  };
  const handle = {
    record,
    vm,
    agent,
    persist: async () => {
      calls.push(`persist ${record.paused == null ? 'running' : 'paused'}`);
    },
  } as unknown as SandboxHandle;
  const deps = {
    sandboxes: { withSandbox: <T>(_id: string, fn: (h: SandboxHandle) => Promise<T>) => fn(handle) },
    containers: {
      inSandbox: () => [
        { id: 'a', state: 'CONTAINER_RUNNING' },
        { id: 'b', state: 'CONTAINER_EXITED' },
        { id: 'c', state: 'CONTAINER_RUNNING' },
      ],
    },
  };
  return { calls, record, deps, vm, agent };
}

describe('pausePod and resumePod', () => {
  it('pause freezes the running containers, records, holds, stops; resume: cont, release, thaw, clear; both idempotent', async () => {
    const s = scripted();
    expect(await pausePod(s.deps, 'pod1', ctx)).toEqual({ sandboxId: 'pod1', changed: true });
    expect(s.record.paused).toMatchObject({ frozenContainers: ['a', 'c'] });
    expect(await pausePod(s.deps, 'pod1', ctx)).toEqual({ sandboxId: 'pod1', changed: false });
    expect(await resumePod(s.deps, 'pod1', ctx)).toEqual({ sandboxId: 'pod1', changed: true });
    expect(await resumePod(s.deps, 'pod1', ctx)).toEqual({ sandboxId: 'pod1', changed: false });
    expect(s.calls).toEqual([
      'freeze a',
      'freeze c',
      'persist paused',
      'hold',
      'stop',
      'cont',
      'release',
      'thaw a',
      'thaw c',
      'persist running',
    ]);
    expect(s.record.paused).toBeNull();
  });

  it('a freeze that fails thaws what was frozen and records nothing (SANDBOX_PAUSE_FAILED)', async () => {
    const s = scripted({ failFreezeOf: 'c' });
    const err = await pausePod(s.deps, 'pod1', ctx).catch((e: unknown) => e);
    expect(isReason(err, 'SANDBOX_PAUSE_FAILED')).toBe(true);
    expect((err as Error).message).toContain('container c');
    expect(s.calls).toEqual(['freeze a', 'thaw a']);
    expect(s.record.paused).toBeNull();
  });

  it('a stop that fails releases the agent, clears the record and thaws everything (SANDBOX_PAUSE_FAILED)', async () => {
    const s = scripted({ failStop: true });
    const err = await pausePod(s.deps, 'pod1', ctx).catch((e: unknown) => e);
    expect(isReason(err, 'SANDBOX_PAUSE_FAILED')).toBe(true);
    expect(s.calls).toEqual(['freeze a', 'freeze c', 'persist paused', 'hold', 'stop', 'release', 'persist running', 'thaw a', 'thaw c']);
    expect(s.record.paused).toBeNull();
  });

  it('a cont that fails leaves the pod paused (SANDBOX_RESUME_FAILED); a pod not running is SANDBOX_NOT_RUNNING', async () => {
    const s = scripted({ failCont: true });
    await pausePod(s.deps, 'pod1', ctx);
    const err = await resumePod(s.deps, 'pod1', ctx).catch((e: unknown) => e);
    expect(isReason(err, 'SANDBOX_RESUME_FAILED')).toBe(true);
    expect(s.record.paused).not.toBeNull();
    expect(s.calls.slice(-1)).toEqual(['cont']);
    const notReady = scripted({ state: 'SANDBOX_NOTREADY' });
    await expect(pausePod(notReady.deps, 'pod1', ctx)).rejects.toMatchObject({ reason: 'SANDBOX_NOT_RUNNING', kind: 'precondition' });
    expect(notReady.calls).toEqual([]);
  });

  it('a stop of a paused pod resumes it first; when cont fails the record is cleared anyway (the VM is going)', async () => {
    const s = scripted();
    await pausePod(s.deps, 'pod1', ctx);
    s.calls.length = 0;
    await resumeBeforeStop(s as never, async () => void s.calls.push('persist'), silentLogger());
    expect(s.calls).toEqual(['cont', 'release', 'thaw a', 'thaw c', 'persist']);
    const f = scripted({ failCont: true });
    await pausePod(f.deps, 'pod1', ctx);
    f.calls.length = 0;
    await resumeBeforeStop(f as never, async () => void f.calls.push('persist'), silentLogger());
    expect(f.calls).toEqual(['cont', 'persist']);
    expect(f.record.paused).toBeNull();
  });
});

describe('AgentConnection.hold', () => {
  it('refuses calls at once with the hold reason, and lets them wait again once released', async () => {
    const connection = new AgentConnection({ socketPath: '/nonexistent/agent.sock', logger: silentLogger(), hostVersion: 'test' });
    connection.hold(() => sandboxPausedError('pod1'));
    expect(connection.held).toBe(true);
    expect(() => connection.admit('ExecProcess', {})).toThrow(/pod sandbox pod1 is paused/);
    await expect(connection.ready(60_000)).rejects.toMatchObject({ reason: 'SANDBOX_PAUSED', kind: 'precondition' });
    connection.hold(undefined);
    expect(connection.held).toBe(false);
    expect(() => connection.admit('ExecProcess', {})).not.toThrow();
    await expect(connection.ready(10)).rejects.toMatchObject({ reason: 'AGENT_NOT_CONNECTED' });
    connection.close();
  });
});
