/**
 * RunPodSandbox's two halves, driven with every host effect faked (QEMU, virtiofsd, the shared
 * dir's mount, the cgroup driver, the pod network, the guest agent) and the record store and work
 * dir real, in a temporary state dir:
 * - prepareSandbox changes nothing on disk, whether it succeeds or is refused at its last step;
 * - executeSandbox, failing at each of its steps in turn, undoes every earlier step, newest first,
 *   and leaves neither the record nor the work dir behind.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import type { CgroupDriver, PlacementRecord } from '../../../src/cgroups/index.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { resolveHandler } from '../../../src/config/handlers.js';
import type { KataConfig } from '../../../src/config/types.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { guestImageVerityDocument, type VirtiofsdProcess, type VmProcess } from '../../../src/hypervisor/index.js';
import type { CniPodNetworkRecord, JoinedPodNetworkRecord, PodNetworkRecord, PodNetworks } from '../../../src/network/index.js';
import type { CreateDeps, CreateRequest, SandboxLaunchers, StartSwtpmRequest } from '../../../src/runtime/sandbox/create-types.js';
import { executeSandbox } from '../../../src/runtime/sandbox/execute.js';
import { type LeaseOwner, VmmIdentities } from '../../../src/runtime/sandbox/identities.js';
import { PLANNED_MAC } from '../../../src/runtime/sandbox/network.js';
import { sandboxWorkDir } from '../../../src/runtime/sandbox/paths.js';
import { prepareSandbox } from '../../../src/runtime/sandbox/prepare.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import { decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { initTpmCa } from '../../../src/tpm/ca.js';
import { rejection } from '../../helpers/kata-error.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';

const ID = 'c3'.repeat(32);
const CNI_MAC = '0a:58:0a:f4:00:07';

/** The execute steps a failure can be injected at, in the order they run. */
const STEPS = [
  'write record',
  'VMM identity',
  'network setup',
  'shared dir',
  'virtiofsd',
  'jail',
  'cgroup placement',
  'QEMU',
  'guest ready',
  'agent connect',
  'CreatePod',
  'ConfigureNetwork',
  'final record',
] as const;
type Step = (typeof STEPS)[number];

/**
 * What a failure at each step must undo, in this order (the work dir, removed last of all, is
 * checked on disk). Placing QEMU makes its cgroup's undo end QEMU and virtiofsd before removing it.
 * A network of our own is torn down (TAP, CNI DEL, namespace); a joined one (the caller's
 * namespace, CNI done by the caller) is only unwired.
 */
function expectedUndo(networkUndo: string): Record<Step, string[]> {
  const AFTER_IDENTITY = ['release the VMM identity', 'delete record'];
  const AFTER_NETWORK = [networkUndo, ...AFTER_IDENTITY];
  const AFTER_SHARED_DIR = ['unmount the shared dir', ...AFTER_NETWORK];
  const AFTER_VIRTIOFSD = ['stop virtiofsd', ...AFTER_SHARED_DIR];
  const AFTER_JAIL = ['release the jail', ...AFTER_VIRTIOFSD];
  // Placed before QEMU runs: a start that fails after placing ends its own process (startVm leaves none).
  const AFTER_PLACEMENT = ['stop virtiofsd', 'remove cgroup', 'release the jail', ...AFTER_SHARED_DIR];
  const AFTER_QEMU = ['kill QEMU', ...AFTER_PLACEMENT];
  const AFTER_AGENT = ['close the agent client', ...AFTER_QEMU];
  return {
    'write record': [],
    'VMM identity': ['delete record'],
    // Registered before setup: what a half-made network recorded is torn down.
    'network setup': AFTER_NETWORK,
    // Registered before the mount: a half-made mount is released.
    'shared dir': AFTER_SHARED_DIR,
    virtiofsd: AFTER_SHARED_DIR,
    // Registered before the jail is built: a half-made one is released.
    jail: AFTER_JAIL,
    'cgroup placement': AFTER_JAIL,
    QEMU: AFTER_PLACEMENT,
    'guest ready': AFTER_QEMU,
    'agent connect': AFTER_QEMU,
    CreatePod: AFTER_AGENT,
    ConfigureNetwork: AFTER_AGENT,
    'final record': AFTER_AGENT,
  };
}
const EXPECTED_UNDO = { cni: expectedUndo('tear down the pod network'), joined: expectedUndo('unwire the joined network') };
/** The caller's namespace in the joined cases (containerd's name for one); never opened: the network layer is faked. */
const JOIN_NETNS = '/run/netns/cni-5f1b2c3d-0000-4000-8000-000000000001';
const JOINED_MAC = '0a:58:0a:f4:01:09';

interface World {
  deps: CreateDeps;
  req: CreateRequest;
  store: RecordStore<SandboxRecord>;
  workDir: string;
  /** The forward effects, in the order they were made. */
  done: string[];
  /** The undo effects, in the order they ran, each checked against the state it needs. */
  undone: string[];
  /** The record's phase in the store when QEMU was started. */
  phaseAtQemuStart: string | undefined;
  /** The namespace QEMU was started in. */
  qemuNetns: string | undefined;
  /** The pids placed in the pod's cgroup: QEMU's, then the others. */
  placed: number[] | undefined;
  /** What the guest agent was told to configure. */
  configured: unknown;
  /** What the jail was built for, and what QEMU was started in. */
  jail: { vmmDir: string; uid: number; tun: boolean } | undefined;
  qemuJail: unknown;
  /** The lease the identity step took (and whether it was released). */
  tapOwner: unknown;
  /** What swtpm was started with (a vtpm pod), and the record's phase then. */
  swtpm: StartSwtpmRequest | undefined;
}

/** A bzImage header, a gzip magic and an erofs superblock: enough for checkGuestAssets. */
async function fakeGuestAssets(dir: string): Promise<Pick<KataConfig['hypervisor'], 'kernelPath' | 'initrdPath' | 'guestImagePath'>> {
  const kernel = Buffer.alloc(0x300);
  kernel.write('HdrS', 0x202, 'latin1');
  const image = Buffer.alloc(2048);
  image.writeUInt32LE(0xe0f5e1e2, 1024);
  const paths = {
    kernelPath: path.join(dir, 'vmlinuz'),
    initrdPath: path.join(dir, 'initrd'),
    guestImagePath: path.join(dir, 'guest.img'),
  };
  await writeFile(paths.kernelPath, kernel);
  await writeFile(paths.initrdPath, Buffer.from([0x1f, 0x8b, 0, 0]));
  await writeFile(paths.guestImagePath, image);
  // Its dm-verity table (a TEE pod's command line carries it; build-guest.sh writes the real one).
  await writeFile(`${paths.guestImagePath}.verity.json`, JSON.stringify(guestImageVerityDocument(FAKE_VERITY)));
  return paths;
}
const FAKE_VERITY = { rootHash: '7e'.repeat(32), salt: 'e7'.repeat(32), dataBlocks: 1, hashStartBlock: 1 };

function requestFor(podConfig: Record<string, unknown>): RunPodSandboxRequest__Output {
  return decodeProtoJson<RunPodSandboxRequest__Output>('runtime.v1.RunPodSandboxRequest', {
    config: { metadata: { name: 'web', namespace: 'default', uid: 'uid-1', attempt: 0 }, hostname: 'web', ...podConfig },
  });
}

function networkRecordFor(id: string): CniPodNetworkRecord {
  const netnsName = `kata-ts-${id.slice(0, 16)}`;
  return {
    kind: 'cni',
    netnsName,
    netnsPath: `/run/netns/${netnsName}`,
    ifName: 'eth0',
    tapName: 'tap0_kata',
    cniNetwork: { cniVersion: '1.0.0', name: 'n', plugins: [{ type: 'bridge' }], file: '/etc/cni/net.d/10.conflist' },
    attachment: { containerId: id, netnsPath: `/run/netns/${netnsName}`, ifName: 'eth0', args: '', runtimeConfig: {} },
    cniAttached: false,
    cniResult: null,
    result: null,
    mac: null,
    mtu: null,
    tapWired: false,
  };
}

/** What PodNetworks.prepareJoin reads from a namespace with eth0 (as ip -j shows containerd's CNI left it). */
function joinedRecordFor(netnsPath: string): JoinedPodNetworkRecord {
  return {
    kind: 'joined',
    netnsName: netnsPath.slice('/run/netns/'.length),
    netnsPath,
    ifName: 'eth0',
    tapName: 'tap0_kata',
    result: {
      ips: [{ address: '10.244.1.9', prefixLength: 24, family: 4 }],
      routes: [{ destination: '0.0.0.0/0', gateway: '10.244.1.1' }],
      dns: { servers: [], searches: [], options: [] },
    },
    mac: JOINED_MAC,
    mtu: 1450,
    tapWired: false,
  };
}

async function world(
  stateDir: string,
  assetsDir: string,
  options: { failAt?: Step | 'swtpm'; hostCpus?: number; pod?: Record<string, unknown>; joinNetns?: string; cniMode?: boolean } = {},
) {
  const fail = (step: Step | 'swtpm') => {
    if (options.failAt === step) throw new Error(`injected: ${step} failed`);
  };
  const config: KataConfig = { ...defaultConfig(), stateDir };
  config.hypervisor = {
    ...config.hypervisor,
    ...(await fakeGuestAssets(assetsDir)),
    // A vtpm pod's firmware (any readable file: the fake QEMU never reads it) and swtpm's binaries.
    firmware: {
      ...config.hypervisor.firmware,
      ovmfCodePath: path.join(assetsDir, 'vmlinuz'),
      ovmfVarsPath: path.join(assetsDir, 'vmlinuz'),
    },
    tpm: { swtpmBinary: '/bin/sh', swtpmSetupBinary: '/bin/sh', caDir: path.join(stateDir, 'tpm-ca') },
    vmmIdentities: { firstId: 2_000_000_000, count: 4, leaseDir: path.join(stateDir, 'leases'), quarantineMs: 0 },
  };
  const env = await fixturePlanEnvironment({ cpus: options.hostCpus ?? 8, memoryMiB: 16_384 }, 'no-iommu', config);
  const logger = silentLogger();
  const realStore = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, logger);
  await realStore.init();
  const w = { done: [], undone: [], phaseAtQemuStart: undefined } as unknown as World;
  w.workDir = sandboxWorkDir(stateDir, ID);
  // Every undo must run while the work dir (removed last) is still there.
  const undid = (what: string) => w.undone.push(existsSync(w.workDir) ? what : `${what} (after the work dir went)`);

  let puts = 0;
  let runningPuts = 0;
  const store = {
    directory: realStore.directory,
    put: async (record: SandboxRecord) => {
      if (puts++ === 0) fail('write record');
      // Only the first: the rollback's own saves (the network's teardown) go through.
      if (record.phase === 'running' && runningPuts++ === 0) fail('final record');
      await realStore.put(record);
    },
    delete: async (id: string) => {
      undid('delete record');
      await realStore.delete(id);
    },
  } as unknown as RecordStore<SandboxRecord>;

  const network = {
    prepare: async (id: string) => networkRecordFor(id),
    prepareJoin: async (netnsPath: string) => joinedRecordFor(netnsPath),
    setup: async (net: PodNetworkRecord, persist: () => Promise<void>, _log: unknown, options: { tapOwner?: unknown }) => {
      w.tapOwner = options.tapOwner;
      if (net.kind === 'joined') {
        net.tapWired = true; // what the real one records before wiring the TAP
        await persist();
        fail('network setup');
        w.done.push('network setup');
        return;
      }
      net.cniAttached = true; // what the real one records before CNI ADD
      await persist();
      fail('network setup');
      w.done.push('network setup');
      net.result = {
        ips: [{ address: '10.244.0.7', prefixLength: 24, family: 4, gateway: '10.244.0.1' }],
        routes: [],
        dns: { servers: [], searches: [], options: [] },
      };
      Object.assign(net, { mac: CNI_MAC, mtu: 1500, tapWired: true });
      await persist();
    },
    teardown: async (net: PodNetworkRecord, persist: () => Promise<void>) => {
      undid('tear down the pod network');
      Object.assign(net, { cniAttached: false, tapWired: false });
      await persist();
    },
    detach: async (net: PodNetworkRecord, persist: () => Promise<void>) => {
      undid(net.kind === 'joined' ? 'unwire the joined network' : 'detach the pod network');
      net.tapWired = false;
      await persist();
    },
  } as unknown as PodNetworks;

  // Processes that end once: a second kill or stop finds them gone and does nothing, as the real ones.
  let qemuAlive = false;
  let virtiofsdAlive = false;
  let swtpmAlive = false;
  const vm = {
    pid: 4242,
    startTimeTicks: 7,
    kill: async () => {
      if (qemuAlive) undid('kill QEMU');
      qemuAlive = false;
      return { code: null, signal: 'SIGKILL' };
    },
    resume: async () => void w.done.push('resume'),
    waitForReady: async () => {
      fail('guest ready');
      w.done.push('guest ready');
      return { vcpus: 1, memoryKiB: 500_000 };
    },
  } as unknown as VmProcess;
  const virtiofsd: VirtiofsdProcess = {
    pid: 4241,
    startTimeTicks: 6,
    socketPath: '',
    pids: () => [4241, 4243],
    stop: async () => {
      if (virtiofsdAlive) undid('stop virtiofsd');
      virtiofsdAlive = false;
    },
  };
  const launchers: SandboxLaunchers = {
    swtpmJailSpec: async (o) => ({
      jailDir: o.jailDir,
      vmmDir: o.stateDir,
      files: [],
      dirs: [path.dirname(o.ctrlSocketPath)],
      devices: { kvm: false, tun: false, vhostNet: false, vfioGroups: [], vfioFunctions: [], devRoot: '/dev' },
    }),
    startSwtpm: async (o) => {
      fail('swtpm');
      w.swtpm = o;
      w.done.push('swtpm');
      swtpmAlive = true;
      return {
        pid: 4250,
        startTimeTicks: 9,
        ctrlSocketPath: o.ctrlSocketPath,
        ekCertPem: '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n',
        pids: () => [4250],
        stop: async () => {
          if (swtpmAlive) undid('stop swtpm');
          swtpmAlive = false;
        },
      };
    },
    prepareSharedDir: async (dir) => {
      await mkdir(dir);
      fail('shared dir');
      w.done.push('shared dir');
    },
    releaseSharedMounts: async () => void undid('unmount the shared dir'),
    startVirtiofsd: async (o) => {
      fail('virtiofsd');
      // The real one resolves once its socket listens; the runtime hands it to a confined QEMU's uid
      // (a socket, checked: never a link). Unref'd: the state dir's removal takes it along.
      const listener = net.createServer();
      await new Promise<void>((resolve) => listener.listen(o.socketPath, resolve));
      listener.unref();
      virtiofsdAlive = true;
      w.done.push('virtiofsd');
      return virtiofsd;
    },
    buildJail: async (spec, identity) => {
      fail('jail');
      w.done.push('jail');
      w.jail = { vmmDir: spec.vmmDir, uid: identity.uid, tun: spec.devices.tun };
      return undefined as never;
    },
    releaseJail: async () => void undid('release the jail'),
    startVm: async (o) => {
      w.phaseAtQemuStart = (await realStore.load()).records.find((r) => r.id === ID)?.phase;
      w.qemuNetns = o.netnsPath;
      w.qemuJail = o.jail;
      // The plan QEMU is started with carries the CNI (or joined) interface's MAC, not the placeholder.
      if (!o.argv.join(' ').includes(options.joinNetns === undefined ? CNI_MAC : JOINED_MAC)) {
        throw new Error('QEMU started with the placeholder MAC');
      }
      // As the real one: spawned, placed before it runs, then QMP; a failure ends the process itself.
      qemuAlive = true;
      try {
        await o.place?.(vm.pid);
        fail('QEMU');
      } catch (err) {
        qemuAlive = false;
        throw err;
      }
      w.done.push('QEMU');
      return vm;
    },
  };
  const cgroups = {
    name: 'cgroupfs',
    validateParent: () => {},
    place: async (req: { pid: number; extraPids?: number[]; limits: PlacementRecord['limits'] }) => {
      fail('cgroup placement');
      w.placed = [req.pid, ...(req.extraPids ?? [])];
      w.done.push('cgroup placement');
      return { driver: 'cgroupfs', cgroupParent: '', mode: 'v1', paths: {}, limits: req.limits };
    },
    // The kernel refuses to remove a cgroup that still holds a process.
    remove: async () => undid(qemuAlive || virtiofsdAlive || swtpmAlive ? 'remove cgroup (processes still in it)' : 'remove cgroup'),
    describe: () => ({}),
  } as unknown as CgroupDriver;
  const agent = {
    close: () => undid('close the agent client'),
    createPod: async () => {
      fail('CreatePod');
      w.done.push('CreatePod');
      return { pausePid: 12, shmPath: '/run/kata-ts/shm', sharedDir: '/run/kata-ts/shared', sharedDirMounted: true };
    },
    configureNetwork: async (req: unknown) => {
      w.configured = req;
      fail('ConfigureNetwork');
      w.done.push('ConfigureNetwork');
      return {};
    },
  } as unknown as AgentClient;

  // An empty proc root: other VMs on this machine run as numbers of the default range.
  const emptyProc = path.join(config.stateDir, 'empty-proc');
  mkdirSync(emptyProc, { recursive: true });
  const realIdentities = new VmmIdentities(config.hypervisor.vmmIdentities, logger, { procRoot: emptyProc });
  const identities = {
    leaseFile: (id: number) => realIdentities.leaseFile(id),
    acquire: async (owner: LeaseOwner) => {
      fail('VMM identity');
      w.done.push('VMM identity');
      return realIdentities.acquire(owner);
    },
    release: async (id: number, owner: LeaseOwner) => {
      undid('release the VMM identity');
      await realIdentities.release(id, owner);
    },
  } as unknown as VmmIdentities;

  w.store = realStore;
  w.deps = {
    identities,
    config,
    facts: {
      configPath: null,
      acceleration: env.accel,
      cgroupDriver: { name: 'cgroupfs', source: 'config' },
      qemu: { ok: true, message: '' },
      guestAssets: { ok: true, message: '' },
    },
    store,
    cgroups,
    host: env.host,
    readPcieFacts: async () => env.pcieFacts,
    // A joined namespace needs no network mode: the shim runs with none configured.
    ...(options.cniMode === false ? {} : { network }),
    launchers,
    connectAgent: async () => {
      fail('agent connect');
      w.done.push('agent connect');
      return agent;
    },
  };
  const request = requestFor(options.pod ?? {});
  w.req = {
    id: ID,
    spec: decodeSandboxSpec(request.config),
    runtimeHandler: '',
    handler: resolveHandler(config, ''),
    logger,
    signal: new AbortController().signal,
    readyTimeoutMs: 60_000,
    ...(options.joinNetns === undefined ? {} : { joinNetns: options.joinNetns }),
  };
  return w;
}

/** Every path under `dir` with its type, mode, size and mtime: a file made and removed again shows as a changed mtime. */
async function snapshot(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (at: string): Promise<void> => {
    const st = await stat(at);
    out.push(`${path.relative(dir, at) || '.'} ${st.mode.toString(8)} ${st.size} ${st.mtimeMs}`);
    if (st.isDirectory()) for (const name of (await readdir(at)).sort()) await walk(path.join(at, name));
  };
  await walk(dir);
  return out;
}

/** A fresh state dir and guest-assets dir per test, removed after it. */
function tempDirs(): { stateDir: string; assetsDir: string } {
  const dirs = { stateDir: '', assetsDir: '' };
  beforeEach(async () => {
    dirs.stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-sbx-state-'));
    dirs.assetsDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-sbx-assets-'));
  });
  afterEach(async () => {
    await rm(dirs.stateDir, { recursive: true, force: true });
    await rm(dirs.assetsDir, { recursive: true, force: true });
  });
  return dirs;
}

describe('prepareSandbox', () => {
  const dirs = tempDirs();

  it('plans the sandbox (network validated, placeholder MAC, record in phase creating) and changes nothing on disk', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    const before = await snapshot(dirs.stateDir);
    const prep = await prepareSandbox(w.deps, w.req);
    expect(await snapshot(dirs.stateDir)).toEqual(before);
    expect(w.done).toEqual([]);
    expect(prep.record.phase).toBe('creating');
    expect(prep.record.vmm).toBeNull();
    expect(prep.record.network).toMatchObject({ kind: 'cni', cniAttached: false });
    expect(prep.record.plan.qemu.argv.join(' ')).toContain(PLANNED_MAC);
    expect(prep.layout.workDir).toBe(w.workDir);
    expect(prep.layout.withAgent).toBe(true);
  });

  it("joining a caller's namespace: validated and read, planned with its interface's MAC at once, nothing made", async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir, { joinNetns: JOIN_NETNS });
    const before = await snapshot(dirs.stateDir);
    const prep = await prepareSandbox(w.deps, w.req);
    expect(await snapshot(dirs.stateDir)).toEqual(before);
    expect(w.done).toEqual([]);
    expect(prep.record.network).toMatchObject({ kind: 'joined', netnsPath: JOIN_NETNS, tapWired: false, mac: JOINED_MAC });
    expect(prep.record.plan.qemu.argv.join(' ')).toContain(JOINED_MAC);
    expect(prep.record.plan.qemu.argv.join(' ')).not.toContain(PLANNED_MAC);
  });

  it('joining without a network mode configured: the real check refuses a path that is not there, or not a namespace, naming it', async () => {
    // deps.network absent (network.mode "none", the shim): the join is checked by the real network layer.
    const missing = path.join(dirs.stateDir, 'no-such-netns');
    const notNetns = path.join(dirs.assetsDir, 'vmlinuz');
    for (const [joinNetns, kind, reason] of [
      [missing, 'precondition', 'JOIN_NETNS_MISSING'],
      [notNetns, 'precondition', 'JOIN_NETNS_NOT_NETNS'],
      ['run/netns/relative', 'invalid', 'JOIN_NETNS_INVALID'],
    ] as const) {
      const w = await world(dirs.stateDir, dirs.assetsDir, { joinNetns, cniMode: false });
      const before = await snapshot(dirs.stateDir);
      const refusal = await prepareSandbox(w.deps, w.req).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(refusal).toMatchObject({ kind, reason, details: { field: 'joinNetns', joinNetns } });
      expect((refusal as Error).message).toContain(joinNetns);
      expect(await snapshot(dirs.stateDir)).toEqual(before);
    }
  });

  it('refused at its last step (planning), after every fact was gathered, it changes nothing on disk either', async () => {
    const pod = { linux: { resources: { cpuQuota: 800_000, cpuPeriod: 100_000 } } };
    const w = await world(dirs.stateDir, dirs.assetsDir, { hostCpus: 2, pod });
    const before = await snapshot(dirs.stateDir);
    const refusal = await prepareSandbox(w.deps, w.req).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(refusal).toBeInstanceOf(KataError);
    expect((refusal as KataError).reason).toBe('SIZING_VCPUS_EXCEED_HOST');
    expect(await snapshot(dirs.stateDir)).toEqual(before);
    expect(w.done).toEqual([]);
  });
});

describe('executeSandbox', () => {
  const dirs = tempDirs();

  it('without a failure: every step in order, the record written as creating before QEMU and running at the end, nothing undone', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    const { record, vm, agent } = await executeSandbox(w.deps, await prepareSandbox(w.deps, w.req));
    expect(w.done).toEqual(
      STEPS.filter((s) => s !== 'write record' && s !== 'final record').flatMap((s) => (s === 'guest ready' ? ['resume', s] : [s])),
    );
    expect(w.undone).toEqual([]);
    expect(w.phaseAtQemuStart).toBe('creating');
    expect(vm.pid).toBe(4242);
    // QEMU, virtiofsd and virtiofsd's sandbox child (the one serving the guest) share the pod's cgroup.
    expect(w.placed).toEqual([4242, 4241, 4243]);
    expect(agent).toBeDefined();
    expect(record.plan.qemu.argv.join(' ')).toContain(CNI_MAC);
    const stored = (await w.store.load()).records;
    expect(stored.map((r) => [r.id, r.phase, r.state, r.vmm?.pid, r.virtiofsd?.pid, r.guestPod?.pausePid])).toEqual([
      [ID, 'running', 'SANDBOX_READY', 4242, 4241, 12],
    ]);
    expect(existsSync(w.workDir)).toBe(true);
    // Confined (the default handler): the first identity of the range, leased for this record,
    // its VMM dir, the TAP and the jail made for it, QEMU started in the jail as it.
    const identity = { uid: 2_000_000_000, gid: 2_000_000_000 };
    const leaseFile = path.join(dirs.stateDir, 'leases', '2000000000');
    expect(record.confinement).toEqual({
      seccomp: 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
      identity: { ...identity, lease: leaseFile },
      jailDir: path.join(w.workDir, 'jail'),
      vmmDir: path.join(w.workDir, 'vmm'),
      optOutReason: null,
    });
    expect(JSON.parse(await readFile(leaseFile, 'utf8'))).toEqual({ sandboxId: ID, record: path.join(w.store.directory, `${ID}.json`) });
    const vmmDir = await stat(path.join(w.workDir, 'vmm'));
    expect([vmmDir.uid, vmmDir.gid, vmmDir.mode & 0o777]).toEqual([identity.uid, identity.gid, 0o700]);
    expect(w.tapOwner).toEqual(identity);
    expect(w.jail).toEqual({ vmmDir: path.join(w.workDir, 'vmm'), uid: identity.uid, tun: true });
    expect(w.qemuJail).toEqual({ jailDir: path.join(w.workDir, 'jail'), identity });
    expect(record.plan.qemu.argv).toContain('-sandbox');
    expect(record.vmm?.qmpSocket).toBe(path.join(w.workDir, 'vmm', 'qmp.sock'));
  });

  it('a handler that opts out with a reason: QEMU as root, no identity, no jail, no seccomp, the reason recorded', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    w.deps.config.handlers['kata-ts'] = {
      ...w.deps.config.handlers['kata-ts']!,
      vmmConfinement: { seccomp: false, unprivileged: false, optOutReason: 'debugging QEMU with gdb' },
    };
    w.req.handler = resolveHandler(w.deps.config, '');
    const { record } = await executeSandbox(w.deps, await prepareSandbox(w.deps, w.req));
    expect(w.done).not.toContain('VMM identity');
    expect(w.done).not.toContain('jail');
    expect(w.qemuJail).toBeUndefined();
    expect(w.tapOwner).toBeUndefined();
    expect(record.confinement).toEqual({
      seccomp: null,
      identity: null,
      jailDir: null,
      vmmDir: null,
      optOutReason: 'debugging QEMU with gdb',
    });
    expect(record.plan.vmm).toEqual({ seccomp: null, unprivileged: false, identityRange: null, optOutReason: 'debugging QEMU with gdb' });
    expect(record.plan.qemu.argv).not.toContain('-sandbox');
    expect(record.vmm?.qmpSocket).toBe(path.join(w.workDir, 'qmp.sock'));
    expect(existsSync(path.join(dirs.stateDir, 'leases'))).toBe(false);
  });

  it('a vtpm pod without the node EK CA is refused at prepare, nothing made', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    w.deps.config.hypervisor.tpm.caDir = path.join(dirs.stateDir, 'no-ca');
    w.req.handler = resolveHandler(w.deps.config, 'kata-ts-cvm');
    const before = await snapshot(dirs.stateDir);
    const err = await rejection(prepareSandbox(w.deps, w.req));
    expect(err.reason).toBe('TPM_CA_MISSING');
    expect(await snapshot(dirs.stateDir)).toEqual(before);
  });

  it('a vtpm pod whose guest image has no dm-verity metadata is refused at prepare naming the image, nothing made', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    await initTpmCa(w.deps.config.hypervisor.tpm.caDir);
    w.req.handler = resolveHandler(w.deps.config, 'kata-ts-cvm');
    const metadata = `${w.deps.config.hypervisor.guestImagePath}.verity.json`;
    const saved = await readFile(metadata);
    await rm(metadata);
    try {
      const before = await snapshot(dirs.stateDir);
      const err = await rejection(prepareSandbox(w.deps, w.req));
      expect(err.reason).toBe('GUEST_IMAGE_UNVERIFIED');
      expect(err.details?.field).toBe('hypervisor.guestImagePath');
      expect(await snapshot(dirs.stateDir)).toEqual(before);
      // The default handler does not care.
      w.req.handler = resolveHandler(w.deps.config, 'kata-ts');
      const plain = await prepareSandbox(w.deps, w.req);
      expect(plain.record.plan.qemu.argv.join(' ')).not.toContain('kata_ts.verity');
    } finally {
      await writeFile(metadata, saved);
    }
  });

  it('a vtpm pod (kata-ts-cvm): OVMF vars copied for QEMU, swtpm before QEMU as an identity of its own, placed beside it, recorded', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    await initTpmCa(w.deps.config.hypervisor.tpm.caDir);
    w.req.handler = resolveHandler(w.deps.config, 'kata-ts-cvm');
    const { record } = await executeSandbox(w.deps, await prepareSandbox(w.deps, w.req));
    expect(record.plan.tee).toMatchObject({ setting: 'auto', kind: 'vtpm', reason: 'no SNP or TDX on this host', launchProblem: null });
    // After virtiofsd, with an identity of its own, before the jail and QEMU; placed with QEMU.
    const from = w.done.indexOf('virtiofsd');
    expect(w.done.slice(from, from + 7)).toEqual(['virtiofsd', 'VMM identity', 'jail', 'swtpm', 'jail', 'cgroup placement', 'QEMU']);
    expect(w.placed).toEqual([4242, 4241, 4243, 4250]);
    const qemu = { uid: 2_000_000_000, gid: 2_000_000_000 };
    const own = { uid: 2_000_000_001, gid: 2_000_000_001 };
    expect(w.swtpm).toMatchObject({
      stateDir: path.join(w.workDir, 'tpm'),
      ctrlSocketPath: path.join(w.workDir, 'tpm-sock', 'ctrl.sock'),
      identity: own,
      jail: { jailDir: path.join(w.workDir, 'tpm-jail') },
      clientIdentity: qemu,
      caDir: path.join(dirs.stateDir, 'tpm-ca'),
    });
    expect(record.tpm).toEqual({
      pid: 4250,
      startTimeTicks: 9,
      ctrlSocketPath: path.join(w.workDir, 'tpm-sock', 'ctrl.sock'),
      stateDir: path.join(w.workDir, 'tpm'),
      logFile: path.join(w.workDir, 'swtpm.log'),
      identity: { ...own, lease: path.join(dirs.stateDir, 'leases', '2000000001') },
      ekCertPem: expect.stringMatching(/^-----BEGIN CERTIFICATE-----/),
    });
    const vars = await stat(path.join(w.workDir, 'vmm', 'OVMF_VARS.fd'));
    expect([vars.uid, vars.gid, vars.mode & 0o777]).toEqual([qemu.uid, qemu.gid, 0o600]);
    const sockDir = await stat(path.join(w.workDir, 'tpm-sock'));
    expect([sockDir.uid, sockDir.gid, sockDir.mode & 0o777]).toEqual([own.uid, qemu.gid, 0o750]);
    const state = await stat(path.join(w.workDir, 'tpm'));
    expect([state.uid, state.mode & 0o777]).toEqual([own.uid, 0o700]);
    const argv = record.plan.qemu.argv;
    expect(argv).toContain(`if=pflash,format=raw,unit=1,file=${path.join(w.workDir, 'vmm', 'OVMF_VARS.fd')}`);
    // The guest image's root hash is on the measured command line.
    expect(argv[argv.indexOf('-append') + 1]?.split(' ')).toContain(`kata_ts.verity=${'7e'.repeat(32)},${'e7'.repeat(32)},1,1`);
    expect(argv).toContain(`socket,id=chrtpm,path=${path.join(w.workDir, 'tpm-sock', 'ctrl.sock')}`);
  });

  it.each([['swtpm'], ['QEMU']] as const)(
    'a vtpm pod failing at "%s": swtpm stopped, both identities released, nothing left',
    async (step) => {
      const w = await world(dirs.stateDir, dirs.assetsDir, { failAt: step });
      await initTpmCa(w.deps.config.hypervisor.tpm.caDir);
      w.req.handler = resolveHandler(w.deps.config, 'kata-ts-cvm');
      await expect(executeSandbox(w.deps, await prepareSandbox(w.deps, w.req))).rejects.toThrow(`injected: ${step} failed`);
      const released = w.undone.filter((u) => u === 'release the VMM identity').length;
      expect(released).toBe(step === 'swtpm' ? 2 : 2);
      if (step === 'QEMU') expect(w.undone.slice(0, 3)).toEqual(['stop virtiofsd', 'stop swtpm', 'remove cgroup']);
      expect(w.undone).not.toContain('remove cgroup (processes still in it)');
      expect(existsSync(w.workDir)).toBe(false);
      const leaseDir = path.join(dirs.stateDir, 'leases');
      for (const name of await readdir(leaseDir).catch(() => [] as string[])) {
        expect(JSON.parse(await readFile(path.join(leaseDir, name), 'utf8'))).toEqual({ releasedAtMs: expect.any(Number) });
      }
    },
  );

  it.each(STEPS.map((step) => [step]))('a failure at "%s" undoes every earlier step, newest first', async (step) => {
    const w = await world(dirs.stateDir, dirs.assetsDir, { failAt: step });
    const prep = await prepareSandbox(w.deps, w.req);
    await expect(executeSandbox(w.deps, prep)).rejects.toThrow(`injected: ${step} failed`);
    expect(w.undone).toEqual(EXPECTED_UNDO.cni[step]);
    expect(existsSync(w.workDir)).toBe(false);
    expect((await w.store.load()).records).toEqual([]);
    // The identity went back with everything else: no lease holds it, at most a release mark.
    const leaseDir = path.join(dirs.stateDir, 'leases');
    for (const name of await readdir(leaseDir).catch(() => [] as string[])) {
      expect(JSON.parse(await readFile(path.join(leaseDir, name), 'utf8'))).toEqual({ releasedAtMs: expect.any(Number) });
    }
  });

  it("joining a caller's namespace: QEMU runs in it with its interface's MAC, the guest is told what eth0 held", async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir, { joinNetns: JOIN_NETNS });
    const { record } = await executeSandbox(w.deps, await prepareSandbox(w.deps, w.req));
    expect(w.undone).toEqual([]);
    expect(w.qemuNetns).toBe(JOIN_NETNS);
    expect(record.network).toMatchObject({ kind: 'joined', netnsPath: JOIN_NETNS, tapWired: true });
    expect(record.plan.qemu.argv.join(' ')).toContain(JOINED_MAC);
    expect(w.configured).toMatchObject({
      interfaces: [{ mac: JOINED_MAC, mtu: 1450, addresses: ['10.244.1.9/24'] }],
      routes: [{ destination: '0.0.0.0/0', gateway: '10.244.1.1' }],
    });
    const [stored] = (await w.store.load()).records;
    expect(stored?.network).toEqual(record.network);
  });

  it.each(STEPS.map((step) => [step]))(
    'joining a caller\'s namespace, a failure at "%s" undoes every earlier step, the network only unwired',
    async (step) => {
      const w = await world(dirs.stateDir, dirs.assetsDir, { failAt: step, joinNetns: JOIN_NETNS });
      const prep = await prepareSandbox(w.deps, w.req);
      await expect(executeSandbox(w.deps, prep)).rejects.toThrow(`injected: ${step} failed`);
      expect(w.undone).toEqual(EXPECTED_UNDO.joined[step]);
      expect(existsSync(w.workDir)).toBe(false);
      expect((await w.store.load()).records).toEqual([]);
    },
  );

  it('a work dir that exists already is refused and left alone, and nothing else is made', async () => {
    const w = await world(dirs.stateDir, dirs.assetsDir);
    await mkdir(w.workDir, { recursive: true });
    await writeFile(path.join(w.workDir, 'theirs'), 'x');
    const prep = await prepareSandbox(w.deps, w.req);
    await expect(executeSandbox(w.deps, prep)).rejects.toMatchObject({ reason: 'SANDBOX_WORKDIR_EXISTS' });
    expect(await readdir(w.workDir)).toEqual(['theirs']);
    expect(w.done).toEqual([]);
    expect(w.undone).toEqual([]);
    expect((await w.store.load()).records).toEqual([]);
  });
});
