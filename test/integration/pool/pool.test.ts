import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectQmp, isSameLiveProcess } from '../../../src/hypervisor/index.js';
import { netnsNameFor } from '../../../src/network/index.js';
import { POOL_NIC_PORT_ID } from '../../../src/runtime/pool/plan.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createNetworkNode, type NetworkNode } from '../../helpers/network-node.js';
import { until as pollUntil, untilProgress } from '../../helpers/poll.js';
import { createTestRuntime, guestDirConfig, podConfig, pullThenMoveIntoNode, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const APPLETS = ['sleep', 'httpd', 'mkdir', 'echo', 'cat', 'nproc'];
const HTTP_PORT = 8080;
const MiB = 1024 * 1024;

interface PoolStatus {
  handler: string;
  size: number;
  ready: number;
  booting: number;
  claimed: number;
  pids: number[];
  lastBootCpuMs: number | null;
  cgroup: { driver: string; parent: string; cpuShares: number; cpuWeight: number; nice: number };
}

interface SandboxInfo {
  origin: { kind: string; poolVmId?: string; poolMiss?: { reason: string; message: string } | null } | null;
  shape: Record<string, unknown>;
  guest: { vcpus: number; memoryKiB: number };
  qmp: { vcpus: number; baseMemoryMiB: number; pluggedMemoryMiB: number };
  cgroup: Record<string, unknown>;
  plan: { vm: unknown; host: unknown; workload: unknown; source: string; pcie: unknown };
}

describe('the pool of pre-booted VMs (real QEMU, virtiofsd, CNI in a node namespace of our own)', () => {
  let node: NetworkNode;
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  const sandboxes: string[] = [];
  const poolNetns = new Set<string>();

  const poolStatus = async (): Promise<PoolStatus> => {
    const { info } = await rt.cri.runtime.Status({ verbose: true });
    const all = JSON.parse(info.pool ?? '[]') as PoolStatus[];
    const mine = all.find((s) => s.handler === 'kata-ts');
    if (mine === undefined) throw new Error(`no pool for kata-ts in ${info.pool}`);
    return mine;
  };
  const rememberPoolNetns = async (): Promise<void> => {
    for (const f of await fsp.readdir(path.join(rt.stateDir, 'pool')).catch(() => [] as string[])) {
      if (!f.endsWith('.json')) continue;
      const doc = JSON.parse(await fsp.readFile(path.join(rt.stateDir, 'pool', f), 'utf8')) as {
        record: { network: { netnsName: string } | null };
      };
      if (doc.record.network !== null) poolNetns.add(doc.record.network.netnsName);
    }
  };
  const waitReady = (what: string) =>
    pollUntil(what, async () => ((await poolStatus().catch(() => undefined))?.ready === 1 ? true : undefined), scaledMs(420_000), 500);
  const verbose = async (id: string): Promise<SandboxInfo> => {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as SandboxInfo;
  };
  /** 1.5 CPUs (2 vCPUs: the claim hot-plugs one); a smaller quota leaves vCPU headroom for a resize. */
  const podRequest = (name: string, cpuQuota = '150000') => {
    const base = podConfig(rt, name);
    return {
      ...base,
      hostname: name,
      linux: {
        ...(base.linux as Record<string, unknown>),
        resources: { cpu_period: '100000', cpu_quota: cpuQuota, memory_limit_in_bytes: String(300 * MiB) },
      },
    };
  };
  /** The VMM cgroup's limit files as the kernel holds them (cgroup v1 hybrid here). */
  const cgroupLimits = async (info: SandboxInfo): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    const files: Record<string, string[]> = {
      memory: ['memory.limit_in_bytes'],
      cpu: ['cpu.cfs_quota_us', 'cpu.cfs_period_us', 'cpu.shares'],
    };
    for (const [controller, names] of Object.entries(files)) {
      const dir = info.cgroup[`cgroupPath.${controller}`];
      if (typeof dir !== 'string') continue;
      for (const name of names) out[name] = (await fsp.readFile(path.join(dir, name), 'utf8').catch(() => 'absent')).trim();
    }
    return out;
  };
  /** A process's cgroup in the cpu hierarchy (v1 here) as /proc says it, and a file of a cgroup there, from the kernel. */
  const cpuCgroupOf = async (pid: number): Promise<string> =>
    (await fsp.readFile(`/proc/${pid}/cgroup`, 'utf8'))
      .split('\n')
      .find((l) => l.split(':')[1] === 'cpu')
      ?.split(':')[2] ?? 'none';
  const cpuFile = (cgroup: string, file: string) =>
    fsp.readFile(path.join('/sys/fs/cgroup/cpu', cgroup, file), 'utf8').then((t) => t.trim());
  const runPod = async (name: string, cpuQuota?: string): Promise<{ id: string; config: Record<string, unknown> }> => {
    const config = podRequest(name, cpuQuota);
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config }, { deadline: Date.now() + scaledMs(240_000) });
    sandboxes.push(id);
    return { id, config };
  };
  const runContainer = async (sandboxId: string, sandboxConfig: Record<string, unknown>, name: string, command: string[]) => {
    const { container_id: id } = await rt.cri.runtime.CreateContainer({
      pod_sandbox_id: sandboxId,
      config: { metadata: { name, attempt: 0 }, image: { image }, command, log_path: `${name}.log` },
      sandbox_config: sandboxConfig,
    });
    await rt.cri.runtime.StartContainer({ container_id: id });
    return id;
  };

  beforeAll(async () => {
    node = await createNetworkNode();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', '1.0', APPLETS);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
      network: node.networkConfig(),
      hypervisor: {
        // The installed guest (setup builds it from this tree), or KATA_TS_GUEST_DIR's.
        ...guestDirConfig(),
        // Seven sessions share two cores here: a cold boot may take minutes, which is not what this tests.
        readyTimeoutMs: scaledMs(240_000),
      },
      pool: { sizes: { 'kata-ts': 1 } },
    });
    await allowLoopbackRegistries(rt);
    await pullThenMoveIntoNode(rt, image, node.netnsPath);
  }, scaledMs(300_000));

  afterAll(async () => {
    if (rt !== undefined) {
      await rememberPoolNetns().catch(() => undefined);
      // rt.cri throws when the daemon is down (a failed restart): cleanup must still run.
      for (const id of sandboxes)
        await Promise.resolve()
          .then(() => rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }))
          .catch(() => undefined);
      const keep = process.env.KATA_TS_KEEP_DAEMON_LOG;
      if (keep !== undefined) await fsp.copyFile(rt.logFile, keep).catch(() => undefined);
      await rt.cleanup();
    }
    await node?.cleanup([...sandboxes.map(netnsNameFor), ...poolNetns]);
    await registry?.stop();
  }, scaledMs(180_000));

  let pooledId: string;
  let pooledConfig: Record<string, unknown>;

  it(
    'fills: one VM booted to agent ready in the background, shown by Status',
    async () => {
      await waitReady('the pool to fill');
      await rememberPoolNetns();
      const s = await poolStatus();
      expect(s).toMatchObject({ size: 1, ready: 1, booting: 0, claimed: 0 });
      expect(s.pids).toHaveLength(1);
      expect(s.lastBootCpuMs).toBeGreaterThan(0);
      // Its QEMU waits in a cgroup of its own under the pool's (in the test's private tree), both at cpu.shares 2.
      expect(s.cgroup).toEqual({ driver: 'cgroupfs', parent: rt.poolCgroupParent, cpuShares: 2, cpuWeight: 1, nice: 19 });
      const cgroup = await cpuCgroupOf(s.pids[0]!);
      expect(path.dirname(cgroup)).toBe(rt.poolCgroupParent);
      expect(path.basename(cgroup)).toMatch(/^kata-ts-[0-9a-f]{64}$/);
      expect([await cpuFile(cgroup, 'cpu.shares'), await cpuFile(rt.poolCgroupParent, 'cpu.shares')]).toEqual(['2', '2']);
      // Before it was ready it ran the warm-up pod (src/runtime/pool/warm.ts), and nothing failed.
      const ready = (await rt.logLines()).find((l) => l.msg === 'pooled VM ready');
      expect(ready?.warmUpMs).toEqual(expect.any(Number));
      expect(ready?.warmUpFailed).toBeUndefined();
    },
    scaledMs(480_000),
  );

  it(
    'a pod claims it: its container runs from the hot-plugged share and answers on the pod IP',
    async () => {
      const poolPid = (await poolStatus()).pids[0]!;
      const poolCgroup = await cpuCgroupOf(poolPid);
      const a = await runPod('pooled');
      pooledId = a.id;
      pooledConfig = a.config;
      const info = await verbose(pooledId);
      expect(info.origin?.kind).toBe('pool');
      const { status } = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pooledId });
      expect(status!.state).toBe('SANDBOX_READY');
      const ip = status!.network!.ip;
      expect(ip.startsWith(`${node.prefix}.`)).toBe(true);
      const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pooledId, verbose: true });
      expect((JSON.parse(r.info.info!) as { pid: number }).pid).toBe(poolPid);
      // QEMU left the pool for the pod's cgroup, and its own cgroup in the pool's is gone.
      expect(String(info.cgroup['cgroupPath.cpu']).endsWith(await cpuCgroupOf(poolPid))).toBe(true);
      expect(await cpuCgroupOf(poolPid)).toMatch(new RegExp(`^/${rt.cgroupRoot}/pod`));
      expect(await cpuFile(poolCgroup, 'cpu.shares').catch((e: NodeJS.ErrnoException) => e.code)).toBe('ENOENT');
      await runContainer(pooledId, pooledConfig, 'web', [
        'sh',
        '-c',
        `mkdir -p /www && echo hello-from-pool > /www/index.html && exec httpd -f -p ${HTTP_PORT} -h /www`,
      ]);
      const body = await pollUntil(
        'the pooled pod to answer from the node namespace',
        async () => {
          const out = await node.httpGet(`http://${ip}:${HTTP_PORT}/`).catch(() => '');
          return out.includes('hello-from-pool') ? out : undefined;
        },
        scaledMs(120_000),
        250,
      );
      expect(body.trim()).toBe('hello-from-pool');
    },
    scaledMs(300_000),
  );

  let coldId: string;

  it(
    'a pod with the same request while the pool is empty boots cold, says why, and is sized exactly the same',
    async () => {
      const b = await runPod('cold');
      coldId = b.id;
      const cold = await verbose(coldId);
      const pooled = await verbose(pooledId);
      expect(cold.origin?.kind).toBe('cold');
      expect(cold.origin?.poolMiss?.reason).toBe('POOL_EMPTY');
      expect(cold.plan.vm).toEqual(pooled.plan.vm);
      expect(cold.plan.host).toEqual(pooled.plan.host);
      expect(cold.plan.workload).toEqual(pooled.plan.workload);
      expect(cold.plan.pcie).toEqual(pooled.plan.pcie);
      expect(cold.shape).toEqual(pooled.shape);
      for (const k of ['cpuQuotaMillicores', 'cpuRequestMillicores', 'memoryLimitBytes']) expect(cold.cgroup[k]).toBe(pooled.cgroup[k]);
      const coldFiles = await cgroupLimits(cold);
      expect(Object.keys(coldFiles).length).toBeGreaterThan(0);
      expect(await cgroupLimits(pooled)).toEqual(coldFiles);
      expect(cold.guest.vcpus).toBe(pooled.guest.vcpus);
      expect(cold.qmp.vcpus).toBe(pooled.qmp.vcpus);
      expect(cold.qmp.baseMemoryMiB + cold.qmp.pluggedMemoryMiB).toBe(pooled.qmp.baseMemoryMiB + pooled.qmp.pluggedMemoryMiB);
      const c = await runContainer(coldId, b.config, 'cpus', ['sleep', '3600']);
      const pc = await runContainer(pooledId, pooledConfig, 'cpus', ['sleep', '3600']);
      const nproc = async (id: string) =>
        Buffer.from((await rt.cri.runtime.ExecSync({ container_id: id, cmd: ['nproc'], timeout: 30 })).stdout)
          .toString()
          .trim();
      expect(await nproc(pc)).toBe(await nproc(c));
    },
    scaledMs(600_000),
  );

  it(
    'refills, and a daemon restart finds the pooled VM again',
    async () => {
      await waitReady('the pool to refill');
      await rememberPoolNetns();
      const before = await poolStatus();
      expect(before.claimed).toBe(1);
      await rt.restart();
      const after = await poolStatus();
      expect(after.ready).toBe(1);
      expect(after.pids).toEqual(before.pids);
    },
    scaledMs(480_000),
  );

  /** The pooled VMs' records on disk (the test reads what the daemon wrote). */
  interface PooledDoc {
    id: string;
    workDir: string;
    network: { netnsName: string } | null;
    vmm: { pid: number; startTimeTicks: number; qmpSocket: string } | null;
  }
  const pooledRecords = async (): Promise<PooledDoc[]> => {
    const dir = path.join(rt.stateDir, 'pool');
    const out: PooledDoc[] = [];
    for (const f of await fsp.readdir(dir).catch(() => [] as string[]))
      if (f.endsWith('.json')) out.push((JSON.parse(await fsp.readFile(path.join(dir, f), 'utf8')) as { record: PooledDoc }).record);
    return out;
  };
  const gone = (file: string) =>
    fsp.access(file).then(
      () => false,
      () => true,
    );

  /** A 1-vCPU pod booted cold after its claim failed (kept for the resize comparison). */
  let fallback: { id: string; config: Record<string, unknown> };

  it(
    "a claim that fails (a device put on the pool's NIC port through QMP: QEMU refuses the NIC's hot-plug) boots the pod cold, leaves nothing of the pooled VM, and the pool refills",
    async () => {
      await waitReady('the pool to be ready');
      const [victim, ...others] = await pooledRecords();
      expect(others).toEqual([]);
      expect(victim!.vmm).not.toBeNull();
      const { vmm, network } = victim!;
      if (network !== null) poolNetns.add(network.netnsName);
      // The daemon holds the VM's QMP socket while it runs: occupy the port with it stopped.
      await rt.stop();
      const qmp = await connectQmp(vmm!.qmpSocket);
      try {
        await qmp.deviceAdd({ driver: 'virtio-rng-pci', id: 'fault0', bus: POOL_NIC_PORT_ID });
      } finally {
        qmp.close();
      }
      await rt.start();
      expect((await poolStatus()).pids).toEqual([vmm!.pid]);

      fallback = await runPod('fallback', '50000');
      const { status } = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: fallback.id });
      expect(status!.state).toBe('SANDBOX_READY');
      const info = await verbose(fallback.id);
      expect(info.origin?.kind).toBe('cold');
      expect(info.origin?.poolMiss?.reason).toBe('POOL_CLAIM_FAILED');
      expect(info.origin?.poolMiss?.message).toContain(`claiming pooled VM ${victim!.id} failed`);
      expect(info.origin?.poolMiss?.message).toContain('fault0');
      // Nothing of the failed VM is left: QEMU, its namespace, its work dir, its record.
      expect(isSameLiveProcess(vmm!.pid, vmm!.startTimeTicks)).toBe(false);
      if (network !== null) expect(await gone(path.join('/run/netns', network.netnsName))).toBe(true);
      expect(await gone(victim!.workDir)).toBe(true);
      expect(await gone(path.join(rt.stateDir, 'pool', `${victim!.id}.json`))).toBe(true);
      // The claim started a refill: a new VM, not the failed one.
      await waitReady('the pool to refill after the failed claim');
      await rememberPoolNetns();
      const after = await poolStatus();
      expect(after.pids).toHaveLength(1);
      expect(after.pids[0]).not.toBe(vmm!.pid);
      expect((await pooledRecords()).map((r) => r.id)).not.toContain(victim!.id);
    },
    scaledMs(900_000),
  );

  it(
    "a pooled pod grows like a cold one: UpdateContainerResources hot-plugs a vCPU and virtio-mem on top of the claim's, the cgroup limits follow",
    async () => {
      await waitReady('the pool to be ready');
      const pooled = await runPod('resized', '50000');
      const before = { pooled: await verbose(pooled.id), cold: await verbose(fallback.id) };
      expect(before.pooled.origin?.kind).toBe('pool');
      expect(before.pooled.shape).toEqual(before.cold.shape);
      expect(before.pooled.qmp.vcpus).toBe(1);
      // The claim grew the pooled VM's small boot RAM by virtio-mem: a resize adds to that.
      expect(before.pooled.qmp.pluggedMemoryMiB).toBeGreaterThan(before.cold.qmp.pluggedMemoryMiB);
      const limitsBefore = await cgroupLimits(before.pooled);
      const grow = {
        requests: { cpu: { string: '1' }, memory: { string: '256Mi' } },
        limits: { cpu: { string: '1500m' }, memory: { string: '512Mi' } },
      };
      for (const pod of [pooled, fallback]) {
        const c = await runContainer(pod.id, pod.config, 'grow', ['sleep', '3600']);
        await rt.cri.runtime.UpdateContainerResources({ container_id: c, kubernetes_resources: grow });
      }
      const grown = { pooled: await verbose(pooled.id), cold: await verbose(fallback.id) };
      expect(grown.pooled.shape).toEqual(grown.cold.shape);
      const shape = grown.pooled.shape as { vcpus: number; memoryMiB: number };
      expect(shape.vcpus).toBe(2);
      expect(shape.memoryMiB).toBeGreaterThan((before.pooled.shape as { memoryMiB: number }).memoryMiB);
      for (const info of Object.values(grown)) expect(info.qmp.vcpus).toBe(2);
      // The guests plug virtio-mem blocks in their own time: both VMs reach the new shape's memory.
      const plugged = async (id: string) =>
        untilProgress(
          'the guest to plug the grown memory',
          async () => {
            const { qmp } = await verbose(id);
            return {
              done: qmp.baseMemoryMiB + qmp.pluggedMemoryMiB === shape.memoryMiB ? qmp : undefined,
              progress: qmp.pluggedMemoryMiB,
              seen: qmp,
            };
          },
          60_000,
        );
      const qmpPooled = await plugged(pooled.id);
      const qmpCold = await plugged(fallback.id);
      expect(qmpPooled.baseMemoryMiB).toBe(before.pooled.qmp.baseMemoryMiB);
      expect(qmpCold.baseMemoryMiB).toBe(before.cold.qmp.baseMemoryMiB);
      // The VMM's cgroup follows: the same limits as the cold pod's, above the grown VM.
      for (const k of ['cpuQuotaMillicores', 'cpuRequestMillicores', 'memoryLimitBytes'])
        expect(grown.pooled.cgroup[k]).toBe(grown.cold.cgroup[k]);
      const files = await cgroupLimits(grown.pooled);
      expect(files).toEqual(await cgroupLimits(grown.cold));
      expect(Number(files['memory.limit_in_bytes'])).toBeGreaterThan(Number(limitsBefore['memory.limit_in_bytes']));
      expect(Number(files['memory.limit_in_bytes'])).toBeGreaterThan(shape.memoryMiB * MiB);
      expect(Number(files['cpu.cfs_quota_us'])).toBeGreaterThanOrEqual(200_000);
      // A daemon restart re-attaches the claimed VM (its QEMU's argv still names the pool's work dir).
      await rt.restart();
      for (const id of [pooled.id, fallback.id]) {
        const { status } = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id });
        expect(status!.state).toBe('SANDBOX_READY');
        expect((await verbose(id)).qmp.vcpus).toBe(2);
      }
    },
    scaledMs(600_000),
  );
  it(
    'a claim that stalls (the pooled QEMU stopped with SIGSTOP, so QMP never answers) is abandoned past pool.claimTimeoutMs, and the pod boots cold',
    async () => {
      const config = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as { pool: Record<string, unknown> };
      config.pool.claimTimeoutMs = 3000;
      await fsp.writeFile(rt.configPath, JSON.stringify(config));
      await rt.restart();
      await waitReady('the pool to be ready');
      const [victim] = await pooledRecords();
      const { vmm, network } = victim!;
      if (network !== null) poolNetns.add(network.netnsName);
      process.kill(vmm!.pid, 'SIGSTOP');
      try {
        const stalled = await runPod('stalled', '50000');
        const { status } = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: stalled.id });
        expect(status!.state).toBe('SANDBOX_READY');
        const info = await verbose(stalled.id);
        expect(info.origin?.kind).toBe('cold');
        expect(info.origin?.poolMiss?.reason).toBe('POOL_CLAIM_FAILED');
        expect(info.origin?.poolMiss?.message).toContain(`claiming pooled VM ${victim!.id} failed`);
        expect(info.origin?.poolMiss?.message).toContain('budget of 3000 ms (pool.claimTimeoutMs');
        // The stalled VM is gone, killed by the claim's rollback while stopped.
        expect(isSameLiveProcess(vmm!.pid, vmm!.startTimeTicks)).toBe(false);
        expect(await gone(victim!.workDir)).toBe(true);
      } finally {
        if (isSameLiveProcess(vmm!.pid, vmm!.startTimeTicks)) process.kill(vmm!.pid, 'SIGCONT');
      }
    },
    scaledMs(600_000),
  );
});
