/**
 * CreateContainer's rollback, driven through ContainerManager with the VM, the cgroup driver and
 * the container store faked: a container that makes a fallback-sized VM grow, then fails to be
 * recorded, leaves memory and cgroup limits as they were (the plugged vCPUs stay, and are logged),
 * its root filesystem removed, and the sandbox record saved as the VM now is.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { CgroupDriver, PlacementRecord } from '../../../src/cgroups/index.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { ContainerConfig__Output } from '../../../src/generated/runtime/v1/ContainerConfig.js';
import type { VmProcess } from '../../../src/hypervisor/index.js';
import { ContainerManager } from '../../../src/runtime/container/manager.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { migrateSandboxRecord, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import type { LiveSandbox, SandboxAccess, SandboxHandle } from '../../../src/runtime/sandbox/types.js';
import { type ContainerSpec, decodeContainerSpec } from '../../../src/runtime/spec/container.js';
import type { RecordStore } from '../../../src/runtime/store.js';

const MiB = 1024 * 1024;
const SANDBOX_ID = 'a1'.repeat(32);

interface World {
  manager: ContainerManager;
  record: SandboxRecord;
  qomSets: number[];
  cpusAdded: string[];
  limits: Array<PlacementRecord['limits']>;
  persisted: number;
  logs: Array<Record<string, unknown>>;
  ctx: RequestContext;
}

async function world(stateDir: string, failRecord: boolean): Promise<World> {
  // The format-1 fixture sandbox, READY, as if sized without pod_resources (so it grows on demand).
  const file = path.join(packageRoot(), 'fixtures', 'records', 'v1', 'sandboxes', `${SANDBOX_ID}.json`);
  const record = migrateSandboxRecord(1, JSON.parse(await readFile(file, 'utf8')).record) as SandboxRecord;
  record.spec = { ...record.spec, pod_resources: null };
  const w = { record, qomSets: [], cpusAdded: [], limits: [], persisted: 0, logs: [] } as unknown as World;
  const slots = [0, 1, 2, 3, 4, 5].map((core) => ({
    type: 'qemu64-x86_64-cpu',
    'vcpus-count': 1,
    props: { 'socket-id': 0, 'core-id': core, 'thread-id': 0 },
    ...(core < 2 ? { 'qom-path': `/machine/unattached/device[${core}]` } : {}),
  }));
  const vm = {
    qmp: {
      qomSet: async (_path: string, _prop: string, bytes: number) => void w.qomSets.push(bytes / MiB),
      queryHotpluggableCpus: async () => slots,
      deviceAdd: async (args: { id: string }) => void w.cpusAdded.push(args.id),
    },
  } as unknown as VmProcess;
  const driver = {
    update: async (p: PlacementRecord, limits: PlacementRecord['limits']) => {
      w.limits.push(limits);
      return { ...p, limits };
    },
  } as unknown as CgroupDriver;
  const handle: SandboxHandle = {
    get record() {
      return record;
    },
    vm,
    agent: undefined,
    persist: async () => void w.persisted++,
    cgroupsFor: () => driver,
  };
  const live: LiveSandbox = { record, vm, agent: undefined, stopping: false };
  const sandboxes: SandboxAccess = {
    find: () => live,
    withSandbox: (_id, fn) => fn(handle),
    withSandboxIfPresent: (_id, fn) => fn(handle),
  } as SandboxAccess;
  const store = {
    put: async () => {
      if (failRecord) throw new Error('disk full');
    },
    delete: async () => {},
  } as unknown as RecordStore<ContainerRecord>;
  const imageRoot = path.join(stateDir, 'image-rootfs');
  await mkdir(imageRoot, { recursive: true });
  await writeFile(path.join(imageRoot, 'hello'), 'hi');
  w.manager = new ContainerManager({
    config: { ...defaultConfig(), stateDir },
    logger: pino({ level: 'silent' }),
    store,
    sandboxes,
    images: {
      resolveImage: () => ({ id: `sha256:${'e'.repeat(64)}`, repoDigests: [] }),
      rootfsSourceFor: () => ({ kind: 'flat', dir: imageRoot }),
      imageConfig: async () => ({ Cmd: ['sh'] }),
    },
    host: { cpus: 16, memoryMiB: 65536 },
    readPcieFacts: () => Promise.reject(new Error('no devices asked for')),
    guests: {
      agentOf: () => undefined,
      sharedDirOf: () => path.join(stateDir, 'shared'),
      sharedDirsRoot: stateDir,
      guestSharedDir: '/run/kata-ts/shared',
      guestPodOf: () => null,
    },
  });
  const logger = pino({ level: 'debug' }, { write: (s: string) => void w.logs.push(JSON.parse(s)) });
  w.ctx = { method: 'CreateContainer', logger, signal: new AbortController().signal, deadlineMs: undefined, annotate: () => {} };
  return w;
}

/** Needs 4 vCPUs' worth and 1 GiB: the 2-vCPU, 800 MiB VM must grow. */
function bigContainer(): ContainerSpec {
  return decodeContainerSpec(
    decodeProtoJson<ContainerConfig__Output>('runtime.v1.ContainerConfig', {
      metadata: { name: 'big' },
      image: { image: 'app:1' },
      kubernetesResources: { limits: { cpu: { string: '3' }, memory: { string: '1Gi' } } },
    }),
  );
}

describe('CreateContainer rollback', () => {
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-create-'));
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('without a failure the VM grows and the sandbox is saved once', async () => {
    const w = await world(stateDir, false);
    const id = await w.manager.create(SANDBOX_ID, bigContainer(), w.ctx);
    expect(w.record.shape.vcpus).toBeGreaterThan(2);
    expect(w.record.shape.memoryMiB).toBeGreaterThan(800);
    expect(w.cpusAdded.length).toBe(w.record.shape.vcpus - 2);
    expect(w.persisted).toBe(1);
    expect(await readdir(path.join(stateDir, 'rootfs'))).toEqual([id]);
    // The image is in use through the registered record (the create's own hold was released).
    const imageId = w.manager.resolve(id).image.id;
    expect(w.manager.isImageInUse(imageId)).toBe(true);
  });

  it('a failure after the resize sets memory and limits back, logs the vCPUs that stay, removes the rootfs', async () => {
    const w = await world(stateDir, true);
    const limitsBefore = { ...w.record.placement!.limits };
    await expect(w.manager.create(SANDBOX_ID, bigContainer(), w.ctx)).rejects.toThrow('disk full');

    // Grown, then set back: virtio-mem to 0 MiB above boot, the cgroup limits to what they were.
    expect(w.qomSets.length).toBe(2);
    expect(w.qomSets[0]).toBeGreaterThan(0);
    expect(w.qomSets[1]).toBe(0);
    expect(w.limits.length).toBe(2);
    expect(w.limits[1]).toEqual(limitsBefore);
    expect(w.record.placement!.limits).toEqual(limitsBefore);
    expect(w.record.shape.memoryMiB).toBe(800);
    // vCPUs are never unplugged: the record keeps them and the rollback says so, with the numbers.
    expect(w.record.shape.vcpus).toBe(2 + w.cpusAdded.length);
    expect(w.logs.some((l) => String(l.msg).includes('vCPUs stay') && l.before === 2)).toBe(true);
    expect(w.persisted).toBe(1);
    expect(await readdir(path.join(stateDir, 'rootfs'))).toEqual([]);
    expect(w.manager.list(null)).toEqual([]);
    // The create's hold on its image and layers went with the rollback.
    expect(w.manager.isImageInUse(`sha256:${'e'.repeat(64)}`)).toBe(false);
    expect(w.manager.layersInUse()).toEqual(new Set());
  });
});
