/**
 * The operator's day two behind the real containerd (Debian's 1.6.20, started privately by
 * test/helpers/containerd.ts) with one kata-ts pod (one VM boot) and one container:
 * - `kata-ts ps --json` (the CLI, run as a process) lists the pod with its QEMU's pid (alive),
 *   the shape its sandbox record holds, its cgroup and its container;
 * - the pod's shim serves Prometheus text on `<pod state dir>/metrics.sock`: QEMU's CPU and
 *   memory, an agent round trip, the guest's memory, the containers, labelled with the pod;
 * - `kata-ts metrics --shims` merges it into one node exposition;
 * - the shim's log lines reach containerd's own log through the bundle's `log` FIFO, as logfmt
 *   lines naming the pod (and, for a task's calls, the container);
 * - once the pod is removed, `ps` lists nothing and the metrics socket is gone.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins) is not installed.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PodView } from '../../../src/cli/ps.js';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { type MetricFamily, parseExposition } from '../../../src/shim/exposition.js';
import { scrapeMetricsSocket } from '../../../src/shim/node-pods.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER } from '../../helpers/containerd.js';
import { until } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`kata-ts day two behind containerd skipped: ${MISSING}`);

const execFileAsync = promisify(execFile);

/** The kata-ts CLI from the sources, as an operator runs it. */
async function kataTs(args: string[]): Promise<{ stdout: string; stderr: string }> {
  return execFileAsync(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', ...args], {
    cwd: packageRoot(),
    maxBuffer: 16 * 1024 * 1024,
  });
}

const family = (families: MetricFamily[], name: string): MetricFamily => {
  const f = families.find((x) => x.name === name);
  if (f === undefined) throw new Error(`no family ${name} in the exposition`);
  return f;
};
const sampleValue = (f: MetricFamily, labels: Record<string, string>, suffix = ''): number | undefined =>
  f.samples.find((s) => s.suffix === suffix && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;

describe.skipIf(MISSING !== null)('day two behind containerd 1.6.20: kata-ts ps, the shim metrics socket, the shim log', () => {
  const node = new ShimNode('/tmp/ktd2-');
  let image = '';
  let logDir = '';
  let podId = '';
  let appId = '';
  const podUid = randomUUID();
  const sandboxConfig = (): PodSandboxConfig => ({
    metadata: { name: 'daytwo', uid: podUid, namespace: 'default', attempt: 0 },
    hostname: 'daytwo',
    log_directory: logDir,
    linux: { cgroup_parent: `/kubepods/burstable/pod${podUid}` },
  });
  const podDir = () => path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
  const ps = async (): Promise<PodView[]> =>
    JSON.parse((await kataTs(['ps', '--state-root', node.stateRoot, '--json'])).stdout) as PodView[];

  beforeAll(async () => {
    // This test is about the running pod, not boot speed: a busy machine's TCG boot may take long.
    await node.start({ shimConfig: { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(200_000) } } });
    image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'daytwo', ['sleep']);
    logDir = await node.podLogDir('daytwo', podUid);
    await node.cri.image.PullImage({ image: { image } });
  });

  afterAll(() => node.stop());

  it('one pod with one container: kata-ts ps lists it with its live VM, its recorded shape, cgroup and metrics socket', async () => {
    podId = (
      await node.cri.runtime.RunPodSandbox(
        { config: sandboxConfig(), runtime_handler: KATA_TS_HANDLER },
        { deadline: Date.now() + scaledMs(240_000) },
      )
    ).pod_sandbox_id;
    appId = (
      await node.cri.runtime.CreateContainer({
        pod_sandbox_id: podId,
        config: { metadata: { name: 'app', attempt: 0 }, image: { image }, command: ['sleep', '3600'], log_path: 'app.log' },
        sandbox_config: sandboxConfig(),
      })
    ).container_id;
    await node.cri.runtime.StartContainer({ container_id: appId });

    const qemu = liveProcessesMentioning(podDir()).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'));
    expect(qemu).toHaveLength(1);
    const envelope = JSON.parse(readFileSync(path.join(podDir(), 'sandboxes', `${podId}.json`), 'utf8')) as {
      record: { shape: { vcpus: number; maxVcpus: number; memoryMiB: number; maxMemoryMiB: number }; vmm: { pid: number } };
    };
    const pods = await ps();
    expect(pods).toHaveLength(1);
    const [pod] = pods;
    expect(pod).toMatchObject({
      source: 'shim',
      namespace: 'k8s.io',
      sandboxId: podId,
      pod: 'default/daytwo',
      handler: 'kata-ts',
      status: 'running',
      vm: { pid: qemu[0], alive: true },
      containers: 1,
      metricsSocket: path.join(podDir(), 'metrics.sock'),
      problems: [],
    });
    expect(pod!.shim?.alive).toBe(true);
    expect(pod!.vm?.pid).toBe(envelope.record.vmm.pid);
    const { shape } = envelope.record;
    expect(pod!.shape).toEqual({
      vcpus: shape.vcpus,
      maxVcpus: shape.maxVcpus,
      memoryMiB: shape.memoryMiB,
      maxMemoryMiB: shape.maxMemoryMiB,
    });
    expect(pod!.cgroup?.driver).toBe('cgroupfs');
    expect(pod!.cgroup?.path).toContain(`/pod${podUid}/`);
    expect(readFileSync(`/proc/${qemu[0]}/cgroup`, 'utf8')).toContain(`/pod${podUid}/`);
    // The table names the pod too.
    const table = (await kataTs(['ps', '--state-root', node.stateRoot])).stdout;
    expect(table).toMatch(new RegExp(`k8s\\.io\\s+${podId.slice(0, 13)}\\s+default/daytwo\\s+kata-ts\\s+running`));
  });

  it("the pod's metrics socket serves Prometheus text: VM CPU and memory, an agent round trip, the guest's memory, its container", async () => {
    const socket = path.join(podDir(), 'metrics.sock');
    const base = { sandbox_id: podId, namespace: 'k8s.io', handler: 'kata-ts' };
    // The VM has run (booted, started a container): QEMU has used CPU time the host counted. On a
    // busy machine an agent call of a scrape may time out (counted, its samples left out): the
    // next scrape asks again.
    const families = await until('QEMU CPU time and the guest memory in the scrape', async (note) => {
      const parsed = parseExposition(await scrapeMetricsSocket(socket, 15_000));
      const cpu = family(parsed, 'kata_ts_shim_process_cpu_seconds_total');
      const user = sampleValue(cpu, { ...base, process: 'qemu', mode: 'user' }) ?? 0;
      const system = sampleValue(cpu, { ...base, process: 'qemu', mode: 'system' }) ?? 0;
      const guest = parsed.find((f) => f.name === 'kata_ts_shim_guest_memory_bytes');
      const kinds = guest?.samples.map((s) => s.labels.kind) ?? [];
      note({ user, system, kinds });
      return user + system > 0 && kinds.includes('total') && kinds.includes('used') ? parsed : undefined;
    });
    expect(family(families, 'kata_ts_shim_process_cpu_seconds_total').type).toBe('counter');
    expect(sampleValue(family(families, 'kata_ts_shim_process_up'), { ...base, process: 'qemu' })).toBe(1);
    expect(sampleValue(family(families, 'kata_ts_shim_process_up'), { ...base, process: 'virtiofsd' })).toBe(1);
    for (const p of ['qemu', 'virtiofsd', 'shim']) {
      expect(sampleValue(family(families, 'kata_ts_shim_process_rss_bytes'), { ...base, process: p }), p).toBeGreaterThan(0);
      expect(sampleValue(family(families, 'kata_ts_shim_process_pss_bytes'), { ...base, process: p }), p).toBeGreaterThan(0);
    }
    const rpc = family(families, 'kata_ts_shim_agent_rpc_duration_seconds');
    expect(rpc.type).toBe('histogram');
    expect(sampleValue(rpc, { ...base, method: 'GetGuestFacts' }, '_count')).toBeGreaterThanOrEqual(1);
    expect(sampleValue(rpc, { ...base, method: 'GetGuestFacts' }, '_sum')).toBeGreaterThan(0);
    expect(sampleValue(rpc, { ...base, method: 'GetGuestFacts', le: '+Inf' }, '_bucket')).toBe(
      sampleValue(rpc, { ...base, method: 'GetGuestFacts' }, '_count'),
    );
    const guest = family(families, 'kata_ts_shim_guest_memory_bytes');
    const total = sampleValue(guest, { ...base, kind: 'total' }) ?? 0;
    expect(total).toBeGreaterThan(0);
    expect(sampleValue(guest, { ...base, kind: 'used' })).toBeGreaterThan(0);
    expect(sampleValue(guest, { ...base, kind: 'available' })).toBeLessThanOrEqual(total);
    const pod = (await ps())[0]!;
    // The guest sees the memory the VM was given, less what its kernel keeps for itself.
    expect(total).toBeLessThanOrEqual(pod.shape!.memoryMiB * 1024 * 1024);
    expect(sampleValue(family(families, 'kata_ts_shim_vm_vcpus'), { ...base, bound: 'current' })).toBe(pod.shape!.vcpus);
    expect(sampleValue(family(families, 'kata_ts_shim_containers'), { ...base, state: 'running' })).toBe(1);
    expect(family(families, 'kata_ts_shim_agent_rpc_failures_total').type).toBe('counter');
    // What one scrape costs here, for the record (not asserted: timings depend on the machine).
    const mean = (m: string) =>
      (sampleValue(rpc, { ...base, method: m }, '_sum') ?? 0) / (sampleValue(rpc, { ...base, method: m }, '_count') ?? 1);
    console.info(
      `day-two scrape: ${(sampleValue(family(families, 'kata_ts_shim_scrape_duration_seconds'), base) ?? 0) * 1000} ms; agent round trip ` +
        `GetGuestFacts ${mean('GetGuestFacts') * 1000} ms, GuestStats ${mean('GuestStats') * 1000} ms; shim PSS ` +
        `${(sampleValue(family(families, 'kata_ts_shim_process_pss_bytes'), { ...base, process: 'shim' }) ?? 0) / 2 ** 20} MiB`,
    );
  });

  it('kata-ts metrics --shims: one node exposition holding the pod; a dead socket is named and skipped', async () => {
    const { stdout, stderr } = await kataTs(['metrics', '--shims', '--state-root', node.stateRoot]);
    expect(stderr).toBe('');
    const families = parseExposition(stdout);
    expect(sampleValue(family(families, 'kata_ts_shim_info'), { sandbox_id: podId })).toBe(1);
    expect(sampleValue(family(families, 'kata_ts_node_shim_scrapes'), {})).toBe(1);
    expect(sampleValue(family(families, 'kata_ts_node_shim_scrape_failures'), {})).toBe(0);
    // A pod whose shim died: its socket file stays until delete, and nothing answers on it.
    const dead = path.join(node.stateRoot, 'k8s.io', 'deadbeefdeadbeef');
    await fsp.mkdir(dead, { recursive: true });
    await fsp.writeFile(path.join(dead, 'metrics.sock'), '');
    try {
      const withDead = await kataTs(['metrics', '--shims', '--state-root', node.stateRoot]);
      expect(withDead.stderr).toContain(`skipped ${path.join(dead, 'metrics.sock')}`);
      const merged = parseExposition(withDead.stdout);
      expect(sampleValue(family(merged, 'kata_ts_node_shim_scrape_failures'), {})).toBe(1);
      expect(sampleValue(family(merged, 'kata_ts_shim_info'), { sandbox_id: podId })).toBe(1);
      const listed = await ps();
      expect(listed.map((p) => [p.stateDir, p.status]).sort()).toEqual(
        [
          [dead, 'starting'],
          [podDir(), 'running'],
        ].sort(),
      );
    } finally {
      await fsp.rm(dead, { recursive: true, force: true });
    }
  });

  it("the shim's lines are in containerd's log, as logfmt naming the pod and, for a task's calls, the container", async () => {
    const lines = node.ctrd.logText().split('\n');
    const ours = lines.filter((l) => l.includes('component=shim'));
    expect(ours.length).toBeGreaterThan(0);
    for (const l of ours) expect(l, l).toMatch(new RegExp(`^time=\\S+ level=\\w+ msg=.* namespace=k8s\\.io sandboxId=${podId}( |$)`));
    expect(ours.some((l) => l.includes('msg="shim serving"'))).toBe(true);
    expect(ours.some((l) => l.includes(`containerId=${appId}`) && l.includes('method='))).toBe(true);
  });

  it('after the pod is removed: ps lists nothing, the metrics socket is gone', async () => {
    const socket = path.join(podDir(), 'metrics.sock');
    const shim = (await ps())[0]!.shim!.pid;
    await node.cri.runtime.StopContainer({ container_id: appId, timeout: 10 });
    await node.cri.runtime.RemoveContainer({ container_id: appId });
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId });
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
    await until('the shim to exit', async (note) => {
      note(isRunning(shim));
      return isRunning(shim) ? undefined : true;
    });
    expect(existsSync(socket)).toBe(false);
    expect(await ps()).toEqual([]);
    const { stdout } = await kataTs(['metrics', '--shims', '--state-root', node.stateRoot]);
    expect(sampleValue(family(parseExposition(stdout), 'kata_ts_node_shim_scrapes'), {})).toBe(0);
  });
});
