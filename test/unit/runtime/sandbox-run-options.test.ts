/**
 * SandboxManager.run's options (SandboxRunOptions), as the shim face passes them: the caller's id
 * is checked by containerd's identifier rule (INVALID_ARGUMENT naming the field) and must name no
 * sandbox, recovered or still being made (ALREADY_EXISTS); the pod-identity check stays first.
 * The manager runs on a temp state dir holding the format-4 fixture sandbox; a request that
 * passes reaches RunPodSandbox's first check that reads the host (the guest assets, missing here)
 * with the caller's id, which proves the id was taken.
 */
import { cp, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createCgroupDriver } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { SandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { rejection } from '../../helpers/kata-error.js';
import { testFacts } from '../../helpers/runtime-facts.js';

const FIXTURE_ID = 'a1'.repeat(32);

describe('SandboxManager.run options', () => {
  let stateDir: string;
  let manager: SandboxManager;
  let fixture: SandboxRecord;
  const annotated: Array<Record<string, unknown>> = [];
  const ctx: RequestContext = {
    method: 'RunPodSandbox',
    logger: silentLogger(),
    signal: new AbortController().signal,
    deadlineMs: undefined,
    annotate: (fields) => void annotated.push(fields),
  };
  /** The fixture pod's spec under another identity (uid), so that only the id can clash. */
  const otherPod = (uid: string): SandboxSpec => ({ ...fixture.spec, metadata: { ...fixture.spec.metadata, uid } });

  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-runopts-'));
    await cp(path.join(packageRoot(), 'fixtures', 'records', 'v4'), stateDir, { recursive: true, filter: (s) => !s.endsWith('README.md') });
    const logger = silentLogger();
    const config = { ...defaultConfig(), stateDir };
    config.hypervisor = {
      ...config.hypervisor,
      kernelPath: path.join(stateDir, 'no-kernel'),
      initrdPath: path.join(stateDir, 'no-initrd'),
    };
    const cgroups = createCgroupDriver('cgroupfs', { cgroupRoot: path.join(stateDir, 'no-cgroups'), dbusAddress: null, logger });
    manager = new SandboxManager({
      config,
      facts: testFacts(),
      logger,
      metrics: new RuntimeMetrics(),
      cgroups,
      store: new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, logger),
      host: { cpus: 16, memoryMiB: 65536 },
      readPcieFacts: () => Promise.reject(new Error('not reached')),
      cgroupDriverNamed: () => cgroups,
      listener: { sandboxStopping: async () => {}, sandboxStopped: async () => {}, sandboxRemoving: async () => {} },
    });
    await manager.recover();
    fixture = manager.resolve(FIXTURE_ID).record;
    annotated.length = 0;
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it("an id that breaks containerd's identifier rule is INVALID_ARGUMENT naming the field", async () => {
    for (const id of ['', 'a b', 'pod..1', '-pod', 'pod-', 'a/b', 'x'.repeat(77), 'pod_1\n']) {
      const err = await rejection(manager.run(otherPod(`u-${id}`), '', ctx, { id }));
      expect([err.kind, err.reason, err.details]).toEqual(['invalid', 'SANDBOX_ID_INVALID', { field: 'id', id }]);
      expect(err.message).toMatch(/^id /);
    }
    expect(annotated).toEqual([]);
  });

  it('the id of an existing sandbox, or of one being made, is ALREADY_EXISTS; the same pod is refused by identity first', async () => {
    const clash = await rejection(manager.run(otherPod('u-2'), '', ctx, { id: FIXTURE_ID }));
    expect([clash.kind, clash.reason, clash.details]).toEqual(['exists', 'SANDBOX_ID_EXISTS', { field: 'id', id: FIXTURE_ID }]);
    const same = await rejection(manager.run(fixture.spec, '', ctx, { id: 'pod-new' }));
    expect([same.kind, same.reason]).toEqual(['exists', 'SANDBOX_EXISTS']);
    // Two requests for one new id: the second is refused while the first is still being made.
    const first = manager.run(otherPod('u-3'), '', ctx, { id: 'pod-3' });
    const second = await rejection(manager.run(otherPod('u-4'), '', ctx, { id: 'pod-3' }));
    expect(second.reason).toBe('SANDBOX_ID_EXISTS');
    expect((await rejection(first)).reason).toBe('GUEST_ASSETS_MISSING');
  });

  it("a good id is taken as the sandbox's id, and freed again when the creation fails", async () => {
    for (const id of ['pod-1.web_2', 'b2'.repeat(32), 'x'.repeat(76)]) {
      expect((await rejection(manager.run(otherPod(`u-${id}`), '', ctx, { id }))).reason).toBe('GUEST_ASSETS_MISSING');
      expect(annotated.at(-1)).toEqual({ sandboxId: id });
      expect((await rejection(manager.run(otherPod(`u-${id}`), '', ctx, { id }))).reason).toBe('GUEST_ASSETS_MISSING');
    }
    // Without options (the CRI face): a new 64-hex id, as before.
    await rejection(manager.run(otherPod('u-cri'), '', ctx));
    expect(String(annotated.at(-1)?.sandboxId)).toMatch(/^[0-9a-f]{64}$/);
  });
});
