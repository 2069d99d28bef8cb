/**
 * The baseline of the shim harness: Debian's containerd 1.6.20 with its CRI plugin, started
 * privately by test/helpers/containerd.ts, runs a pod with runc (runtime handler '' = the
 * default, io.containerd.runc.v2) through our typed CRI client: pull, RunPodSandbox,
 * CreateContainer, StartContainer, the container's log file, ExecSync, ContainerStats, a
 * containerd restart under the running pod, StopContainer (exit code), RemoveContainer,
 * StopPodSandbox, RemovePodSandbox; then nothing is left (shim, container cgroup, mount, pod netns,
 * veth, IP allocation), and stop() kills containerd by pid and removes the node's namespaces, the
 * cgroup tree and the directory. kata-ts's shim (`io.containerd.kata-ts.v2`) is then run beside
 * runc by the same harness.
 *
 * The OCI config.json containerd wrote for the pause container and for the app container are
 * kept in fixtures/containerd/1.6.20/ (written when missing or with UPDATE_GOLDEN=1; otherwise
 * their shape is compared with this run's), as decoding fixtures for the shim.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins) is not installed.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import type { ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { pid1OffRoot } from '../../helpers/cgroups-machine.js';
import { type ContainerdHandle, containerdMissing, startContainerd } from '../../helpers/containerd.js';
import { type CriClient, criClient } from '../../helpers/cri-client.js';
import { criToolMissingNotice, criToolPath } from '../../helpers/cri-tools.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { until, untilLogLines } from '../../helpers/poll.js';
import { isRunning } from '../../helpers/processes.js';

const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`containerd + runc baseline skipped: ${MISSING}`);
const CRICTL = criToolPath('crictl');
if (MISSING === null && CRICTL === null) console.warn(`notice: ${criToolMissingNotice('crictl')}`);

const FIXTURES = path.join(packageRoot(), 'fixtures', 'containerd', '1.6.20');

interface OciConfig {
  ociVersion: string;
  process: { args: string[] };
  annotations: Record<string, string>;
  mounts: Array<{ destination: string }>;
  linux: { cgroupsPath: string; namespaces: Array<{ type: string; path?: string }> };
}

/**
 * Keeps containerd's config.json as a fixture when there is none (or UPDATE_GOLDEN=1), ids and
 * paths as they are; otherwise checks that this run's has the fixture's shape (annotation keys,
 * mount destinations, namespace types), so that the fixture stays representative of 1.6.20.
 */
async function keepOrCompareFixture(name: string, text: string): Promise<void> {
  const file = path.join(FIXTURES, name);
  if (process.env.UPDATE_GOLDEN === '1' || !existsSync(file)) {
    await fsp.mkdir(FIXTURES, { recursive: true });
    await fsp.writeFile(file, `${JSON.stringify(JSON.parse(text), null, 2)}\n`);
    return;
  }
  const shape = (c: OciConfig) => ({
    ociVersion: c.ociVersion,
    annotations: Object.keys(c.annotations).sort(),
    mounts: c.mounts.map((m) => m.destination),
    namespaces: c.linux.namespaces.map((n) => n.type),
  });
  expect(shape(JSON.parse(text) as OciConfig)).toEqual(shape(JSON.parse(await fsp.readFile(file, 'utf8')) as OciConfig));
}

describe.skipIf(MISSING !== null)('a runc pod through a private containerd 1.6.20 (the shim harness baseline)', () => {
  let registry: RegistryHandle | undefined;
  let ctrd: ContainerdHandle | undefined;
  let cri: CriClient | undefined;
  let image = '';
  let podId = '';
  let ctrId = '';
  let podIp = '';
  let logDir = '';
  let shimPid = 0;
  const podUid = randomUUID();
  // What a kubelet with the cgroupfs driver sends; inside containerd's cgroup namespace this is
  // an ordinary absolute path, on the host it lies below the harness's private tree.
  const cgroupParent = `/kubepods/besteffort/pod${podUid}`;
  const sandboxConfig = (): PodSandboxConfig => ({
    metadata: { name: 'baseline', uid: podUid, namespace: 'default', attempt: 0 },
    hostname: 'baseline-pod',
    log_directory: logDir,
    linux: { cgroup_parent: cgroupParent },
  });
  const containerStatus = async (id: string) => (await cri!.runtime.ContainerStatus({ container_id: id })).status!;

  beforeAll(async () => {
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata-ts/busybox', 'containerd', ['sleep', 'ip', 'hostname', 'wc']);
    ctrd = await startContainerd({ registry });
    cri = criClient(ctrd.criSocket);
    logDir = path.join(ctrd.dir, 'pods', `default_baseline_${podUid}`);
    await fsp.mkdir(logDir, { recursive: true });
  });

  afterAll(async () => {
    cri?.close();
    // Idempotent: the last test stopped it already unless an earlier one failed.
    const report = await ctrd?.stop();
    await registry?.stop();
    // After a failure too: whatever containerd left was killed and removed, and nothing may remain.
    if (report !== undefined && report.leftovers.length > 0) throw new Error(`the containerd harness left: ${report.leftovers.join('; ')}`);
  });

  it('serves the CRI as containerd 1.6.20, runtime and network ready', async () => {
    const version = await cri!.runtime.Version({});
    expect(version.runtime_name).toBe('containerd');
    expect(version.runtime_version).toMatch(/^1\.6\.20/);
    const { status } = await cri!.runtime.Status({});
    expect(Object.fromEntries((status?.conditions ?? []).map((c) => [c.type, c.status]))).toEqual({
      RuntimeReady: true,
      NetworkReady: true,
    });
  });

  it('pulls from the loopback registry through its own hosts.toml (plain HTTP, relayed into the node)', async () => {
    const { image_ref } = await cri!.image.PullImage({ image: { image } });
    expect(image_ref).toMatch(/^sha256:[0-9a-f]{64}$/);
    const status = await cri!.image.ImageStatus({ image: { image } });
    expect(status.image?.repo_tags).toContain(image);
    // The sandbox image was pulled by the harness already.
    expect((await cri!.image.ImageStatus({ image: { image: ctrd!.sandboxImage } })).image?.id).toMatch(/^sha256:/);
  });

  it('RunPodSandbox with runc: READY, eth0 from the private subnet, the pause process in the pod cgroup', async () => {
    podId = (await cri!.runtime.RunPodSandbox({ config: sandboxConfig(), runtime_handler: '' })).pod_sandbox_id;
    const { status } = await cri!.runtime.PodSandboxStatus({ pod_sandbox_id: podId });
    expect(status?.state).toBe('SANDBOX_READY');
    podIp = status?.network?.ip ?? '';
    expect(podIp.startsWith(ctrd!.podSubnetPrefix)).toBe(true);
    expect(await fsp.readdir(path.join(ctrd!.ipamDir, 'kata-ts-containerd'))).toContain(podIp);
    expect(await fsp.readdir(ctrd!.netnsDir)).toHaveLength(1);

    const configText = await fsp.readFile(path.join(ctrd!.bundleDir(podId), 'config.json'), 'utf8');
    const config = JSON.parse(configText) as OciConfig;
    expect(config.annotations['io.kubernetes.cri.container-type']).toBe('sandbox');
    expect(config.annotations['io.kubernetes.cri.sandbox-uid']).toBe(podUid);
    expect(config.linux.cgroupsPath).toBe(`${cgroupParent}/${podId}`);
    expect(config.linux.namespaces.find((n) => n.type === 'network')?.path).toMatch(new RegExp(`^${ctrd!.netnsDir}/cni-`));
    await keepOrCompareFixture('sandbox.config.json', configText);

    // runc put the pause process where cgroupsPath says, which on the host is inside the private tree.
    for (const dir of ctrd!.cgroupDirs(`${cgroupParent}/${podId}`)) {
      expect((await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8')).trim(), dir).toMatch(/^\d+$/);
    }
    // One runc shim for the pod (`pid comm cgroup`; comm is cut at 15 characters), in containerd's cgroup.
    const shims = (await ctrd!.strayProcesses()).map((s) => s.split(' ')).filter(([, comm]) => comm === 'containerd-shim');
    expect(shims.map(([, , cgroup]) => cgroup)).toEqual(['/containerd']);
    shimPid = Number(shims[0]?.[0]);
  });

  it('CreateContainer, StartContainer: RUNNING, and its stdout and stderr in the log file', async () => {
    ctrId = (
      await cri!.runtime.CreateContainer({
        pod_sandbox_id: podId,
        config: {
          metadata: { name: 'app', attempt: 0 },
          image: { image },
          command: [
            'sh',
            '-c',
            "trap 'echo got TERM; exit 42' TERM; echo hello from runc; echo to stderr >&2; while :; do sleep 1 & wait $!; done",
          ],
          log_path: 'app.log',
          linux: {
            resources: { memory_limit_in_bytes: String(64 * 1024 * 1024), cpu_period: '100000', cpu_quota: '50000', cpu_shares: '512' },
          },
        },
        sandbox_config: sandboxConfig(),
      })
    ).container_id;
    await cri!.runtime.StartContainer({ container_id: ctrId });
    // containerd 1.6 makes the task, and so its bundle, at StartContainer.
    const configText = await fsp.readFile(path.join(ctrd!.bundleDir(ctrId), 'config.json'), 'utf8');
    const config = JSON.parse(configText) as OciConfig;
    expect(config.annotations['io.kubernetes.cri.container-type']).toBe('container');
    expect(config.annotations['io.kubernetes.cri.sandbox-id']).toBe(podId);
    expect(config.linux.cgroupsPath).toBe(`${cgroupParent}/${ctrId}`);
    await keepOrCompareFixture('container.config.json', configText);
    // runc wrote the limits into the container's cgroup, which on the host is inside the private tree.
    // (v1 files on these hybrid machines; the cgroup2 ones where the host is unified.)
    const dirs = ctrd!.cgroupDirs(`${cgroupParent}/${ctrId}`);
    const v1 = (name: string) => dirs.find((d) => d.includes(`/${name}/`));
    const limits = v1('memory')
      ? [path.join(v1('memory')!, 'memory.limit_in_bytes'), path.join(v1('cpu')!, 'cpu.cfs_quota_us')]
      : [path.join(dirs[0]!, 'memory.max'), path.join(dirs[0]!, 'cpu.max')];
    const [memory, cpu] = await Promise.all(limits.map(async (f) => (await fsp.readFile(f, 'utf8')).trim()));
    expect(memory).toBe(String(64 * 1024 * 1024));
    expect(cpu).toMatch(/^50000( 100000)?$/);

    expect((await containerStatus(ctrId)).state).toBe('CONTAINER_RUNNING');
    const lines = await untilLogLines(
      'the container output in its CRI log',
      [path.join(logDir, 'app.log')],
      (l) => l.includes('stdout F hello from runc') && l.includes('stderr F to stderr'),
    );
    expect(lines).toEqual(expect.arrayContaining(['stdout F hello from runc', 'stderr F to stderr']));
  });

  it('ExecSync: stdout, stderr and the exit code; the pod network inside is eth0 with the pod IP', async () => {
    const res = await cri!.runtime.ExecSync({ container_id: ctrId, cmd: ['sh', '-c', 'echo out; echo err >&2; exit 3'], timeout: 30 });
    expect([res.stdout.toString(), res.stderr.toString(), res.exit_code]).toEqual(['out\n', 'err\n', 3]);
    const ip = await cri!.runtime.ExecSync({ container_id: ctrId, cmd: ['ip', '-4', '-o', 'addr', 'show', 'dev', 'eth0'], timeout: 30 });
    expect(ip.exit_code).toBe(0);
    expect(ip.stdout.toString()).toContain(`inet ${podIp}/24`);
    const hostname = await cri!.runtime.ExecSync({ container_id: ctrId, cmd: ['hostname'], timeout: 30 });
    expect(hostname.stdout.toString().trim()).toBe('baseline-pod');
  });

  it("ContainerStats: cpu and memory of the container's cgroup", async () => {
    const stats = await until('cpu and memory in ContainerStats', async (note) => {
      const { stats: s } = await cri!.runtime.ContainerStats({ container_id: ctrId });
      note(s);
      const cpu = BigInt(s?.cpu?.usage_core_nano_seconds?.value ?? '0');
      const memory = BigInt(s?.memory?.working_set_bytes?.value ?? '0');
      return cpu > 0n && memory > 0n ? s : undefined;
    });
    expect(stats?.attributes?.id).toBe(ctrId);
    expect(stats?.attributes?.metadata?.name).toBe('app');
  });

  it.skipIf(CRICTL === null)(
    `upstream crictl sees the pod and the container${CRICTL === null ? ' (skipped: crictl not found)' : ''}`,
    async () => {
      const { execFile } = await import('node:child_process');
      const run = (args: string[]) =>
        new Promise<string>((resolve, reject) =>
          execFile(CRICTL!, [`--runtime-endpoint=unix://${ctrd!.criSocket}`, ...args], (err, stdout) =>
            err ? reject(err) : resolve(stdout),
          ),
        );
      expect(await run(['pods', '-q'])).toContain(podId);
      expect(await run(['ps', '-q'])).toContain(ctrId);
    },
  );

  it('a containerd restart (SIGTERM by pid) leaves the pod running; the new containerd drives it', async () => {
    const before = ctrd!.pid;
    await ctrd!.restart();
    expect(ctrd!.pid).not.toBe(before);
    expect(isRunning(before)).toBe(false);
    // The shim outlived containerd, and the new one found it (its socket under the node's /run/containerd/s).
    expect(isRunning(shimPid)).toBe(true);
    expect((await cri!.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state).toBe('SANDBOX_READY');
    expect((await containerStatus(ctrId)).state).toBe('CONTAINER_RUNNING');
    const res = await cri!.runtime.ExecSync({ container_id: ctrId, cmd: ['echo', 'after restart'], timeout: 30 });
    expect([res.stdout.toString(), res.exit_code]).toEqual(['after restart\n', 0]);
  });

  it('StopContainer: SIGTERM, its exit code 42 and reason; RemoveContainer', async () => {
    await cri!.runtime.StopContainer({ container_id: ctrId, timeout: 30 });
    const status = await containerStatus(ctrId);
    expect(status).toMatchObject({ state: 'CONTAINER_EXITED', exit_code: 42, reason: 'Error' });
    await untilLogLines('the trap output in the log', [path.join(logDir, 'app.log')], (l) => l.includes('stdout F got TERM'));
    await cri!.runtime.RemoveContainer({ container_id: ctrId });
    const { containers } = await cri!.runtime.ListContainers({});
    expect(containers.map((c) => c.id)).not.toContain(ctrId);
  });

  it('StopPodSandbox, RemovePodSandbox: no shim, container cgroup, mount, pod netns, veth or IP allocation is left', async () => {
    await cri!.runtime.StopPodSandbox({ pod_sandbox_id: podId });
    await cri!.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
    expect((await cri!.runtime.ListPodSandbox({})).items).toEqual([]);
    // The shim exits on its own once its last task is deleted.
    await until('no process but the holder and containerd in the private tree', async (note) => {
      const strays = await ctrd!.strayProcesses();
      note(strays);
      return strays.length === 0 ? true : undefined;
    });
    expect(isRunning(shimPid)).toBe(false);
    // runc removed the pod's and the container's cgroups: what is left of the tree is the parent
    // (the kubelet's to remove; here runc made it), empty, in every hierarchy.
    expect(await ctrd!.podCgroups()).toEqual(['/kubepods', '/kubepods/besteffort', cgroupParent]);
    for (const dir of ctrd!.cgroupDirs(cgroupParent)) {
      const children = (await fsp.readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory());
      expect(
        children.map((e) => e.name),
        dir,
      ).toEqual([]);
    }
    expect(await ctrd!.mountsUnder()).toEqual([]);
    expect(await fsp.readdir(ctrd!.netnsDir)).toEqual([]);
    expect(await fsp.readdir(path.join(ctrd!.ipamDir, 'kata-ts-containerd'))).not.toContain(podIp);
    const links = JSON.parse(await ctrd!.nodeExec(['ip', '-j', 'link', 'show'])) as Array<{ ifname: string }>;
    expect(links.map((l) => l.ifname).sort()).toEqual(['kts-cni0', 'lo']);
  });

  it('the kata-ts handler is configured: without its shim on PATH, RunPodSandbox fails naming the binary and leaves nothing', async () => {
    const failed = await cri!.runtime
      .RunPodSandbox({
        config: { ...sandboxConfig(), metadata: { name: 'no-shim', uid: randomUUID(), namespace: 'default', attempt: 0 } },
        runtime_handler: 'kata-ts',
      })
      .then(
        () => undefined,
        (err: ServiceError) => err,
      );
    expect(failed?.details).toMatch(/runtime "io\.containerd\.kata-ts\.v2" binary not installed "containerd-shim-kata-ts-v2"/);
    expect((await cri!.runtime.ListPodSandbox({})).items).toEqual([]);
    expect(await ctrd!.strayProcesses()).toEqual([]);
    expect(await ctrd!.mountsUnder()).toEqual([]);
    expect(await fsp.readdir(ctrd!.netnsDir)).toEqual([]);
    expect(await fsp.readdir(path.join(ctrd!.ipamDir, 'kata-ts-containerd'))).not.toContain(expect.stringMatching(/^\d/));
  });

  it("stop(): containerd killed by pid, no stray process, the node's namespaces, the cgroup tree and the directory gone", async () => {
    const pid = ctrd!.pid;
    const { dir } = ctrd!;
    const cgroupDirs = ctrd!.cgroupDirs('/');
    const report = await ctrd!.stop();
    expect(report).toEqual({ containerd: { pid, signal: 'SIGTERM' }, strays: [], leftovers: [] });
    expect(isRunning(pid)).toBe(false);
    expect(existsSync(dir)).toBe(false);
    for (const d of cgroupDirs) expect(existsSync(d), d).toBe(false);
    expect(await pid1OffRoot()).toEqual([]);
  });
});
