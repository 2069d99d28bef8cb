/**
 * StopPodSandbox's order with the container layer and the guest agent: the listener hears
 * `sandboxStopping` first (VM and agent still up) with a bounded deadline, then DestroyPod, then
 * the VM's shutdown, then `sandboxStopped`. A listener that overruns does not hold the VM up.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import type { CgroupDriver } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import type { VmProcess } from '../../../src/hypervisor/index.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { CONTAINERS_STOP_MAX_MS, SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { migrateSandboxRecord, SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { LiveSandbox, SandboxListener } from '../../../src/runtime/sandbox/types.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { testFacts } from '../../helpers/runtime-facts.js';

const ID = 'a1'.repeat(32);
type Call = [string, ...unknown[]];

let stateDir: string;
beforeEach(async () => {
  stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-stop-'));
});
afterEach(async () => {
  await rm(stateDir, { recursive: true, force: true });
});

async function setup(listener: (calls: Call[]) => SandboxListener) {
  const calls: Call[] = [];
  const fixture = path.join(packageRoot(), 'fixtures', 'records', 'v2', 'sandboxes', `${ID}.json`);
  const record = migrateSandboxRecord(2, JSON.parse(await readFile(fixture, 'utf8')).record) as SandboxRecord;
  Object.assign(record, { state: 'SANDBOX_READY', phase: 'running', exit: null, guestPod: { pausePid: 5, shmPath: '/run/x' } });
  const cgroups = {
    name: 'cgroupfs',
    remove: async () => void calls.push(['cgroup.remove']),
  } as unknown as CgroupDriver;
  const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
  await store.init();
  const manager = new SandboxManager({
    config: { ...defaultConfig(), stateDir },
    facts: testFacts(),
    logger: silentLogger(),
    metrics: new RuntimeMetrics(),
    cgroups,
    store,
    host: { cpus: 4, memoryMiB: 8192 },
    readPcieFacts: () => Promise.reject(new Error('unused')),
    cgroupDriverNamed: () => cgroups,
    listener: listener(calls),
  });
  const vm = {
    pid: 999_999,
    exitInfo: undefined,
    exited: new Promise(() => {}),
    shutdown: async (o: { timeoutMs: number }) => {
      calls.push(['vm.shutdown', o.timeoutMs]);
      return { how: 'guest', exit: { code: 0, signal: null, shutdownReason: 'guest-shutdown' } };
    },
    release: () => void calls.push(['vm.release']),
    logTail: async () => '',
    consoleTail: async () => '',
  } as unknown as VmProcess;
  const agent = {
    destroyPod: async (id: string) => void calls.push(['agent.destroyPod', id]),
    close: () => void calls.push(['agent.close']),
  } as unknown as AgentClient;
  const live: LiveSandbox = { record, vm, agent, stopping: false };
  // The manager's map is private: a live sandbox is injected as RunPodSandbox would have left it.
  (manager as unknown as { sandboxes: Map<string, LiveSandbox> }).sandboxes.set(ID, live);
  return { manager, calls, live };
}

const ctx = (deadlineMs: number | undefined): RequestContext => ({
  method: 'StopPodSandbox',
  logger: silentLogger(),
  signal: new AbortController().signal,
  deadlineMs,
  annotate: () => {},
});

describe('StopPodSandbox order', () => {
  it('containers first (bounded), then DestroyPod, then the VM, then sandboxStopped', async () => {
    const { manager, calls, live } = await setup((calls) => ({
      sandboxStopping: async (id, ms) => void calls.push(['sandboxStopping', id, ms]),
      sandboxStopped: async (id) => void calls.push(['sandboxStopped', id]),
      sandboxRemoving: async () => {},
    }));
    await manager.stop(ID, ctx(undefined));
    expect(calls.map((c) => c[0])).toEqual([
      'sandboxStopping',
      'agent.destroyPod',
      'vm.shutdown',
      'vm.release',
      'agent.close',
      'sandboxStopped',
      'cgroup.remove',
    ]);
    expect(calls[0]).toEqual(['sandboxStopping', ID, CONTAINERS_STOP_MAX_MS]);
    expect(calls[2]).toEqual(['vm.shutdown', defaultConfig().hypervisor.stopTimeoutMs]);
    expect([live.vm, live.agent, live.record.guestPod, live.record.state]).toEqual([undefined, undefined, null, 'SANDBOX_NOTREADY']);
  });

  it('the containers get what the deadline leaves after the share of the VM; an overrun does not hold the VM up', async () => {
    const { manager, calls } = await setup((calls) => ({
      sandboxStopping: (_id, ms) => {
        calls.push(['sandboxStopping', ms]);
        return new Promise(() => {}); // never settles
      },
      sandboxStopped: async () => {},
      sandboxRemoving: async () => {},
    }));
    await manager.stop(ID, ctx(Date.now() + 13_000));
    const [, containersMs] = calls[0] as [string, number];
    const vmMs = (calls.find((c) => c[0] === 'vm.shutdown') as [string, number])[1];
    expect(vmMs).toBe(10_000);
    expect(containersMs).toBeGreaterThan(0);
    expect(containersMs + vmMs).toBeLessThanOrEqual(12_000);
    expect(calls.map((c) => c[0])).toContain('vm.shutdown');
  }, 10_000);
});
