/**
 * A request refused for its names changes nothing: RunPodSandbox and CreateContainer, driven
 * through SandboxManager.run and ContainerManager.create with a state dir in a temp folder and
 * every collaborator that could act on the world (cgroup driver, pod network, record stores, PCIe
 * inventory, guest agent, images) replaced by a tripwire that records each use. A hostile name is
 * refused with INVALID_ARGUMENT before any tripwire is touched and no file appears; the same
 * request with a good name reaches the first tripwire, which is what makes the check mean something.
 */
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { decodeCreateContainer } from '../../../src/cri/decode/container.js';
import { decodeRunPodSandbox } from '../../../src/cri/decode/sandbox.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { CreateContainerRequest__Output } from '../../../src/generated/runtime/v1/CreateContainerRequest.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { ContainerManager } from '../../../src/runtime/container/manager.js';
import { CONTAINER_RECORD_KIND, type ContainerRecord } from '../../../src/runtime/container/record.js';
import type { ContainerManagerDeps } from '../../../src/runtime/container/types.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { SandboxHandle, SandboxManagerDeps } from '../../../src/runtime/sandbox/types.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { rejection } from '../../helpers/kata-error.js';
import { testFacts } from '../../helpers/runtime-facts.js';

const REACHED = 'reached a collaborator';

/** An object whose every member, used, is recorded in `touched` and throws REACHED. */
function tripwire<T>(name: string, touched: string[]): T {
  return new Proxy(
    {},
    {
      get: (_target, prop) => {
        if (prop === 'then') return undefined; // not a thenable
        touched.push(`${name}.${String(prop)}`);
        return () => {
          throw new Error(REACHED);
        };
      },
    },
  ) as T;
}

/** `real`, with every member used recorded in `touched` (and still working). */
function spy<T extends object>(name: string, real: T, touched: string[]): T {
  return new Proxy(real, {
    get: (target, prop, receiver) => {
      touched.push(`${name}.${String(prop)}`);
      const v = Reflect.get(target, prop, receiver);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true });
  return entries.map(String).sort();
}

const ctx = (method: string): RequestContext => ({
  method,
  logger: silentLogger(),
  signal: new AbortController().signal,
  deadlineMs: undefined,
  annotate: () => {},
});

const UID = '7d5c2a0e-3b8f-4c1a-9e6d-2f4b8a1c0d11';
const GOOD_POD = {
  metadata: { name: 'web', uid: UID, namespace: 'shop' },
  hostname: 'web',
  labels: { app: 'web' },
  annotations: { 'kubernetes.io/config.source': 'api' },
  linux: { cgroupParent: `/kubepods/pod${UID}` },
};

/** Hostile edits of a good pod, one field each: the fuzzers' cases, as the issue tried them. */
const HOSTILE_PODS: Array<[string, Record<string, unknown>]> = [
  ['a NUL byte in the pod name', { metadata: { ...GOOD_POD.metadata, name: 'web\0' } }],
  ['a 300 KB pod name', { metadata: { ...GOOD_POD.metadata, name: 'w'.repeat(300 * 1024) } }],
  ['a control character in the namespace', { metadata: { ...GOOD_POD.metadata, namespace: 'shop\u001b' } }],
  ['a control character in the uid', { metadata: { ...GOOD_POD.metadata, uid: `${UID}\n` } }],
  ['a control character in the hostname', { hostname: 'web\r' }],
  ['a label key that is not a qualified name', { labels: { '../../etc/passwd': 'x' } }],
  ['annotations past the size budget', { annotations: { big: 'x'.repeat(300 * 1024) } }],
];

describe('a RunPodSandbox refused for its names changes nothing', () => {
  let stateDir: string;
  let touched: string[];
  let manager: SandboxManager;

  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-names-'));
    touched = [];
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
    await store.init();
    const deps: SandboxManagerDeps = {
      config: { ...defaultConfig(), stateDir },
      facts: testFacts(),
      logger: silentLogger(),
      metrics: new RuntimeMetrics(),
      store: spy('store', store, touched),
      cgroups: tripwire('cgroups', touched),
      network: tripwire('network', touched),
      host: { cpus: 4, memoryMiB: 8192 },
      readPcieFacts: tripwire<{ f(): never }>('pcie', touched).f,
      cgroupDriverNamed: tripwire<{ f(): never }>('cgroupDriverNamed', touched).f,
      listener: tripwire('listener', touched),
      connectAgent: tripwire<{ f(): never }>('agent', touched).f,
    };
    manager = new SandboxManager(deps);
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  const request = (edit: Record<string, unknown>) =>
    decodeProtoJson<RunPodSandboxRequest__Output>('runtime.v1.RunPodSandboxRequest', { config: { ...GOOD_POD, ...edit } });
  /** What the CRI face does with a RunPodSandbox: decode once, then the core's run. */
  const run = async (req: RunPodSandboxRequest__Output, c: RequestContext) => {
    const { spec, runtimeHandler } = decodeRunPodSandbox(req);
    return manager.run(spec, runtimeHandler, c);
  };

  it('a good pod gets past decoding to the cgroup driver (the tripwire works)', async () => {
    await expect(run(request({}), ctx('RunPodSandbox'))).rejects.toThrow(REACHED);
    expect(touched).toContain('cgroups.validateParent');
  });

  it.each(HOSTILE_PODS)('%s: INVALID_ARGUMENT, no collaborator used, no file written', async (_what, edit) => {
    // Touched while the tripwires were set up (the spied store's init) does not count.
    touched.length = 0;
    const before = await filesUnder(stateDir);
    const err = await rejection(run(request(edit), ctx('RunPodSandbox')));
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^config\.(metadata\.(name|namespace|uid)|hostname|labels|annotations)\b/);
    expect(touched).toEqual([]);
    expect(await filesUnder(stateDir)).toEqual(before);
    // Nor is the pod's identity held: the good request is not ALREADY_EXISTS afterwards.
    await expect(run(request({}), ctx('RunPodSandbox'))).rejects.toThrow(REACHED);
  });
});

describe('a CreateContainer refused for its names changes nothing', () => {
  let stateDir: string;
  let touched: string[];
  let manager: ContainerManager;

  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-names-'));
    touched = [];
    const store = new RecordStore<ContainerRecord>(stateDir, CONTAINER_RECORD_KIND, silentLogger());
    await store.init();
    // A READY sandbox whose VM, agent and persistence are tripwires: only its id and state are read.
    const handle = {
      record: { id: 'a1'.repeat(32), state: 'SANDBOX_READY' } as SandboxRecord,
      vm: tripwire('vm', touched),
      agent: tripwire('agent', touched),
      persist: tripwire<{ f(): never }>('sandbox', touched).f,
      cgroupsFor: tripwire<{ f(): never }>('cgroupsFor', touched).f,
    } as SandboxHandle;
    const deps: ContainerManagerDeps = {
      config: { ...defaultConfig(), stateDir },
      logger: silentLogger(),
      store: spy('store', store, touched),
      sandboxes: {
        find: () => undefined,
        withSandbox: (_id, fn) => fn(handle),
        withSandboxIfPresent: (_id, fn) => fn(handle),
      },
      images: tripwire('images', touched),
      host: { cpus: 4, memoryMiB: 8192 },
      readPcieFacts: tripwire<{ f(): never }>('pcie', touched).f,
      guests: tripwire('guests', touched),
    };
    manager = new ContainerManager(deps);
    touched.length = 0;
  });
  afterEach(async () => {
    await manager.close();
    await rm(stateDir, { recursive: true, force: true });
  });

  const request = (config: Record<string, unknown>) =>
    decodeProtoJson<CreateContainerRequest__Output>('runtime.v1.CreateContainerRequest', {
      podSandboxId: 'a1'.repeat(32),
      config: { metadata: { name: 'app' }, image: { image: 'busybox' }, ...config },
    });

  /** What the CRI face does with a CreateContainer: decode once, then the core's create. */
  const create = async (req: CreateContainerRequest__Output, c: RequestContext) => {
    const { sandboxId, spec } = decodeCreateContainer(req);
    return manager.create(sandboxId, spec, c);
  };

  it('a good container gets past decoding to the image lookup (the tripwire works)', async () => {
    await expect(create(request({}), ctx('CreateContainer'))).rejects.toThrow(REACHED);
    expect(touched).toContain('images.resolveImage');
  });

  it.each([
    ['a NUL byte in the container name', { metadata: { name: 'app\0' } }],
    ['a 300 KB container name', { metadata: { name: 'a'.repeat(300 * 1024) } }],
    ['a label key with a control character', { labels: { 'a\u0007': 'x' } }],
    ['an annotation value with a NUL byte', { annotations: { note: 'a\0b' } }],
  ])('%s: INVALID_ARGUMENT, no collaborator used, no file written', async (_what, config) => {
    const before = await filesUnder(stateDir);
    const err = await rejection(create(request(config), ctx('CreateContainer')));
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^config\.(metadata\.name|labels|annotations)\b/);
    expect(touched).toEqual([]);
    expect(await filesUnder(stateDir)).toEqual(before);
  });
});
