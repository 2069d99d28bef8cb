/**
 * Records written by format 1 (fixtures/records/v1, produced by that format's own code) load
 * through today's code: migrated to format 2 on load, written back, and recovered.
 */
import { cp, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createCgroupDriver } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { ContainerManager } from '../../../src/runtime/container/manager.js';
import {
  CONTAINER_RECORD_KIND,
  CONTAINER_RECORD_VERSION,
  type ContainerRecord,
  migrateContainerRecord,
} from '../../../src/runtime/container/record.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { migrateSandboxRecord, SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import { decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { testFacts } from '../../helpers/runtime-facts.js';

const FIXTURES = path.join(packageRoot(), 'fixtures', 'records', 'v1');
const SANDBOX_ID = 'a1'.repeat(32);
const CONTAINER_ID = 'c2'.repeat(32);

/**
 * A migrated record without what format 6 added, checked to be what an old sandbox was (QEMU as
 * root, no seccomp, no jail): comparable with the record as its own format wrote it.
 */
function withoutFormat6(record: SandboxRecord | undefined): Record<string, unknown> {
  expect(record?.confinement).toBeNull();
  expect(record?.plan.vmm).toEqual({ seccomp: null, unprivileged: false, identityRange: null, optOutReason: null });
  const { confinement: _c, plan, ...rest } = record!;
  const { vmm: _v, ...oldPlan } = plan;
  return { ...rest, plan: oldPlan };
}

async function envelope(dir: string, id: string): Promise<{ kind: string; version: number; record: Record<string, unknown> }> {
  return JSON.parse(await readFile(path.join(FIXTURES, dir, `${id}.json`), 'utf8'));
}

describe('format-1 records', () => {
  it('are what format 1 wrote: version 1, podConfig and config blobs', async () => {
    const s = await envelope('sandboxes', SANDBOX_ID);
    const c = await envelope('containers', CONTAINER_ID);
    expect([s.version, c.version]).toEqual([1, 1]);
    expect(s.record).toHaveProperty('podConfig');
    expect(c.record).toHaveProperty('config');
  });

  it('a sandbox migrates to the spec today’s decoder makes of the same request', async () => {
    const { record } = await envelope('sandboxes', SANDBOX_ID);
    const migrated = migrateSandboxRecord(1, record) as SandboxRecord;
    const request = decodeProtoJson<RunPodSandboxRequest__Output>(
      'runtime.v1.RunPodSandboxRequest',
      JSON.parse(await readFile(path.join(packageRoot(), 'fixtures', 'pods', 'web-sidecar.request.json'), 'utf8')),
    );
    expect(migrated).not.toHaveProperty('podConfig');
    expect(JSON.parse(JSON.stringify(migrated.spec))).toEqual(JSON.parse(JSON.stringify(decodeSandboxSpec(request.config))));
    expect(withoutFormat6(migrated).plan).toEqual(record.plan);
  });

  it('a sandbox resized by format 1 without a linux part (a partial linux object) migrates with defaults', async () => {
    const { record } = await envelope('sandboxes', SANDBOX_ID);
    const podConfig = { ...(record.podConfig as Record<string, unknown>), linux: { resources: { cpu_quota: '200000' } } };
    const migrated = migrateSandboxRecord(1, { ...record, podConfig }) as SandboxRecord;
    expect(migrated.spec.linux).toEqual({
      cgroup_parent: '',
      security_context: null,
      sysctls: {},
      overhead: null,
      resources: { cpu_quota: '200000' },
    });
  });

  it('a container migrates with its command, env, mounts, security context and resources typed', async () => {
    const { record } = await envelope('containers', CONTAINER_ID);
    const { spec } = migrateContainerRecord(1, record) as ContainerRecord;
    expect(spec.metadata).toEqual({ name: 'web', attempt: 0 });
    expect(spec.image.image).toBe('registry.example/nginx:1.27');
    expect([spec.command, spec.args, spec.working_dir]).toEqual([['nginx'], ['-g', 'daemon off;'], '/srv']);
    expect(spec.envs).toEqual([{ key: 'PORT', value: '80' }]);
    expect(spec.mounts.map((m) => m.container_path)).toEqual(['/var/log/nginx', '/etc/nginx/conf.d']);
    expect(spec.linux?.security_context?.run_as_user).toEqual({ value: '101' });
    expect(spec.linux?.resources?.memory_limit_in_bytes).toBe('536870912');
    expect(spec.kubernetes_resources?.limits.memory).toMatchObject({ string: '512Mi' });
    expect(spec.stop_signal).toBe('RUNTIME_DEFAULT');
  });

  it('a format-1 record without the blob is not migrated', () => {
    expect(() => migrateSandboxRecord(1, { id: SANDBOX_ID })).toThrow(/podConfig/);
    expect(() => migrateContainerRecord(1, { id: CONTAINER_ID, config: { metadata: null } })).toThrow();
    expect(() => migrateSandboxRecord(0, {})).toThrow(/format 0/);
  });
});

describe('loading and recovering format-1 records', () => {
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v1-'));
    await cp(FIXTURES, stateDir, { recursive: true, filter: (src) => !src.endsWith('README.md') });
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('the store migrates them on load and writes them back in the current format', async () => {
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    expect(records.map((r) => [r.id, r.spec.metadata.name, r.spec.log_directory])).toEqual([
      [SANDBOX_ID, 'web', '/var/log/pods/shop_web_7d5c2a0e-3b8f-4c1a-9e6d-2f4b8a1c0d11'],
    ]);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(onDisk.version).toBe(SANDBOX_RECORD_KIND.version);
    expect([onDisk.record.virtiofsd, onDisk.record.guestPod]).toEqual([null, null]);
    expect(onDisk.record.spec.metadata.uid).toBe('7d5c2a0e-3b8f-4c1a-9e6d-2f4b8a1c0d11');
    // Loading again reads the current format as is.
    expect((await store.load()).records).toEqual(records);
  });

  it('recovery keeps them: the sandbox whose QEMU is gone is NOTREADY, its container EXITED', async () => {
    const logger = silentLogger();
    const config = { ...defaultConfig(), stateDir };
    const cgroups = createCgroupDriver('cgroupfs', { cgroupRoot: path.join(stateDir, 'no-cgroups'), dbusAddress: null, logger });
    const sandboxStore = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, logger);
    const containerStore = new RecordStore<ContainerRecord>(stateDir, CONTAINER_RECORD_KIND, logger);
    const sandboxes: SandboxManager = new SandboxManager({
      config,
      facts: testFacts(),
      logger,
      metrics: new RuntimeMetrics(),
      cgroups,
      store: sandboxStore,
      host: { cpus: 16, memoryMiB: 65536 },
      readPcieFacts: () => Promise.reject(new Error('not read during recovery')),
      cgroupDriverNamed: () => cgroups,
      listener: {
        sandboxStopping: (id, ms) => containers.sandboxStopping(id, ms),
        sandboxStopped: (id) => containers.sandboxStopped(id),
        sandboxRemoving: (id) => containers.sandboxRemoving(id),
      },
    });
    const containers: ContainerManager = new ContainerManager({
      config,
      logger,
      store: containerStore,
      sandboxes,
      images: { resolveImage: () => undefined, rootfsSourceFor: () => ({ kind: 'flat', dir: '' }), imageConfig: async () => null },
      host: { cpus: 16, memoryMiB: 65536 },
      readPcieFacts: () => Promise.reject(new Error('not read during recovery')),
      guests: {
        agentOf: () => undefined,
        sharedDirOf: () => '/nonexistent',
        sharedDirsRoot: '/nonexistent',
        guestSharedDir: '/run/kata-ts/shared',
        guestPodOf: () => null,
      },
    });
    await sandboxes.recover();
    await containers.recover();

    const live = sandboxes.resolve(SANDBOX_ID);
    expect(live.record.state).toBe('SANDBOX_NOTREADY');
    expect(live.record.exit?.reason).toBe('gone-while-down');
    expect(live.record.spec.metadata).toEqual({ name: 'web', uid: '7d5c2a0e-3b8f-4c1a-9e6d-2f4b8a1c0d11', namespace: 'shop', attempt: 0 });
    const container = containers.resolve(CONTAINER_ID);
    expect([container.state, container.reason]).toEqual(['CONTAINER_EXITED', 'SandboxStopped']);
    expect(container.spec.command).toEqual(['nginx']);

    // Both files are in the current format now, and StopContainer of an id that never existed succeeds.
    for (const kind of [SANDBOX_RECORD_KIND, CONTAINER_RECORD_KIND]) {
      for (const name of (await readdir(path.join(stateDir, kind.dir))).filter((n) => n.endsWith('.json'))) {
        expect(JSON.parse(await readFile(path.join(stateDir, kind.dir, name), 'utf8')).version).toBe(kind.version);
      }
    }
    const ctx: RequestContext = {
      method: 'StopContainer',
      logger,
      signal: new AbortController().signal,
      deadlineMs: undefined,
      annotate: () => {},
    };
    await expect(containers.stop('f'.repeat(64), 10, ctx)).resolves.toBeUndefined();
  });
});

describe('format-2 records (written before the agent and virtio-fs)', () => {
  const V2 = path.join(packageRoot(), 'fixtures', 'records', 'v2');
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v2-'));
    await cp(V2, stateDir, { recursive: true, filter: (src) => !src.endsWith('README.md') });
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('are format 2 as that code wrote them, without virtiofsd or guestPod', async () => {
    const s = JSON.parse(await readFile(path.join(V2, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(s.version).toBe(2);
    expect(s.record).not.toHaveProperty('virtiofsd');
    expect(s.record).not.toHaveProperty('guestPod');
    expect(s.record.vmm).not.toHaveProperty('agentSocket');
  });

  it('migrate on load to the current format with virtiofsd and guestPod null, the rest unchanged', async () => {
    const original = JSON.parse(await readFile(path.join(V2, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    const [record] = records;
    expect([record?.virtiofsd, record?.guestPod]).toEqual([null, null]);
    expect(
      JSON.parse(JSON.stringify({ ...withoutFormat6(record), virtiofsd: undefined, guestPod: undefined, network: undefined })),
    ).toEqual(original.record);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(onDisk.version).toBe(SANDBOX_RECORD_KIND.version);
    expect((await store.load()).records).toEqual(records);
  });

  it('a format-2 record is not migrated twice: virtiofsd and guestPod values are kept', () => {
    const migrated = migrateSandboxRecord(2, { id: SANDBOX_ID, guestPod: { pausePid: 7, shmPath: '/x' } }) as SandboxRecord;
    expect(migrated.guestPod).toEqual({ pausePid: 7, shmPath: '/x' });
    expect(migrated.virtiofsd).toBeNull();
  });
});

describe('format-3 records (written before pod networking)', () => {
  const V3 = path.join(packageRoot(), 'fixtures', 'records', 'v3');
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v3-'));
    await cp(V3, stateDir, { recursive: true, filter: (src) => !src.endsWith('README.md') });
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('are format 3 as that code wrote them, without network', async () => {
    const s = JSON.parse(await readFile(path.join(V3, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(s.version).toBe(3);
    expect(s.record).not.toHaveProperty('network');
    expect(s.record).toHaveProperty('guestPod');
  });

  it('migrate on load to the current format with network null, the rest unchanged', async () => {
    const original = JSON.parse(await readFile(path.join(V3, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    const [record] = records;
    expect(record?.network).toBeNull();
    expect(JSON.parse(JSON.stringify({ ...withoutFormat6(record), network: undefined }))).toEqual(original.record);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(onDisk.version).toBe(SANDBOX_RECORD_KIND.version);
    expect((await store.load()).records).toEqual(records);
  });

  it('a network already there is kept by the migration (as one kata-ts made with CNI)', () => {
    const migrated = migrateSandboxRecord(3, { id: SANDBOX_ID, network: { netnsName: 'x' } }) as SandboxRecord;
    expect(migrated.network).toEqual({ kind: 'cni', netnsName: 'x' });
  });
});

describe('format-4 records (written before joined network namespaces)', () => {
  const V4 = path.join(packageRoot(), 'fixtures', 'records', 'v4');
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v4-'));
    await cp(V4, stateDir, { recursive: true, filter: (src) => !src.endsWith('README.md') });
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('are format 4 as that code wrote them, a CNI network without a kind', async () => {
    const s = JSON.parse(await readFile(path.join(V4, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(s.version).toBe(4);
    expect(s.record.network).toMatchObject({ netnsName: `kata-ts-${SANDBOX_ID.slice(0, 16)}`, cniAttached: false });
    expect(s.record.network).not.toHaveProperty('kind');
  });

  it('migrate on load to the current format with network.kind "cni", the rest unchanged', async () => {
    const original = JSON.parse(await readFile(path.join(V4, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    const [record] = records;
    expect(record?.network?.kind).toBe('cni');
    const { kind: _kind, ...network } = record!.network!;
    expect(JSON.parse(JSON.stringify({ ...withoutFormat6(record), network }))).toEqual(original.record);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(onDisk.version).toBe(SANDBOX_RECORD_KIND.version);
    expect((await store.load()).records).toEqual(records);
  });

  it('a format-4 sandbox without a network migrates with none; a kind already there is kept', () => {
    expect((migrateSandboxRecord(4, { id: SANDBOX_ID, network: null }) as SandboxRecord).network).toBeNull();
    const joined = { kind: 'joined', netnsName: null, netnsPath: '/proc/1/ns/net' };
    expect((migrateSandboxRecord(4, { id: SANDBOX_ID, network: joined }) as SandboxRecord).network).toEqual(joined);
    expect(() => migrateSandboxRecord(9, {})).toThrow(/format 9/);
  });

  it('a format-6 sandbox (before the pool) migrates without an origin: a cold boot', () => {
    const migrated = migrateSandboxRecord(6, { id: SANDBOX_ID, network: null, confinement: null }) as SandboxRecord;
    expect(migrated.origin).toBeUndefined();
    // Format 9 added the template origin (a clone of a VM template).
    expect(SANDBOX_RECORD_KIND.version).toBe(9);
  });
});

describe('format-5 records (written before confined VMMs)', () => {
  const V5 = path.join(packageRoot(), 'fixtures', 'records', 'v5');
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v5-'));
    await cp(V5, stateDir, { recursive: true, filter: (src) => !src.endsWith('README.md') });
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('are format 5 as that code wrote them, without confinement or plan.vmm', async () => {
    const s = JSON.parse(await readFile(path.join(V5, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(s.version).toBe(5);
    expect(s.record).not.toHaveProperty('confinement');
    expect(s.record.plan).not.toHaveProperty('vmm');
    expect(s.record.plan.qemu.argv).not.toContain('-sandbox');
  });

  it('migrate on load to the current format as a root QEMU without seccomp (confinement null), the rest unchanged', async () => {
    const original = JSON.parse(await readFile(path.join(V5, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    expect(JSON.parse(JSON.stringify(withoutFormat6(records[0])))).toEqual(original.record);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'sandboxes', `${SANDBOX_ID}.json`), 'utf8'));
    expect(onDisk.version).toBe(SANDBOX_RECORD_KIND.version);
    expect((await store.load()).records).toEqual(records);
  });

  it('a confinement or plan.vmm already there is kept by the migration', () => {
    const confinement = { seccomp: 'on', identity: null, jailDir: null, vmmDir: null, optOutReason: 'x' };
    const vmm = { seccomp: 'on', unprivileged: false, identityRange: null, optOutReason: 'x' };
    const migrated = migrateSandboxRecord(5, { id: SANDBOX_ID, confinement, plan: { handler: 'h', vmm } }) as SandboxRecord;
    expect([migrated.confinement, migrated.plan.vmm]).toEqual([confinement, vmm]);
  });
});

describe('sandbox ids of a caller (format 5)', () => {
  it('a record holds a containerd identifier as its id, and a container record names it as its sandbox', async () => {
    const stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v5-'));
    try {
      await cp(path.join(packageRoot(), 'fixtures', 'records', 'v4'), stateDir, {
        recursive: true,
        filter: (src) => !src.endsWith('README.md'),
      });
      const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, silentLogger());
      const [record] = (await store.load()).records;
      for (const id of ['pod-1.web_2', 'a'.repeat(76)]) await store.put({ ...record!, id });
      await expect(store.put({ ...record!, id: 'a'.repeat(77) })).rejects.toThrow();
      await expect(store.put({ ...record!, id: 'pod..1' })).rejects.toThrow();
      expect((await store.load()).records.map((r) => r.id).sort()).toEqual([SANDBOX_ID, 'a'.repeat(76), 'pod-1.web_2'].sort());
      const schema = CONTAINER_RECORD_KIND.schema as { properties: { sandboxId: { pattern: string; maxLength: number } } };
      expect(new RegExp(schema.properties.sandboxId.pattern).test('pod-1.web_2')).toBe(true);
      expect(schema.properties.sandboxId.maxLength).toBe(76);
    } finally {
      await rm(stateDir, { recursive: true, force: true });
    }
  });
});

describe('format-4 container records (written before the shim face)', () => {
  const V4 = path.join(packageRoot(), 'fixtures', 'records', 'v4');
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-v4-'));
    await cp(V4, stateDir, { recursive: true, filter: (src) => !src.endsWith('README.md') });
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  async function fixture(): Promise<{ name: string; envelope: { version: number; record: Record<string, unknown> } }> {
    const [name] = await readdir(path.join(V4, 'containers'));
    return { name: name!, envelope: JSON.parse(await readFile(path.join(V4, 'containers', name!), 'utf8')) };
  }

  it('are format 4 as that code wrote them, with a guest plan and without rootfsOwner, stdio or pid', async () => {
    const { envelope } = await fixture();
    expect(envelope.version).toBe(4);
    expect(envelope.record).not.toHaveProperty('rootfsOwner');
    expect(envelope.record).not.toHaveProperty('stdio');
    expect(envelope.record).not.toHaveProperty('pid');
    expect((envelope.record.guest as { bindMounts: string[] }).bindMounts).toHaveLength(1);
  });

  it('migrate on load: kata-ts owns the rootfs (a copy), the CRI log, pid unknown; the rest unchanged; written back as the current format', async () => {
    const { name, envelope } = await fixture();
    const store = new RecordStore<ContainerRecord>(stateDir, CONTAINER_RECORD_KIND, silentLogger());
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    const [record] = records;
    expect([record?.rootfsOwner, record?.stdio, record?.pid, record?.rootfsOverlay]).toEqual(['runtime', { kind: 'cri-log' }, 0, null]);
    expect(
      JSON.parse(JSON.stringify({ ...record, rootfsOwner: undefined, stdio: undefined, pid: undefined, rootfsOverlay: undefined })),
    ).toEqual(envelope.record);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'containers', name), 'utf8'));
    expect(onDisk.version).toBe(CONTAINER_RECORD_VERSION);
    expect((await store.load()).records).toEqual(records);
  });
});
