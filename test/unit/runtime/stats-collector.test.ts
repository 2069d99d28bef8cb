/**
 * StatsCollector measures a container's writable layer on the host where kata-ts owns it
 * (standalone) and leaves it unmeasured behind containerd (the shim's pod core), whose snapshotter
 * measures its own snapshots: there, a Stats call must not walk the container's root.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import { StatsCollector } from '../../../src/runtime/container/stats-service.js';
import type { SandboxGuestAccess } from '../../../src/runtime/container/types.js';
import { sandboxPausedError } from '../../../src/runtime/sandbox/pause.js';
import type { LiveSandbox } from '../../../src/runtime/sandbox/types.js';

describe('StatsCollector', () => {
  let root: string;
  beforeEach(() => {
    root = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-stats-'));
    writeFileSync(path.join(root, 'written'), Buffer.alloc(64 * 1024, 1));
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const record = () =>
    ({ id: 'c1', sandboxId: 's1', state: 'CONTAINER_EXITED', rootfs: root, rootfsOverlay: null }) as unknown as ContainerRecord;
  const lookup = { list: () => [], inSandbox: () => [] };
  const guests = { agentOf: () => undefined } as unknown as SandboxGuestAccess;

  it("measures the writable layer by default (standalone: kata-ts owns the container's root)", async () => {
    const [usage] = await new StatsCollector(lookup, guests).forContainers([record()]);
    expect(usage?.writableLayer?.inodes).toBe(2);
    expect(usage?.writableLayer?.bytes).toBeGreaterThanOrEqual(64 * 1024);
  });

  it('with layerUsage off reports no layer and reads nothing under the root (behind containerd)', async () => {
    const [usage] = await new StatsCollector(lookup, guests, { layerUsage: false }).forContainers([record()]);
    expect(usage?.writableLayer).toBeNull();
  });

  it('a paused pod (its agent refuses every call) reports no usage, and the listing goes on', async () => {
    const refusing = {
      containerStats: () => Promise.reject(sandboxPausedError('s1')),
      guestStats: () => Promise.reject(sandboxPausedError('s1')),
    };
    const paused = { agentOf: () => refusing } as unknown as SandboxGuestAccess;
    const running = { ...record(), state: 'CONTAINER_RUNNING' } as ContainerRecord;
    const collector = new StatsCollector(lookup, paused, { layerUsage: false });
    const [usage] = await collector.forContainers([running]);
    expect(usage).toBeDefined();
    expect(usage?.cpu ?? null).toBeNull();
    const live = { record: { id: 's1', state: 'SANDBOX_READY' } } as unknown as LiveSandbox;
    const pod = await collector.forSandbox(live);
    expect(pod.cpu).toBeNull();
    expect(pod.memory).toBeNull();
  });

  it('any other guest failure still fails the call', async () => {
    const broken = { containerStats: () => Promise.reject(new Error('boom')) };
    const guestsBroken = { agentOf: () => broken } as unknown as SandboxGuestAccess;
    const running = { ...record(), state: 'CONTAINER_RUNNING' } as ContainerRecord;
    await expect(new StatsCollector(lookup, guestsBroken, { layerUsage: false }).forContainers([running])).rejects.toThrow('boom');
  });
});
