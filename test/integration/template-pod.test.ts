/**
 * Pods from a VM template through the standalone daemon's CRI (src/runtime/template/manager.ts,
 * claim.ts; docs/templates.md "Pods from a template"), on real QEMU 7.2 (TCG), the real guest and
 * agent, crun in the guest, CNI in a node namespace of the test's own and a loopback registry:
 *
 * - the handler's template is built in the background once the daemon runs (Status shows it);
 * - a pod starts as a clone (its QEMU restored with `-incoming`, mapping the template's RAM file
 *   private): its container runs from the 9p share, serves a file the host wrote into a hostPath
 *   volume on the pod IP, and writes one back;
 * - a second clone shares the template's pages with the first (the RAM file mapping's PSS is below
 *   its RSS in each);
 * - a daemon restart finds both clones and exec works in them;
 * - a template whose state file was altered is never used: the next pod boots cold with the
 *   reason in its status, nothing of the failed clone is left, and the template is rebuilt in the
 *   background, after which pods clone again;
 * - removing the pods leaves no QEMU, namespace, cgroup or work dir; the template stays.
 *
 * Timings are printed (TEMPLATE_POD_NUMBERS), never asserted.
 */
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSameLiveProcess, readProcStat } from '../../src/common/procfs.js';
import { netnsNameFor } from '../../src/network/index.js';
import { WARM_UP_STEPS } from '../../src/runtime/pool/warm.js';
import { qemuPidsUsing } from '../../src/runtime/sandbox/orphans.js';
import { templateBuildRoot } from '../../src/runtime/template/manager.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../helpers/busybox-image.js';
import { type RegistryHandle, startRegistry } from '../helpers/images-registry.js';
import { createNetworkNode, type NetworkNode } from '../helpers/network-node.js';
import { until } from '../helpers/poll.js';
import { createTestRuntime, guestDirConfig, podConfig, pullThenMoveIntoNode, type TestRuntime } from '../helpers/runtime-daemon.js';
import { scaledMs } from '../helpers/time-scale.js';

const APPLETS = ['sleep', 'httpd', 'cat', 'echo', 'nproc'];
const HTTP_PORT = 8080;
const MiB = 1024 * 1024;

interface TemplateStatus {
  handler: string;
  phase: 'building' | 'ready' | 'failed';
  templateName: string | null;
  buildMs: number | null;
  failure: { reason: string; message: string } | null;
  clones: number;
  misses: number;
  lastMiss: { reason: string; message: string } | null;
}

interface SandboxInfo {
  pid: number;
  origin: {
    kind: string;
    templateName?: string;
    cloneReadyMs?: number;
    templateMiss?: { reason: string; message: string } | null;
  } | null;
  guest: { vcpus: number; memoryKiB: number };
  cgroup: Record<string, unknown>;
}

/** The Rss and Pss (KiB) of the mappings of `file` in a process (/proc/<pid>/smaps). */
function mappingKiB(pid: number, file: string): { rssKiB: number; pssKiB: number } {
  let inside = false;
  let rssKiB = 0;
  let pssKiB = 0;
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) inside = line.endsWith(` ${file}`);
    else if (inside && line.startsWith('Rss:')) rssKiB += Number.parseInt(line.slice(4), 10);
    else if (inside && line.startsWith('Pss:')) pssKiB += Number.parseInt(line.slice(4), 10);
  }
  return { rssKiB, pssKiB };
}

describe('pods from a VM template (RunPodSandbox clones; real QEMU, agent, crun, CNI, 9p)', () => {
  let node: NetworkNode;
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  const root = path.join('/dev/shm', `kts-template-pod-${randomBytes(4).toString('hex')}`);
  const sandboxes: string[] = [];
  const numbers: Record<string, number> = {};

  const templateStatus = async (): Promise<TemplateStatus> => {
    const { info } = await rt.cri.runtime.Status({ verbose: true });
    const mine = (JSON.parse(info.templates ?? '[]') as TemplateStatus[]).find((s) => s.handler === 'kata-ts');
    if (mine === undefined) throw new Error(`no template for kata-ts in ${info.templates}`);
    return mine;
  };
  const waitTemplate = (what: string, accept: (s: TemplateStatus) => boolean) =>
    until(
      what,
      async () => {
        const s = await templateStatus().catch(() => undefined);
        if (s?.phase === 'failed') throw new Error(`the template failed: ${JSON.stringify(s.failure)}`);
        return s !== undefined && accept(s) ? s : undefined;
      },
      scaledMs(480_000),
      500,
    );
  const verbose = async (id: string): Promise<SandboxInfo> => {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as SandboxInfo;
  };
  /**
   * 1.5 CPUs and 300 MiB: the clone is grown by a vCPU and virtio-mem, as a pool claim grows a
   * pooled VM. `small`: half a CPU and 64 MiB, which plan the template's own shape (1 vCPU, 256
   * MiB): nothing to grow.
   */
  const runPod = async (
    name: string,
    size: 'grown' | 'small' = 'grown',
  ): Promise<{ id: string; config: Record<string, unknown>; ms: number }> => {
    const base = podConfig(rt, name);
    const resources =
      size === 'grown'
        ? { cpu_period: '100000', cpu_quota: '150000', memory_limit_in_bytes: String(300 * MiB) }
        : { cpu_period: '100000', cpu_quota: '50000', memory_limit_in_bytes: String(64 * MiB) };
    const config = { ...base, hostname: name, linux: { ...(base.linux as Record<string, unknown>), resources } };
    const started = Date.now();
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config }, { deadline: Date.now() + scaledMs(300_000) });
    sandboxes.push(id);
    return { id, config, ms: Date.now() - started };
  };
  const runContainer = async (
    pod: { id: string; config: Record<string, unknown> },
    name: string,
    command: string[],
    mounts: { container_path: string; host_path: string }[] = [],
  ) => {
    const { container_id: id } = await rt.cri.runtime.CreateContainer({
      pod_sandbox_id: pod.id,
      config: { metadata: { name, attempt: 0 }, image: { image }, command, mounts, log_path: `${name}.log` },
      sandbox_config: pod.config,
    });
    await rt.cri.runtime.StartContainer({ container_id: id });
    return id;
  };
  const exec = async (containerId: string, cmd: string[]) =>
    Buffer.from((await rt.cri.runtime.ExecSync({ container_id: containerId, cmd, timeout: 60 })).stdout).toString();
  const cmdline = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  const gone = (file: string) =>
    fsp.access(file).then(
      () => false,
      () => true,
    );

  beforeAll(async () => {
    node = await createNetworkNode();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', 'template', APPLETS);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
      network: node.networkConfig(),
      hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(240_000) },
      // Clones run QEMU unconfined on 7.2 (docs/templates.md): the handler opts out, saying why.
      handlers: {
        'kata-ts': {
          vmmConfinement: { seccomp: true, unprivileged: false, optOutReason: 'templates: clones map the RAM file read-write on QEMU 7.2' },
        },
      },
      templates: { handlers: ['kata-ts'], root },
    });
    await allowLoopbackRegistries(rt);
    await pullThenMoveIntoNode(rt, image, node.netnsPath);
  }, scaledMs(300_000));

  afterAll(async () => {
    if (rt !== undefined) {
      for (const id of sandboxes)
        await Promise.resolve()
          .then(() => rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }))
          .catch(() => undefined);
      const keep = process.env.KATA_TS_KEEP_DAEMON_LOG;
      if (keep !== undefined) await fsp.copyFile(rt.logFile, keep).catch(() => undefined);
      // A template VM of a build the daemon did not finish: ours by its sockets in our state dir.
      await rt.stop().catch(() => undefined);
      for (const pid of await qemuPidsUsing(templateBuildRoot(rt.stateDir)).catch(() => [])) {
        const stat = readProcStat(pid);
        if (stat !== undefined && isSameLiveProcess(pid, stat.startTimeTicks)) process.kill(pid, 'SIGKILL');
      }
      await rt.cleanup();
    }
    await node?.cleanup(sandboxes.map(netnsNameFor));
    await registry?.stop();
    await fsp.rm(root, { recursive: true, force: true });
    console.log(`TEMPLATE_POD_NUMBERS ${JSON.stringify(numbers)}`);
  }, scaledMs(180_000));

  let cloneA: { id: string; config: Record<string, unknown> };
  /** The template's RAM file as built: no clone may change it (a discard once punched holes in it). */
  let ramSha256 = '';
  const ramFileSha256 = async () =>
    createHash('sha256')
      .update(await fsp.readFile(path.join(root, templateName, 'ram')))
      .digest('hex');
  let webA = '';
  let templateName = '';
  const volume = () => path.join(rt.dir, 'volume');

  it(
    "builds the handler's template in the background once the daemon runs; Status shows it; no build VM is left",
    async () => {
      const s = await waitTemplate('the template to be built', (t) => t.phase === 'ready');
      templateName = s.templateName!;
      numbers.buildMs = s.buildMs ?? -1;
      expect(templateName).toMatch(/^[0-9a-f]{16}-[0-9a-f]{16}$/);
      expect(await fsp.readdir(root)).toEqual([templateName]);
      expect((await fsp.readdir(path.join(root, templateName))).sort()).toEqual(['ram', 'state', 'template.json']);
      expect(await qemuPidsUsing(templateBuildRoot(rt.stateDir))).toEqual([]);
      // The template VM ran the warm-up pod (src/runtime/pool/warm.ts) through every step before its save.
      const warmed = (await rt.logLines()).find((l) => l.msg === 'template VM warmed up');
      expect(warmed?.failed).toBeUndefined();
      expect(Object.keys((warmed?.steps ?? {}) as object)).toEqual([...WARM_UP_STEPS]);
      ramSha256 = await ramFileSha256();
    },
    scaledMs(540_000),
  );

  it(
    'a pod starts as a clone: QEMU restored from the template, its container runs from the 9p share, serves a host file on the pod IP and writes one back',
    async () => {
      await fsp.mkdir(volume(), { recursive: true });
      await fsp.writeFile(path.join(volume(), 'index.html'), 'hello-from-the-host\n');
      const a = await runPod('clone-a');
      cloneA = a;
      numbers.clonePodMs = a.ms;
      const info = await verbose(a.id);
      expect(info.origin).toMatchObject({ kind: 'template', templateName });
      numbers.cloneReadyMs = info.origin?.cloneReadyMs ?? -1;
      // Grown like a pooled VM: 2 vCPUs for 1.5 CPUs (the template has 1).
      expect(info.guest.vcpus).toBe(2);
      const argv = cmdline(info.pid);
      expect(argv).toContain('-incoming');
      expect(argv.some((a) => a.includes(`mem-path=${path.join(root, templateName, 'ram')}`) && a.includes('share=off'))).toBe(true);
      // No virtiofsd: the clone's own QEMU serves the shared dir over 9p.
      expect(argv.some((a) => a.startsWith('local,id=shared9p,'))).toBe(true);
      const { status } = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: a.id });
      expect(status!.state).toBe('SANDBOX_READY');
      const ip = status!.network!.ip;
      expect(ip.startsWith(`${node.prefix}.`)).toBe(true);
      webA = await runContainer(
        a,
        'web',
        ['httpd', '-f', '-p', String(HTTP_PORT), '-h', '/www'],
        [{ container_path: '/www', host_path: volume() }],
      );
      const body = await until(
        'the cloned pod to answer from the node namespace',
        async () => {
          const out = await node.httpGet(`http://${ip}:${HTTP_PORT}/`).catch(() => '');
          return out.includes('hello-from-the-host') ? out : undefined;
        },
        scaledMs(120_000),
        250,
      );
      expect(body.trim()).toBe('hello-from-the-host');
      await exec(webA, ['sh', '-c', 'echo written-in-the-clone > /www/from-guest']);
      expect(await fsp.readFile(path.join(volume(), 'from-guest'), 'utf8')).toBe('written-in-the-clone\n');
    },
    scaledMs(420_000),
  );

  let cloneB: { id: string; config: Record<string, unknown>; ms: number };

  it(
    "a second clone shares the template's pages with the first",
    async () => {
      // B plans the template's own shape. Its guest sends no size report (nothing changes), so the
      // claim takes the template's: before, it waited for one for half the ready budget and B
      // booted cold (GUEST_REPORT_TIMEOUT).
      cloneB = await runPod('clone-b', 'small');
      numbers.clonePodBMs = cloneB.ms;
      const b = await verbose(cloneB.id);
      expect(b.origin).toMatchObject({ kind: 'template', templateName });
      const built = JSON.parse(await fsp.readFile(path.join(root, templateName, 'template.json'), 'utf8')) as {
        guest: { vcpus: number; memoryKiB: number };
      };
      expect(b.guest).toEqual({ vcpus: built.guest.vcpus, memoryKiB: built.guest.memoryKiB });
      await runContainer(cloneB, 'idle', ['sleep', '3600']);
      const a = await verbose(cloneA.id);
      // A was grown (300 MiB + the guest's overhead): its record holds the report after the growth.
      expect(a.guest.vcpus).toBe(2);
      expect(a.guest.memoryKiB).toBeGreaterThan(built.guest.memoryKiB + 128 * 1024);
      const ram = path.join(root, templateName, 'ram');
      for (const [name, pid] of [
        ['A', a.pid],
        ['B', b.pid],
      ] as const) {
        const m = mappingKiB(pid, ram);
        numbers[`ramRss${name}KiB`] = m.rssKiB;
        numbers[`ramPss${name}KiB`] = m.pssKiB;
        expect(m.rssKiB).toBeGreaterThan(0);
        // Pages both map from the file count half in each: shared, not copied.
        expect(m.pssKiB).toBeLessThan(m.rssKiB);
      }
      expect((await templateStatus()).clones).toBe(2);
      // Two clones booted containers, served and wrote files, and freed memory: the file they share is as built.
      expect(await ramFileSha256()).toBe(ramSha256);
    },
    scaledMs(420_000),
  );

  it(
    'a daemon restart finds both clones READY and exec works in them; the template is not rebuilt',
    async () => {
      const pids = [(await verbose(cloneA.id)).pid, (await verbose(cloneB.id)).pid];
      await rt.restart();
      for (const id of [cloneA.id, cloneB.id]) {
        expect((await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id })).status?.state).toBe('SANDBOX_READY');
      }
      expect([(await verbose(cloneA.id)).pid, (await verbose(cloneB.id)).pid]).toEqual(pids);
      const out = await until('exec in the clone after the restart', async () =>
        exec(webA, ['cat', '/www/from-guest']).catch(() => undefined),
      );
      expect(out).toBe('written-in-the-clone\n');
      const s = await waitTemplate('the template to be verified again', (t) => t.phase === 'ready');
      expect(s.templateName).toBe(templateName);
    },
    scaledMs(300_000),
  );

  it(
    'an altered template is never used: the pod boots cold saying why, nothing of the clone is left, the template is rebuilt and pods clone again',
    async () => {
      // One byte of the device state flipped (root may write the 0444 file): its sha256 no longer matches.
      const stateFile = path.join(root, templateName, 'state');
      const handle = await fsp.open(stateFile, 'r+');
      try {
        const byte = Buffer.alloc(1);
        await handle.read(byte, 0, 1, 100);
        byte[0] = byte[0]! ^ 0xff;
        await handle.write(byte, 0, 1, 100);
      } finally {
        await handle.close();
      }
      const qemusBefore = new Set(await qemuPidsUsing(rt.stateDir));
      // The rebuild's VM (in the build root) starts at the miss and runs beside the cold pod.
      const pods = async () => {
        const building = new Set(await qemuPidsUsing(templateBuildRoot(rt.stateDir)));
        return (await qemuPidsUsing(rt.stateDir)).filter((p) => !building.has(p));
      };
      const cold = await runPod('cold');
      numbers.coldPodMs = cold.ms;
      const info = await verbose(cold.id);
      expect(info.origin?.kind).toBe('cold');
      expect(info.origin?.templateMiss?.reason).toBe('TEMPLATE_STATE_CORRUPT');
      // The only new QEMU is the cold pod's (the failed clone's is gone), and it is no clone.
      const qemusNow = (await pods()).filter((p) => !qemusBefore.has(p));
      expect(qemusNow).toEqual([info.pid]);
      expect(cmdline(info.pid)).not.toContain('-incoming');
      const rebuilt = await waitTemplate('the template to be rebuilt', (t) => t.phase === 'ready' && t.misses >= 1);
      expect(rebuilt.lastMiss?.reason).toBe('TEMPLATE_STATE_CORRUPT');
      const again = await runPod('clone-c');
      expect((await verbose(again.id)).origin?.kind).toBe('template');
    },
    scaledMs(900_000),
  );

  it(
    'removing the pods leaves no QEMU, namespace, cgroup or work dir; the template stays',
    async () => {
      const held: { id: string; pid: number; startTicks: number; cgroup: string }[] = [];
      for (const id of sandboxes) {
        const info = await verbose(id);
        const startTicks = readProcStat(info.pid)?.startTimeTicks ?? -1;
        held.push({ id, pid: info.pid, startTicks, cgroup: String(info.cgroup['cgroupPath.cpu']) });
      }
      for (const { id } of held) {
        await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
        await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
      }
      for (const { id, pid, startTicks, cgroup } of held) {
        expect(isSameLiveProcess(pid, startTicks)).toBe(false);
        expect(await gone(path.join('/run/netns', netnsNameFor(id)))).toBe(true);
        expect(await gone(cgroup)).toBe(true);
      }
      expect(await qemuPidsUsing(rt.stateDir)).toEqual([]);
      expect(await fsp.readdir(root)).toHaveLength(1);
    },
    scaledMs(300_000),
  );
});
