/**
 * Boot overhead: RunPodSandbox-to-ready through the CRI socket of a real `kata-ts serve`, side by
 * side with a bare QEMU started by the bench with the runtime's own argv for an identical pod and
 * timed to the same KATA_TS_READY line. Rounds alternate which goes first, so machine noise hits
 * both alike; the result is the ratio of the medians (goal: runtime under 1.10x bare). Then the
 * daemon's resident memory with 0, 1, 2, 3 sandboxes running, and the per-sandbox slope.
 *
 *   node --import tsx bench/boot.ts [--rounds N] [--bare-mode direct|paused] [--rss-pods N] [--json]
 */
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { type BareMode, bareArgv, bootBare, normalizedArgv } from './lib/bare-qemu.js';
import { type BootBenchResult, formatBootReport, type RoundSample } from './lib/boot-report.js';
import { currentCommit } from './lib/commit.js';
import { type BenchDaemon, benchPodConfig, createBenchDaemon } from './lib/daemon.js';
import { linearFit, median, readVmRssKiB, sampledVmRssKiB, sleep } from './lib/proc.js';

export interface BootBenchOptions {
  rounds: number;
  bareMode: BareMode;
  /** How many sandboxes the memory phase runs at most (readings at 0..rssPods). */
  rssPods: number;
  readyTimeoutMs: number;
  /** Progress lines (stderr by default). */
  progress(line: string): void;
}

/** The parts of PodSandboxStatus verbose info the bench reads. */
interface SandboxInfo {
  pid: number;
  workDir: string;
  /** A confined QEMU's files are in its VMM dir (the default handler): the dir the argv names. */
  confinement: { vmmDir: string | null } | null;
  accel: { accel: string; reason?: string };
  cgroup: Record<string, string>;
  shape: { vcpus: number; maxVcpus: number; memoryMiB: number; maxMemoryMiB: number };
  guest: { vcpus: number; memoryKiB: number } | null;
  plan: { source: string; qemu: { binary: string; argv: string[] } };
}

/** SIGKILL one of our own QEMU children; until we reap it its pid cannot belong to anyone else. */
function killChild(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone
  }
}

/** Everything the bench started and has not yet torn down, for cleanup whatever happens. */
class Live {
  readonly sandboxes = new Set<string>();
  readonly barePids = new Set<number>();
}

async function runPod(daemon: BenchDaemon, live: Live, name: string): Promise<{ id: string; ms: number }> {
  const config = benchPodConfig(daemon, name, { app: name, 'kata-ts.dev/bench': 'boot' });
  const t0 = performance.now();
  const { pod_sandbox_id: id } = await daemon.cri.runtime.RunPodSandbox({
    config,
    runtime_handler: 'kata-ts',
  });
  const ms = performance.now() - t0;
  live.sandboxes.add(id);
  return { id, ms };
}

async function sandboxInfo(daemon: BenchDaemon, id: string): Promise<SandboxInfo> {
  const res = await daemon.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
  const text = res.info.info;
  if (text === undefined) throw new Error(`PodSandboxStatus of ${id} has no verbose info`);
  return JSON.parse(text) as SandboxInfo;
}

async function removePod(daemon: BenchDaemon, live: Live, id: string): Promise<void> {
  await daemon.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
  await daemon.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
  live.sandboxes.delete(id);
}

export async function runBootBench(options: BootBenchOptions): Promise<BootBenchResult> {
  const { progress } = options;
  await ensureGuestAssets();
  const daemon = await createBenchDaemon();
  const live = new Live();
  // One teardown, shared by the normal path, a failure and a signal: whoever comes second waits
  // for the first instead of racing it (or letting the process exit half-way).
  let teardownPromise: Promise<void> | undefined;
  const teardown = (): Promise<void> =>
    (teardownPromise ??= (async () => {
      for (const pid of live.barePids) killChild(pid);
      for (const id of live.sandboxes)
        await removePod(daemon, live, id).catch((err: Error) => progress(`cleanup: sandbox ${id}: ${err.message}`));
      // Also catches a sandbox or bare QEMU started while the lines above ran: everything this run
      // started names a path inside daemon.dir or sits in its private cgroups.
      await daemon.cleanup();
    })());
  const onSignal = (signal: NodeJS.Signals): void => {
    progress(`${signal}: cleaning up`);
    void teardown().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const loadBefore = os.loadavg()[0]!;
    await daemon.start();
    const daemonPid = daemon.pid();
    const freshRssKiB = await sampledVmRssKiB(daemonPid);

    // Warm-up: the first RunPodSandbox loads code paths and the guest files into the page cache.
    // Its argv is the template of every bare boot.
    progress('warm-up: one runtime boot (not counted); its argv is the bare baseline');
    const warm = await runPod(daemon, live, 'bench-warmup');
    const info = await sandboxInfo(daemon, warm.id);
    if (info.guest === null) throw new Error('warm-up sandbox has no guest report');
    const template = { binary: info.plan.qemu.binary, argv: info.plan.qemu.argv, workDir: info.confinement?.vmmDir ?? info.workDir };
    const templateNorm = JSON.stringify(normalizedArgv(template.argv, template.workDir));
    const guest = info.guest;
    await removePod(daemon, live, warm.id);

    const samples: RoundSample[] = [];
    for (let r = 0; r < options.rounds; r++) {
      const runtimeFirst = r % 2 === 0;
      const sample: Partial<RoundSample> = { round: r + 1, first: runtimeFirst ? 'runtime' : 'bare' };
      const runtime = async (): Promise<void> => {
        const { id, ms } = await runPod(daemon, live, `bench-${r + 1}`);
        const i = await sandboxInfo(daemon, id);
        sample.runtimeMs = ms;
        sample.runtimeQemuRssKiB = readVmRssKiB(i.pid);
        // Same pod, same plan: only the identity parts of the argv may differ from the template.
        if (JSON.stringify(normalizedArgv(i.plan.qemu.argv, i.confinement?.vmmDir ?? i.workDir)) !== templateNorm)
          throw new Error(`round ${r + 1}: the runtime's argv differs from the template`);
        await removePod(daemon, live, id);
      };
      const bare = async (): Promise<void> => {
        const dir = path.join(daemon.dir, `bare-${r + 1}`);
        const boot = await bootBare({
          qemuBinary: template.binary,
          argv: bareArgv(template.argv, template.workDir, dir, options.bareMode),
          dir,
          mode: options.bareMode,
          readyTimeoutMs: options.readyTimeoutMs,
          onSpawn: (pid) => {
            live.barePids.add(pid);
            if (teardownPromise !== undefined) killChild(pid); // spawned after teardown began
          },
        });
        sample.bareMs = boot.readyMs;
        sample.bareQemuRssKiB = boot.qemuRssKiB;
        if (boot.report.vcpus !== guest.vcpus || boot.report.memoryKiB !== guest.memoryKiB) {
          throw new Error(
            `round ${r + 1}: the bare guest reports ${boot.report.vcpus} vCPUs / ${boot.report.memoryKiB} KiB, the runtime's ${guest.vcpus} / ${guest.memoryKiB}`,
          );
        }
        await boot.stop();
        live.barePids.delete(boot.pid);
      };
      for (const step of runtimeFirst ? [runtime, bare] : [bare, runtime]) await step();
      const done = sample as RoundSample;
      samples.push(done);
      progress(
        `round ${done.round}/${options.rounds}: runtime ${done.runtimeMs.toFixed(0)} ms, bare ${done.bareMs.toFixed(0)} ms, ratio ${(done.runtimeMs / done.bareMs).toFixed(3)}`,
      );
    }

    // Memory: the daemon's RSS with 0..N sandboxes running, each reading after the boot settled.
    progress(`memory: daemon VmRSS with 0..${options.rssPods} sandboxes running`);
    const rssBySandboxesKiB = [await sampledVmRssKiB(daemonPid)];
    const runningQemuRssKiB: number[] = [];
    const running: string[] = [];
    for (let k = 1; k <= options.rssPods; k++) {
      const { id } = await runPod(daemon, live, `bench-rss-${k}`);
      running.push(id);
      await sleep(1000);
      rssBySandboxesKiB.push(await sampledVmRssKiB(daemonPid));
      progress(`memory: ${k} running, daemon VmRSS ${rssBySandboxesKiB.at(-1)} KiB`);
    }
    for (const id of running) {
      const rss = readVmRssKiB((await sandboxInfo(daemon, id)).pid);
      if (rss !== undefined) runningQemuRssKiB.push(rss);
    }
    await Promise.all(running.map((id) => removePod(daemon, live, id)));

    const runtimeMs = samples.map((s) => s.runtimeMs);
    const bareMs = samples.map((s) => s.bareMs);
    const ratio = median(runtimeMs) / median(bareMs);
    const fit = linearFit(rssBySandboxesKiB.map((kib, n) => [n, kib] as const));
    return {
      bench: 'boot',
      date: new Date().toISOString(),
      commit: currentCommit(),
      host: { cpus: os.cpus().length, accel: info.accel.accel, loadavg1Before: loadBefore, loadavg1After: os.loadavg()[0]! },
      bareMode: options.bareMode,
      pod: {
        source: info.plan.source,
        vcpus: info.shape.vcpus,
        maxVcpus: info.shape.maxVcpus,
        memoryMiB: info.shape.memoryMiB,
        maxMemoryMiB: info.shape.maxMemoryMiB,
        guestVcpus: guest.vcpus,
        guestMemoryKiB: guest.memoryKiB,
      },
      placement: {
        cpuQuotaMillicores: Number(info.cgroup.cpuQuotaMillicores ?? 0),
        memoryLimitBytes: Number(info.cgroup.memoryLimitBytes ?? 0),
      },
      warmupRuntimeMs: warm.ms,
      rounds: samples,
      medianRuntimeMs: median(runtimeMs),
      medianBareMs: median(bareMs),
      ratio,
      medianRoundRatio: median(samples.map((s) => s.runtimeMs / s.bareMs)),
      overheadPct: (ratio - 1) * 100,
      goalMet: ratio < 1.1,
      memory: {
        daemonFreshRssKiB: freshRssKiB,
        daemonRssBySandboxesKiB: rssBySandboxesKiB,
        incrementsKiB: rssBySandboxesKiB.slice(1).map((kib, i) => kib - rssBySandboxesKiB[i]!),
        slopeKiBPerSandbox: fit.slope,
        baselineKiB: fit.intercept,
        qemuRssKiB: {
          runtimeAtReady: samples.map((s) => s.runtimeQemuRssKiB ?? null),
          bareAtReady: samples.map((s) => s.bareQemuRssKiB ?? null),
          running: runningQemuRssKiB,
        },
      },
    };
  } finally {
    await teardown();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

function positiveInt(text: string | undefined, fallback: number, name: string): number {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`--${name} must be a whole number of at least 1, not ${JSON.stringify(text)}`);
  return n;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string' },
      'bare-mode': { type: 'string' },
      'rss-pods': { type: 'string' },
      'ready-timeout-ms': { type: 'string' },
      json: { type: 'boolean' },
    },
  });
  const bareMode = values['bare-mode'] ?? 'direct';
  if (bareMode !== 'direct' && bareMode !== 'paused')
    throw new Error(`--bare-mode must be direct or paused, not ${JSON.stringify(bareMode)}`);
  let result: BootBenchResult;
  try {
    result = await runBootBench({
      rounds: positiveInt(values.rounds, 5, 'rounds'),
      bareMode,
      rssPods: positiveInt(values['rss-pods'], 3, 'rss-pods'),
      readyTimeoutMs: positiveInt(values['ready-timeout-ms'], 90_000, 'ready-timeout-ms'),
      progress: (line) => process.stderr.write(`[boot] ${line}\n`),
    });
  } catch (err) {
    // Everything was torn down by now (runBootBench's finally); say why and fail.
    console.error(`boot bench failed: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  }
  if (values.json !== true) console.log(formatBootReport(result));
  console.log(JSON.stringify(result));
}
