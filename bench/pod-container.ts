/**
 * A pod with its first container, side by side with a bare QEMU, and what containers cost in
 * memory, in one run:
 *
 * 1. **pod + first container start** through the CRI (RunPodSandbox + CreateContainer +
 *    StartContainer, until StartContainer answers: crun started the workload in the guest)
 *    against a bare `qemu-system-x86_64` running the runtime's own argv for the same pod (same
 *    kernel, initramfs, guest image, sizes; taken from a warm-up pod's verbose status, as
 *    bench/boot.ts does) until the guest's `KATA_TS_READY` line. The bare guest starts no
 *    container: the ratio charges the runtime for the daemon, the agent's start and the container
 *    start (snapshot, share, crun create + start). Rounds alternate which goes first.
 * 2. **guest memory of the agent**, read inside the guest (a probe container in the guest's root
 *    PID namespace reads /proc): the agent's VmRSS (node), the reapers' VmRSS (one per container),
 *    and the guest's MemTotal - MemAvailable, with N containers running.
 * 3. **daemon RSS per container**: the daemon's VmRSS with 0, 1, ..., N containers running in one
 *    pod (median of 5 readings each), and the least-squares slope.
 *
 *   node --import tsx bench/pod-container.ts [--rounds N] [--containers N] [--json]
 */

import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { startVirtiofsd } from '../src/hypervisor/virtiofsd.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { bareArgv, bootBare, killBareQemus, msToFirstBytes } from './lib/bare-qemu.js';
import { benchPodConfig, createBenchDaemon } from './lib/daemon.js';
import { linearFit, median, sampledVmRssKiB, sleep } from './lib/proc.js';

export interface PodContainerBenchResult {
  bench: 'pod-container';
  date: string;
  loadavg1: [number, number];
  /** runtimeMs is RunPodSandbox (podMs) + CreateContainer and StartContainer. */
  rounds: Array<{ first: 'runtime' | 'bare'; runtimeMs: number; podMs: number; bareMs: number; bareAgentMs: number }>;
  medianRuntimeMs: number;
  medianBareMs: number;
  ratio: number;
  guest: { containers: number; agentRssKiB: number; reapersRssKiB: number; reapers: number; guestUsedKiB: number };
  daemonRssByContainersKiB: number[];
  slopeKiBPerContainer: number;
}

// Reads, inside the guest, the agent's and the reapers' VmRSS and the guest's used memory, with
// shell builtins only (a fork per /proc entry takes minutes under TCG). `read` drops the NULs of
// a cmdline; the patterns are written so that they do not match this shell's own command line.
const PROBE = [
  'cd /proc; a=0; r=0; n=0; t=0; f=0',
  'rss() { v=0; while read -r k x _; do if [ "$k" = VmRSS: ]; then v=$x; fi; done < $1/status; }',
  'for p in [0-9]*; do c=; read -r c < $p/cmdline 2>/dev/null',
  'case "$c" in *kata-ts/agent[.]*) rss $p; a=$v;; *kata-ts-reape[r]*) rss $p; r=$((r + v)); n=$((n + 1));; esac; done',
  'while read -r k x _; do case $k in MemTotal:) t=$x;; MemAvailable:) f=$x;; esac; done < meminfo',
  'echo $a $r $n $((t - f))',
].join('; ');

/** The runtime's ids of the virtio-fs and agent chardevs (src/hypervisor/argv.ts). */
const VIRTIOFS_CHARDEV = 'virtiofs';
const AGENT_CHARDEV = 'agent';

export async function runPodContainerBench(
  rounds: number,
  containers: number,
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<PodContainerBenchResult> {
  await ensureGuestAssets();
  const registry = await startRegistry();
  // The handlers' defaults (the VMM budget holds TCG's bounded translation cache since it is planned).
  const rt = await createBenchDaemon();
  const barePids = new Set<number>();
  try {
    const image = await pushBusyboxImage(registry, 'bench/busybox', '1.0', ['sleep']);
    await allowLoopbackRegistries(rt);
    const loadBefore = os.loadavg()[0]!;
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });

    let n = 0;
    const startContainer = async (sid: string, sandboxConfig: object, extra: Record<string, unknown> = {}) => {
      const name = `c${n++}`;
      const { container_id: id } = await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: { metadata: { name, attempt: 0 }, image: { image }, command: ['sleep', '100000'], ...extra },
        sandbox_config: sandboxConfig,
      });
      await rt.cri.runtime.StartContainer({ container_id: id });
      return id;
    };
    const podWithContainer = async (name: string) => {
      const config = benchPodConfig(rt, name);
      const t0 = performance.now();
      const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config });
      const podMs = performance.now() - t0;
      await startContainer(sid, config);
      return { sid, config, podMs, ms: performance.now() - t0 };
    };
    const removePod = async (sid: string) => {
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    };

    progress('warm-up: one pod with a container (not counted); its argv is the bare baseline');
    const warm = await podWithContainer('warm');
    const info = JSON.parse((await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: warm.sid, verbose: true })).info.info!) as {
      workDir: string;
      confinement: { vmmDir: string | null } | null;
      plan: { qemu: { binary: string; argv: string[] } };
    };
    await removePod(warm.sid);

    const samples: PodContainerBenchResult['rounds'] = [];
    for (let r = 0; r < rounds; r++) {
      const first = r % 2 === 0 ? 'runtime' : 'bare';
      const s = { first, runtimeMs: 0, podMs: 0, bareMs: 0, bareAgentMs: 0 } as PodContainerBenchResult['rounds'][number];
      const runtime = async () => {
        const pod = await podWithContainer(`round-${r}`);
        s.runtimeMs = pod.ms;
        s.podMs = pod.podMs;
        await removePod(pod.sid);
      };
      const bare = async () => {
        const dir = path.join(rt.dir, `bare-${r}`);
        const shared = path.join(rt.dir, `bare-${r}-shared`);
        await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
        await fsp.mkdir(shared, { recursive: true });
        // The argv has a vhost-user-fs device: QEMU needs its virtiofsd listening, as the runtime
        // starts one per pod. Its start counts in the bare time.
        const socketPath = path.join(dir, 'vfs.sock');
        const argv = bareArgv(info.plan.qemu.argv, info.confinement?.vmmDir ?? info.workDir, dir, 'direct').map((a) =>
          a.startsWith(`socket,id=${VIRTIOFS_CHARDEV},path=`) ? `socket,id=${VIRTIOFS_CHARDEV},path=${socketPath}` : a,
        );
        const t0 = performance.now();
        const vfs = await startVirtiofsd({
          socketPath,
          sourceDir: shared,
          logFile: path.join(rt.dir, `bare-${r}-virtiofsd.log`),
          logger: silentLogger(),
        });
        const vfsMs = performance.now() - t0;
        // The agent's first bytes on its port (its channel announce): the guest's agent runs.
        const agentSocket = argv
          .find((a) => a.startsWith(`socket,id=${AGENT_CHARDEV},path=`))
          ?.split('path=')[1]
          ?.split(',')[0];
        const bootT0 = performance.now();
        const agentUp = agentSocket === undefined ? Promise.resolve(Number.NaN) : msToFirstBytes(agentSocket, bootT0, 180_000);
        try {
          const boot = await bootBare({
            qemuBinary: info.plan.qemu.binary,
            argv,
            dir,
            mode: 'direct',
            readyTimeoutMs: 180_000,
            onSpawn: (pid) => barePids.add(pid),
          });
          s.bareMs = vfsMs + boot.readyMs;
          s.bareAgentMs = vfsMs + (await agentUp);
          await boot.stop();
          barePids.delete(boot.pid);
        } finally {
          await vfs.stop();
        }
      };
      for (const step of first === 'runtime' ? [runtime, bare] : [bare, runtime]) await step();
      samples.push(s);
      progress(`round ${r + 1}/${rounds}: pod+container ${s.runtimeMs.toFixed(0)} ms, bare ${s.bareMs.toFixed(0)} ms`);
    }

    // Memory: one pod, 0..N containers; then the probe reads the guest side.
    const config = benchPodConfig(rt, 'memory');
    const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config });
    const daemonPid = rt.pid();
    await sleep(1000);
    const rss = [await sampledVmRssKiB(daemonPid)];
    for (let k = 1; k <= containers; k++) {
      await startContainer(sid, config);
      await sleep(1000);
      rss.push(await sampledVmRssKiB(daemonPid));
      progress(`memory: ${k} containers, daemon VmRSS ${rss.at(-1)} KiB`);
    }
    const probe = await startContainer(sid, config, { linux: { security_context: { namespace_options: { pid: 'NODE' } } } });
    const out = await rt.cri.runtime.ExecSync({
      container_id: probe,
      cmd: ['sh', '-c', PROBE],
      timeout: 60,
    });
    const [agentRssKiB, reapersRssKiB, reapers, guestUsedKiB] = out.stdout.toString().trim().split(' ').map(Number);
    await removePod(sid);
    const ms = (k: 'runtimeMs' | 'bareMs') => median(samples.map((x) => x[k]));
    return {
      bench: 'pod-container',
      date: new Date().toISOString(),
      loadavg1: [loadBefore, os.loadavg()[0]!],
      rounds: samples,
      medianRuntimeMs: ms('runtimeMs'),
      medianBareMs: ms('bareMs'),
      ratio: ms('runtimeMs') / ms('bareMs'),
      guest: {
        containers: containers + 1,
        agentRssKiB: agentRssKiB!,
        reapersRssKiB: reapersRssKiB!,
        reapers: reapers!,
        guestUsedKiB: guestUsedKiB!,
      },
      daemonRssByContainersKiB: rss,
      slopeKiBPerContainer: linearFit(rss.map((kib, i) => [i, kib] as const)).slope,
    };
  } finally {
    killBareQemus(barePids);
    await rt.cleanup();
    await registry.stop();
  }
}

export function formatPodContainerReport(r: PodContainerBenchResult): string {
  const mib = (kib: number) => `${(kib / 1024).toFixed(1)} MiB`;
  return [
    `pod + first container against a bare QEMU of the same argv (${r.rounds.length} rounds, alternating; load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
    ...r.rounds.map(
      (s, i) =>
        `  round ${i + 1} (${s.first} first): pod+container ${s.runtimeMs.toFixed(0)} ms (RunPodSandbox ${s.podMs.toFixed(0)}), bare ${s.bareMs.toFixed(0)} ms`,
    ),
    `  bare to the agent's first bytes on its port: median ${median(r.rounds.map((s) => s.bareAgentMs)).toFixed(0)} ms; ratio pod+container / that ${(r.medianRuntimeMs / median(r.rounds.map((s) => s.bareAgentMs))).toFixed(3)}`,
    `  median RunPodSandbox alone ${median(r.rounds.map((s) => s.podMs)).toFixed(0)} ms: ratio to bare ${(median(r.rounds.map((s) => s.podMs)) / r.medianBareMs).toFixed(3)}`,
    `  median: pod+container ${r.medianRuntimeMs.toFixed(0)} ms, bare to ready ${r.medianBareMs.toFixed(0)} ms, ratio ${r.ratio.toFixed(3)} (goal <= 1.15: ${r.ratio <= 1.15 ? 'met' : 'not met'})`,
    `guest, ${r.guest.containers} containers running: agent VmRSS ${mib(r.guest.agentRssKiB)}, ${r.guest.reapers} reapers ${mib(r.guest.reapersRssKiB)} together, guest memory used ${mib(r.guest.guestUsedKiB)}`,
    `daemon VmRSS with 0..${r.daemonRssByContainersKiB.length - 1} containers: ${r.daemonRssByContainersKiB.map(mib).join(' / ')}; per container (slope) ${(r.slopeKiBPerContainer / 1024).toFixed(2)} MiB`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      containers: { type: 'string', default: '4' },
      json: { type: 'boolean', default: false },
    },
  });
  const result = await runPodContainerBench(Number(values.rounds), Number(values.containers));
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatPodContainerReport(result)}\n`);
}
