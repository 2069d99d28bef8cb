import { describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../../src/agent-client/index.js';
import { silentLogger } from '../../../../src/common/logger.js';
import { WARM_ID, WARM_LINE, WARM_ROOTFS, warmSpec, warmUpGuest } from '../../../../src/runtime/pool/warm.js';

interface Mount {
  destination: string;
  source?: string;
}

describe('the warm-up container of a pre-booted VM', () => {
  const spec = warmSpec({ pausePid: 42, shmPath: '/run/kata-ts/pods/warm/shm' }) as {
    root: { path: string; readonly: boolean };
    mounts: Mount[];
    process: { args: string[] };
    linux: { namespaces: Array<{ type: string; path?: string }>; cgroupsPath: string };
  };

  it("runs from the guest image's read-only root in the warm pod's namespaces, like a pod's container", () => {
    expect(spec.root).toEqual({ path: WARM_ROOTFS, readonly: true });
    expect(spec.process.args).toEqual(['/bin/sh', '-c', `echo ${WARM_LINE}; exec sleep 600`]);
    const byType = Object.fromEntries(spec.linux.namespaces.map((n) => [n.type, n.path]));
    expect(byType).toMatchObject({ network: '/proc/42/ns/net', ipc: '/proc/42/ns/ipc', uts: '/proc/42/ns/uts', pid: '/proc/42/ns/pid' });
    expect(spec.linux.cgroupsPath).toBe(`/kata-ts/${WARM_ID}/${WARM_ID}`);
    // The standard kernel file systems and the pod's /dev/shm, as every container gets them.
    const destinations = spec.mounts.map((m) => m.destination);
    expect(destinations).toEqual(expect.arrayContaining(['/proc', '/dev', '/sys', '/dev/shm']));
  });

  it('has none of the etc files a pod gets over the shared directory (a pre-booted VM has none yet)', () => {
    expect(spec.mounts.filter((m) => m.destination.startsWith('/etc/'))).toEqual([]);
  });
});

/** An agent whose calls are recorded; `failAt` makes that call throw. */
function fakeAgent(failAt?: string): { agent: AgentClient; calls: string[] } {
  const calls: string[] = [];
  const call =
    <T>(name: string, value: T) =>
    async (): Promise<T> => {
      calls.push(name);
      if (name === failAt) throw new Error(`${name} refused`);
      return value;
    };
  const agent = {
    createPod: call('createPod', { pausePid: 7, shmPath: '/run/shm', sharedDirMounted: false, sharedDir: '/run/shared' }),
    createContainer: call('createContainer', { pid: 8 }),
    startContainer: call('startContainer', { startedAt: null }),
    streamOutput: async function* () {
      calls.push('streamOutput');
      if (failAt === 'streamOutput') throw new Error('streamOutput refused');
      yield { stream: 'OUTPUT_STREAM_STDOUT', offset: 0, data: Buffer.from(`${WARM_LINE}\n`), eof: false };
    },
    ackOutput: call('ackOutput', undefined),
    execProcess: call('execProcess', { pid: 9 }),
    waitProcess: call('waitProcess', { exitCode: 0, signal: 0, oomKilled: false }),
    deleteProcess: call('deleteProcess', undefined),
    signalContainer: call('signalContainer', undefined),
    waitContainer: call('waitContainer', { exitCode: 137, signal: 9, oomKilled: false }),
    deleteContainer: call('deleteContainer', undefined),
    destroyPod: call('destroyPod', undefined),
  };
  return { agent: agent as unknown as AgentClient, calls };
}

describe('warmUpGuest', () => {
  it('takes the pod through create, start, output, exec, stop and removal, in that order', async () => {
    const { agent, calls } = fakeAgent();
    const result = await warmUpGuest(agent, 1000, silentLogger());
    expect(result.failed).toBeUndefined();
    expect(Object.keys(result.steps)).toEqual([
      'createPod',
      'createContainer',
      'startContainer',
      'output',
      'exec',
      'stop',
      'deleteContainer',
      'destroyPod',
    ]);
    expect(calls.at(-2)).toBe('deleteContainer');
    expect(calls.at(-1)).toBe('destroyPod');
  });

  it('a failed step (a guest image without the warm root) leaves the guest clean and says why', async () => {
    const { agent, calls } = fakeAgent('startContainer');
    const result = await warmUpGuest(agent, 1000, silentLogger());
    expect(result.failed).toBe('startContainer refused');
    expect(calls).toEqual(['createPod', 'createContainer', 'startContainer', 'deleteContainer', 'destroyPod']);
  });

  it('throws when the cleanup after a failed step fails too (the VM is then discarded)', async () => {
    const { agent } = fakeAgent('exec');
    const broken = {
      ...agent,
      execProcess: async () => Promise.reject(new Error('exec refused')),
      destroyPod: async () => Promise.reject(new Error('gone')),
    };
    await expect(warmUpGuest(broken as unknown as AgentClient, 1000, silentLogger())).rejects.toThrow(
      /warm-up failed \(exec refused\).*could not be removed: gone/,
    );
  });
});
