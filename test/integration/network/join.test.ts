/**
 * Joining a network namespace the caller made and attached (SandboxRunOptions.joinNetns, the shim
 * face's case: containerd ran CNI), with real iproute2 in namespaces this test creates
 * (test/helpers/join-netns.ts: a "pod" namespace whose eth0 has an IPv4 address, a MAC, an MTU and a
 * default route via a veth peer in a "node" namespace). Without a VM: the namespace is read into the
 * CNI result shape, refused when it is missing, not a namespace or without eth0 (nothing changed),
 * and the TAP + tc mirred wiring is made and undone by name and by a path outside /run/netns, the
 * namespace, eth0, its address and route left as they were. With one VM (real QEMU, TCG), through
 * SandboxManager.run with a caller's id and no CNI configured: the guest answers on the pod's
 * address from the node namespace, also to an address off the pod's subnet (its default route);
 * Stop and Remove undo the TAP only.
 */
import { execFileSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCgroupDriver } from '../../../src/cgroups/index.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import type { KataConfig } from '../../../src/config/types.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { chooseAcceleration } from '../../../src/hypervisor/accel.js';
import { type JoinedPodNetworkRecord, PodNetworks, readJoinedNetwork } from '../../../src/network/index.js';
import { readPcieHostFacts } from '../../../src/pcie/plan.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import { releaseSharedMounts } from '../../../src/runtime/sandbox/shared-dir.js';
import { decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { ensureGuestAssets, processesMentioning } from '../../helpers/hypervisor-guest.js';
import { createJoinNamespaces, type JoinNamespaces } from '../../helpers/join-netns.js';
import { removeCgroupTree } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const TAP = 'tap0_kata';

/** What is in the pod namespace that the wiring touches, and what must survive it. */
async function podState(ns: JoinNamespaces) {
  const links = JSON.parse(await ns.exec('pod', ['ip', '-j', 'link', 'show'])) as Array<{ ifname: string; mtu: number; flags: string[] }>;
  const addrs = JSON.parse(await ns.exec('pod', ['ip', '-j', 'addr', 'show', 'dev', 'eth0'])) as Array<{
    address: string;
    addr_info: Array<{ local: string; scope: string }>;
  }>;
  return {
    links: links.map((l) => l.ifname).sort(),
    tap: links.find((l) => l.ifname === TAP),
    eth0Mac: addrs[0]?.address,
    eth0Global: addrs[0]?.addr_info.filter((a) => a.scope === 'global').map((a) => a.local),
    routes: (JSON.parse(await ns.exec('pod', ['ip', '-j', 'route', 'show'])) as Array<{ dst: string; gateway?: string }>).map(
      (r) => `${r.dst}${r.gateway === undefined ? '' : ` via ${r.gateway}`}`,
    ),
    qdiscs: await ns.exec('pod', ['tc', 'qdisc', 'show', 'dev', 'eth0']),
    eth0Filters: await ns.exec('pod', ['tc', 'filter', 'show', 'dev', 'eth0', 'ingress']).catch((e: Error) => e.message),
    tapFilters: await ns.exec('pod', ['tc', 'filter', 'show', 'dev', TAP, 'ingress']).catch(() => ''),
  };
}

async function refusal(p: Promise<unknown>): Promise<KataError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(KataError);
  return err as KataError;
}

describe("joining a caller's network namespace (real iproute2, no VM)", () => {
  let ns: JoinNamespaces;
  let scratch: string;
  const networks = new PodNetworks(defaultConfig().network);
  const log = silentLogger();

  beforeAll(async () => {
    ns = await createJoinNamespaces();
    scratch = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-join-'));
  });
  afterAll(async () => {
    await ns?.cleanup();
    if (scratch !== undefined) await fsp.rm(scratch, { recursive: true, force: true });
  });

  it('reads eth0 into the CNI result shape, by name for /run/netns and /var/run/netns', async () => {
    const net = await readJoinedNetwork(ns.podPath);
    expect(net).toEqual({
      kind: 'joined',
      netnsName: ns.pod,
      netnsPath: ns.podPath,
      ifName: 'eth0',
      tapName: TAP,
      result: {
        ips: [{ address: ns.podIp, prefixLength: 24, family: 4 }],
        routes: [{ destination: '0.0.0.0/0', gateway: ns.gateway }],
        dns: { servers: [], searches: [], options: [] },
      },
      mac: ns.mac,
      mtu: ns.mtu,
      tapWired: false,
    });
    const viaVarRun = await readJoinedNetwork(`/var/run/netns/${ns.pod}`);
    expect([viaVarRun.netnsName, viaVarRun.netnsPath]).toEqual([ns.pod, `/var/run/netns/${ns.pod}`]);
    expect(viaVarRun.result).toEqual(net.result);
  });

  it('refuses, naming the path, what is missing, not a namespace, not a network one, or without eth0 or an address', async () => {
    const before = await podState(ns);
    const file = path.join(scratch, 'not-a-netns');
    await fsp.writeFile(file, '');
    const pid = await ns.holdByPid();
    const bare = `${ns.node}-bare`;
    await fsp.access(`/run/netns/${bare}`).then(
      () => {
        throw new Error(`${bare} exists already`);
      },
      () => undefined,
    );
    // A namespace whose eth0 has no address (a veth whose peer stays there too), made next to the node and removed here.
    execFileSync('ip', ['netns', 'add', bare]);
    try {
      execFileSync('ip', ['-n', bare, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0-peer']);
      for (const [p, kind, reason] of [
        [`/run/netns/${ns.pod}-missing`, 'precondition', 'JOIN_NETNS_MISSING'],
        [file, 'precondition', 'JOIN_NETNS_NOT_NETNS'],
        [`/proc/${pid}/ns/mnt`, 'precondition', 'JOIN_NETNS_NOT_NETNS'],
        [ns.nodePath, 'precondition', 'JOIN_NETNS_NO_INTERFACE'],
        [`/run/netns/${bare}`, 'precondition', 'JOIN_NETNS_NO_ADDRESS'],
        [`run/netns/${ns.pod}`, 'invalid', 'JOIN_NETNS_INVALID'],
      ] as const) {
        const err = await refusal(readJoinedNetwork(p));
        expect([p, err.kind, err.reason, err.details]).toEqual([p, kind, reason, { field: 'joinNetns', joinNetns: p }]);
        expect(err.message).toContain(p);
      }
    } finally {
      execFileSync('ip', ['netns', 'del', bare]);
    }
    expect(await podState(ns)).toEqual(before);
  });

  it('wires the TAP with mirred both ways, and unwiring (teardown) removes only that: the namespace, eth0, its address and route stay', async () => {
    const before = await podState(ns);
    expect(before.links).toEqual(['eth0', 'lo']);
    const net = await readJoinedNetwork(ns.podPath);
    let persisted = 0;
    const persist = async () => void persisted++;
    await networks.setup(net, persist, log);
    expect(net.tapWired).toBe(true);
    expect(persisted).toBeGreaterThan(0);
    const wired = await podState(ns);
    expect(wired.links).toEqual(['eth0', 'lo', TAP]);
    expect(wired.tap?.mtu).toBe(ns.mtu);
    expect(wired.tap?.flags).toContain('UP');
    expect(wired.qdiscs).toContain('ingress');
    expect(wired.eth0Filters).toMatch(new RegExp(`mirred \\(Egress Redirect to device ${TAP}\\)`));
    expect(wired.tapFilters).toMatch(/mirred \(Egress Redirect to device eth0\)/);

    await networks.teardown(net, persist, log);
    expect(net.tapWired).toBe(false);
    expect(await podState(ns)).toEqual(before);
    await fsp.access(ns.podPath);
    // Idempotent: nothing recorded as wired, nothing done.
    await networks.teardown(net, persist, log);
    expect(await podState(ns)).toEqual(before);
  });

  it('a namespace outside /run/netns (/proc/<pid>/ns/net) is read, wired and unwired through nsenter', async () => {
    const before = await podState(ns);
    const pid = await ns.holdByPid();
    const net: JoinedPodNetworkRecord = await readJoinedNetwork(`/proc/${pid}/ns/net`);
    expect([net.netnsName, net.mac, net.result?.ips.map((ip) => ip.address)]).toEqual([null, ns.mac, [ns.podIp]]);
    await networks.setup(net, async () => {}, log);
    const wired = await podState(ns);
    expect(wired.links).toEqual(['eth0', 'lo', TAP]);
    expect(wired.eth0Filters).toContain(`Redirect to device ${TAP}`);
    await networks.teardown(net, async () => {}, log);
    expect(await podState(ns)).toEqual(before);
  });
});

describe('a pod VM joins the namespace through SandboxManager.run (real QEMU, no CNI configured)', () => {
  let ns: JoinNamespaces;
  let dir: string;
  let manager: SandboxManager;
  const cgroupRoot = `kata-ts-test-join-${process.pid}`;
  const sandboxId = `kts-join-pod-${process.pid}`;
  const ctx = (method: string): RequestContext => ({
    method,
    logger: silentLogger(),
    signal: new AbortController().signal,
    deadlineMs: undefined,
    annotate: () => {},
  });

  beforeAll(async () => {
    const guest = await ensureGuestAssets();
    ns = await createJoinNamespaces();
    // Short: the VM's sockets live under it (sun_path holds 107 bytes).
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ktsj-'));
    const logger = silentLogger();
    const base = defaultConfig();
    const config: KataConfig = {
      ...base,
      stateDir: path.join(dir, 'state'),
      cgroupDriver: 'cgroupfs',
      network: { ...base.network, mode: 'none' },
      hypervisor: { ...base.hypervisor, ...guest, guestImagePath: path.join(path.dirname(guest.kernelPath), 'guest.img') },
    };
    const cgroups = createCgroupDriver('cgroupfs', { cgroupRoot: config.cgroupRoot, dbusAddress: null, logger });
    manager = new SandboxManager({
      config,
      facts: {
        configPath: null,
        acceleration: chooseAcceleration(config.hypervisor.acceleration),
        cgroupDriver: { name: 'cgroupfs', source: 'config' },
        qemu: { ok: true, message: '' },
        guestAssets: { ok: true, message: '' },
      },
      logger,
      metrics: new RuntimeMetrics(),
      cgroups,
      store: new RecordStore<SandboxRecord>(config.stateDir, SANDBOX_RECORD_KIND, logger),
      host: { cpus: Math.max(1, os.cpus().length), memoryMiB: Math.floor(os.totalmem() / (1024 * 1024)) },
      readPcieFacts: () => readPcieHostFacts(config.pcie),
      cgroupDriverNamed: () => cgroups,
      listener: { sandboxStopping: async () => {}, sandboxStopped: async () => {}, sandboxRemoving: async () => {} },
    });
    await manager.recover();
  }, scaledMs(300_000));

  afterAll(async () => {
    manager?.close();
    if (dir !== undefined) {
      for (const pid of processesMentioning(dir)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
    }
    await removeCgroupTree(cgroupRoot, 'kata-ts-test-');
    if (dir !== undefined) {
      await releaseSharedMounts(dir, silentLogger());
      await fsp.rm(dir, { recursive: true, force: true });
    }
    await ns?.cleanup();
  }, scaledMs(120_000));

  it(
    'the guest answers on the pod address, also off its subnet; Stop and Remove unwire the TAP and leave the namespace',
    async () => {
      const before = await podState(ns);
      const uid = `uid-${process.pid}`;
      const request = decodeProtoJson<RunPodSandboxRequest__Output>('runtime.v1.RunPodSandboxRequest', {
        config: {
          metadata: { name: 'joined', namespace: 'kata-ts-test', uid, attempt: 0 },
          hostname: 'joined',
          log_directory: `/var/log/pods/kata-ts-test_joined_${uid}`,
          linux: { cgroup_parent: `/${cgroupRoot}/pod${uid}` },
        },
      });
      const spec = decodeSandboxSpec(request.config);
      const id = await manager.run(spec, '', ctx('RunPodSandbox'), { id: sandboxId, joinNetns: ns.podPath });
      expect(id).toBe(sandboxId);
      const live = manager.resolve(id);
      expect(live.record.network).toMatchObject({ kind: 'joined', netnsPath: ns.podPath, tapWired: true, mac: ns.mac });
      expect(live.record.state).toBe('SANDBOX_READY');
      // QEMU runs in the caller's namespace.
      const [vmNs, podNs] = await Promise.all([fsp.stat(`/proc/${live.vm!.pid}/ns/net`), fsp.stat(ns.podPath)]);
      expect(vmNs.ino).toBe(podNs.ino);
      expect((await podState(ns)).links).toEqual(['eth0', 'lo', TAP]);
      // A reset from the pod address: the guest has it (the pod namespace's own stack gets no
      // frame: eth0's ingress all goes to the TAP). From off the subnet: the guest's default route.
      expect(await ns.probe(ns.gateway)).toBe('refused');
      expect(await ns.probe(ns.offSubnet)).toBe('refused');

      await manager.stop(id, ctx('StopPodSandbox'));
      const stopped = await podState(ns);
      expect(stopped).toEqual(before);
      // The pod namespace's own stack answers again (it has the address): the redirect is gone.
      expect(await ns.probe(ns.gateway)).toBe('refused');
      await manager.remove(id, ctx('RemovePodSandbox'));
      expect(manager.find(id)).toBeUndefined();
      await fsp.access(ns.podPath);
      expect(await podState(ns)).toEqual(before);
    },
    scaledMs(240_000),
  );
});
