/**
 * kata-ts's shim v2 face measured side by side with its other front door and with runc, in one run:
 *
 * 1. **pod + first container**: RunPodSandbox + CreateContainer + StartContainer until the
 *    container's first output line is in its CRI log, through
 *    (a) containerd 1.6.20 + kata-ts's shim (`containerd-shim-kata-ts-v2`, the compiled dist/ when
 *        it is fresh, else the sources through tsx: the output says which),
 *    (b) the standalone kata-ts daemon (`kata-ts serve`, its own CRI), and
 *    (c) the same containerd + runc;
 *    rounds rotate which goes first; medians; ratios shim / standalone (goal <= 1.10) and
 *    shim / runc. One warm-up of each is not counted.
 * 2. **the shim's memory per pod**: RSS, PSS and private memory (/proc/<pid>/smaps_rollup) of the
 *    pod's `serve` process (found by its command line: `-id <pod id>` ... `serve`) with the pod
 *    alone (the warm-up pod) and with one container (every shim pod, read after its timing
 *    ended), beside the ~18 MB PSS per pod published for Kata's Go shim and an idle `node`
 *    process (Node's own floor); and the peak RSS and wall time of the `start` and `delete`
 *    invocations (GNU time), read on the warm-up pod.
 *
 * The same busybox image from one loopback registry everywhere. containerd is the private harness
 * of test/helpers/containerd.ts (its own namespaces, cgroups, CNI bridge); the daemon runs in
 * containerd's node network namespace with containerd's own CNI config, so both kata-ts doors pay
 * the same CNI ADD and TAP wiring, and both run the same handler profile and guest.
 *
 *   node --import tsx bench/shim.ts [--rounds N] [--shim-tsx] [--json]
 */

import { execFile, execFileSync, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs, promisify } from 'node:util';
import { packageRoot } from '../src/common/paths.js';
import { netnsNameFor } from '../src/network/wiring.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import {
  type ContainerdHandle,
  type ContainerdStopReport,
  containerdMissing,
  KATA_TS_HANDLER,
  startContainerd,
} from '../test/helpers/containerd.js';
import { type CriClient, criClient } from '../test/helpers/cri-client.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../test/helpers/images-registry.js';
import { DEBIAN_CNI_BIN_DIR } from '../test/helpers/network-node.js';
import { shimTestConfig } from '../test/helpers/shim-config.js';
import { type BenchDaemon, createBenchDaemon } from './lib/daemon.js';
import { median, processArgs, type SmapsRollupKiB, sampledSmapsRollupKiB, sleep } from './lib/proc.js';
import { distStaleness, GNU_TIME, readShimRuns, type ShimCode, type ShimRun, writeShimWrapper } from './lib/shim-binary.js';

const execFileAsync = promisify(execFile);

export const SIDES = ['shim', 'standalone', 'runc'] as const;
export type Side = (typeof SIDES)[number];

/** Kata Containers' Go shim (containerd-shim-kata-v2): its published PSS per pod, in MB. */
export const KATA_GO_SHIM_PSS_MB = 18;
/** The goal for shim / standalone. */
export const GOAL_RATIO = 1.1;
const MARKER = 'kata-ts-bench-ready';
const POD_NAMESPACE = 'kata-ts-bench';

export interface PodTiming {
  /** RunPodSandbox's answer. */
  podMs: number;
  /** StartContainer's answer. */
  startedMs: number;
  /** The container's first output line in its CRI log: the timed end. */
  totalMs: number;
}

export interface ShimBenchResult {
  bench: 'shim';
  date: string;
  commit: string | null;
  loadavg1: [number, number];
  /** Which code the shim ran, and why (dist/ fresh, stale, or --shim-tsx). */
  shimCode: ShimCode;
  shimCodeWhy: string;
  /** QEMU's `-m` and `-smp` of the warm-up pod of each kata-ts door (they must match). */
  vmShape: { shim: string; standalone: string };
  rounds: Array<{ order: Side[] } & Record<Side, PodTiming>>;
  medianMs: Record<Side, number>;
  /** Ratios of the medians. */
  ratioShimStandalone: number;
  ratioShimRunc: number;
  /** shim / standalone within each round (the two boots closest in time), and their median. */
  roundRatios: number[];
  medianRoundRatio: number;
  goalMet: boolean;
  memory: {
    /** The warm-up pod's serve process (smaps_rollup) with the pod alone. */
    podOnlyKiB: SmapsRollupKiB;
    /**
     * Every shim pod's serve process with its one container running (warm-up, then each round's,
     * read after the timing ended), and the median of each field over them.
     */
    oneContainerSamplesKiB: SmapsRollupKiB[];
    oneContainerKiB: SmapsRollupKiB;
    /** An idle `node` process (this node binary), for scale: what Node itself costs. */
    idleNodeKiB: SmapsRollupKiB;
    /** GNU time's peak RSS and wall time of `start` for the sandbox and for the container; null when not measured. */
    invocations: Array<ShimRun & { task: 'sandbox' | 'container' }>;
    invocationsNote: string;
  };
  /** What the bench found left behind (a shim's serve process or state dir after its pod was removed, containerd's stop report). */
  leftovers: string[];
  /**
   * Warnings and errors in containerd's log: the shim's own (its JSON log lines of level warn and
   * above, which containerd copies from the shim's log FIFO), the last few in full; containerd's
   * (`level=warning|error|fatal`), counted by message.
   */
  logProblems: LogProblems;
}

export interface LogProblems {
  shimCount: number;
  shimLast: string[];
  containerd: Array<{ level: string; msg: string; count: number }>;
}

/** The shim's and containerd's warning and error lines in containerd's log. */
export function logProblems(text: string, keep = 10): LogProblems {
  const lines = text.split('\n');
  const shim = lines.filter((l) => l.startsWith('{') && /"level":(4|5|6)0\b/.test(l));
  const counts = new Map<string, { level: string; msg: string; count: number }>();
  for (const l of lines) {
    const m = /level=(warning|error|fatal) msg="((?:[^"\\]|\\.){0,60})/.exec(l);
    if (m === null) continue;
    const key = `${m[1]} ${m[2]}`;
    const entry = counts.get(key) ?? { level: m[1]!, msg: m[2]!, count: 0 };
    entry.count++;
    counts.set(key, entry);
  }
  return {
    shimCount: shim.length,
    shimLast: shim.slice(-keep).map((l) => (l.length > 400 ? `${l.slice(0, 400)}...` : l)),
    containerd: [...counts.values()],
  };
}

/** One front door: where its CRI is, which handler, where pods log and are placed. */
interface Door {
  side: Side;
  cri: CriClient;
  runtimeHandler: string;
  logRoot: string;
  cgroupParent(uid: string): string;
  live: Set<string>;
}

function currentCommit(): string | null {
  try {
    return execFileSync('git', ['rev-parse', '--short=12', 'HEAD'], {
      cwd: packageRoot(),
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return null;
  }
}

/** Pids of a shim's `serve` processes for the pod `sandboxId` (its command line: `-id <id>` ... `serve`). */
export function servePids(sandboxId: string): number[] {
  return processArgs()
    .filter(({ args }) => args.at(-1) === 'serve' && args.some((a, i) => a === '-id' && args[i + 1] === sandboxId))
    .map(({ pid }) => pid);
}

/** `-m X -smp Y` of the QEMU whose command line mentions `needle`. */
function qemuShape(needle: string): string {
  const qemu = processArgs().filter(
    ({ args }) => path.basename(args[0] ?? '').startsWith('qemu-system') && args.some((a) => a.includes(needle)),
  );
  if (qemu.length !== 1) return `(${qemu.length} QEMU processes found)`;
  const args = qemu[0]!.args;
  const arg = (flag: string) => args[args.indexOf(flag) + 1] ?? '?';
  return `-m ${arg('-m')} -smp ${arg('-smp')}`;
}

/** Polls the CRI log until a line carries MARKER. */
async function untilMarker(file: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = await fsp.readFile(file, 'utf8').catch(() => '');
    if (text.includes(MARKER)) return;
    if (Date.now() > deadline)
      throw new Error(`no "${MARKER}" line in ${file} within ${timeoutMs} ms; it holds ${JSON.stringify(text.slice(-300))}`);
    await sleep(10);
  }
}

function medianSmaps(samples: readonly SmapsRollupKiB[]): SmapsRollupKiB {
  const m = (k: keyof SmapsRollupKiB) => median(samples.map((x) => x[k]));
  return { rss: m('rss'), pss: m('pss'), private: m('private'), swap: m('swap') };
}

/** One serve process's memory, read in a running pod with one container. */
async function serveMemory(sid: string): Promise<SmapsRollupKiB> {
  await sleep(2_000);
  const pids = servePids(sid);
  if (pids.length !== 1) throw new Error(`expected one serve process for pod ${sid}, found ${pids.length}`);
  return sampledSmapsRollupKiB(pids[0]!);
}

export async function runShimBench(
  rounds: number,
  options: { forceTsx?: boolean } = {},
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<ShimBenchResult> {
  await ensureGuestAssets();
  const root = packageRoot();
  const stale = options.forceTsx === true ? '--shim-tsx' : distStaleness(root);
  const shimCode: ShimCode = stale === null ? 'dist' : 'tsx';
  const shimCodeWhy =
    stale === null
      ? 'compiled dist/ (fresh: every src/ file built)'
      : stale === '--shim-tsx'
        ? 'the sources through tsx (--shim-tsx)'
        : `the sources through tsx: dist/ is not fresh (${stale}); run \`npm run build\` to bench the compiled shim`;
  progress(`shim code: ${shimCodeWhy}`);

  const leftovers: string[] = [];
  let problems: LogProblems = { shimCount: 0, shimLast: [], containerd: [] };
  let registry: RegistryHandle | undefined;
  let ctrd: ContainerdHandle | undefined;
  let rt: BenchDaemon | undefined;
  let ctrdCri: CriClient | undefined;
  const doors = new Map<Side, Door>();
  // Short: the shim's sockets live under it (<stateRoot>/s/<sha256>) and must fit in 108 bytes.
  const dir = await fsp.mkdtemp('/tmp/ktbs-');
  const stateRoot = path.join(dir, 'shim');
  const peakFlagFile = path.join(dir, 'measure-start');
  const peakFile = path.join(dir, 'start-peaks.txt');

  let teardownPromise: Promise<void> | undefined;
  const teardown = (): Promise<void> =>
    (teardownPromise ??= (async () => {
      for (const door of doors.values()) {
        for (const sid of [...door.live]) {
          await removePod(door, sid).catch((err: Error) => progress(`cleanup: ${door.side} pod ${sid}: ${err.message}`));
        }
      }
      ctrdCri?.close();
      // The daemon lives in containerd's node network namespace: it goes first, or containerd's
      // harness would find it there.
      if (rt !== undefined) {
        await rt.cleanup();
        for (const sid of doors.get('standalone')?.live ?? [])
          await execFileAsync('ip', ['netns', 'del', netnsNameFor(sid)]).catch(() => undefined);
      }
      if (ctrd !== undefined) {
        problems = logProblems(ctrd.logText());
        const report: ContainerdStopReport = await ctrd.stop();
        leftovers.push(...report.strays.map((s) => `after containerd stopped, still running in its tree: ${s}`));
        leftovers.push(...report.leftovers.map((s) => `containerd harness: ${s}`));
      }
      await registry?.stop();
      await fsp.rm(dir, { recursive: true, force: true });
    })());
  const onSignal = (signal: NodeJS.Signals): void => {
    progress(`${signal}: cleaning up`);
    void teardown().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  const shimBin = path.join(root, 'bin', 'containerd-shim-kata-ts-v2');
  /** `pid action` of every shim process running (any pod: one runs at a time). */
  const shimProcesses = () =>
    processArgs()
      .filter(({ args }) => args.includes(shimBin))
      .map(({ pid, args }) => `${pid} ${args.at(-1)}`);

  /**
   * StopPodSandbox + RemovePodSandbox; for a shim pod, then waits for its serve process and state
   * dir to go, and for containerd's background `delete` invocations to end.
   */
  async function removePod(door: Door, sid: string): Promise<void> {
    await door.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
    await door.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    door.live.delete(sid);
    if (door.side !== 'shim') return;
    const podDir = path.join(stateRoot, 'k8s.io', sid.slice(0, 16));
    const deadline = Date.now() + 60_000;
    while ((servePids(sid).length > 0 || existsSync(podDir)) && Date.now() < deadline) await sleep(100);
    const pids = servePids(sid);
    if (pids.length > 0) leftovers.push(`shim pod ${sid.slice(0, 12)}: serve ${pids.join(', ')} still running 60 s after RemovePodSandbox`);
    if (existsSync(podDir)) leftovers.push(`shim pod ${sid.slice(0, 12)}: state dir ${podDir} still there 60 s after RemovePodSandbox`);
    // containerd runs `<shim> delete` for each of the pod's tasks once the shim's connection
    // closed, in the background: those node processes must not overlap the next timed pod.
    while (shimProcesses().length > 0 && Date.now() < deadline + 60_000) await sleep(100);
    const shims = shimProcesses();
    if (shims.length > 0)
      leftovers.push(`shim pod ${sid.slice(0, 12)}: shim processes ${shims.join('; ')} still running after its removal`);
  }

  try {
    registry = await startRegistry();
    const image = await pushBusyboxImage(registry, 'bench/busybox', 'shim', ['sleep']);

    // containerd + kata-ts's shim, beside runc.
    const configPath = path.join(dir, 'kata-ts-shim.json');
    await fsp.writeFile(
      configPath,
      JSON.stringify(
        shimTestConfig(dir, stateRoot, {
          logLevel: 'info',
          // Bound inside the harness's node (a mount namespace that goes with it).
          mountNamespacePath: path.join(dir, 'mntns', 'mnt'),
        }),
      ),
    );
    const binDir = path.join(dir, 'bin');
    await writeShimWrapper({ binDir, root, configPath, code: shimCode, peakFlagFile, peakFile });
    ctrd = await startContainerd({ registry, shimBinDir: binDir });
    ctrdCri = criClient(ctrd.criSocket);
    await ctrdCri.image.PullImage({ image: { image } });
    const ctrdLogs = path.join(dir, 'pods');
    const podParent = (uid: string) => `/kubepods/besteffort/pod${uid}`;
    doors.set('shim', {
      side: 'shim',
      cri: ctrdCri,
      runtimeHandler: KATA_TS_HANDLER,
      logRoot: ctrdLogs,
      cgroupParent: podParent,
      live: new Set(),
    });
    doors.set('runc', { side: 'runc', cri: ctrdCri, runtimeHandler: '', logRoot: ctrdLogs, cgroupParent: podParent, live: new Set() });

    // The standalone daemon, in containerd's node network namespace, on containerd's CNI config.
    rt = await createBenchDaemon(
      { network: { mode: 'cni', cniConfDir: ctrd.cniConfDir, cniBinDirs: [DEBIAN_CNI_BIN_DIR] } },
      { netnsPath: `/proc/${ctrd.nodePid}/ns/net` },
    );
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const daemon = rt;
    doors.set('standalone', {
      side: 'standalone',
      cri: daemon.cri,
      runtimeHandler: '',
      logRoot: path.join(daemon.dir, 'pods'),
      cgroupParent: (uid) => daemon.cgroupParent(uid),
      live: new Set(),
    });

    /** A pod and its first container, timed to the container's first output line. */
    const podWithContainer = async (door: Door, name: string, afterPod?: (sid: string) => Promise<void>) => {
      const uid = randomUUID();
      const logDir = path.join(door.logRoot, `${POD_NAMESPACE}_${name}_${uid}`);
      await fsp.mkdir(logDir, { recursive: true });
      const config = {
        metadata: { name, uid, namespace: POD_NAMESPACE, attempt: 0 },
        log_directory: logDir,
        linux: { cgroup_parent: door.cgroupParent(uid) },
      };
      const deadline = () => ({ deadline: Date.now() + 300_000 });
      const t0 = performance.now();
      const { pod_sandbox_id: sid } = await door.cri.runtime.RunPodSandbox({ config, runtime_handler: door.runtimeHandler }, deadline());
      door.live.add(sid);
      const podMs = performance.now() - t0;
      if (afterPod !== undefined) await afterPod(sid);
      const { container_id: cid } = await door.cri.runtime.CreateContainer(
        {
          pod_sandbox_id: sid,
          config: {
            metadata: { name: 'c', attempt: 0 },
            image: { image },
            command: ['sh', '-c', `echo ${MARKER}; exec sleep 100000`],
            log_path: 'c.log',
          },
          sandbox_config: config,
        },
        deadline(),
      );
      await door.cri.runtime.StartContainer({ container_id: cid }, deadline());
      const startedMs = performance.now() - t0;
      await untilMarker(path.join(logDir, 'c.log'), 120_000);
      return { sid, timing: { podMs, startedMs, totalMs: performance.now() - t0 } };
    };
    const door = (side: Side): Door => doors.get(side)!;

    // Warm-up, not counted: code paths and guest files into the page cache. The shim's warm-up pod
    // is where the pod-alone memory and the start and delete invocations are read.
    progress('warm-up: one pod with a container through each door (not counted)');
    const timeInstalled = existsSync(GNU_TIME);
    if (timeInstalled) await fsp.writeFile(peakFlagFile, '');
    let podOnlyKiB: SmapsRollupKiB | undefined;
    const shimWarm = await podWithContainer(door('shim'), 'warm-shim', async (sid) => {
      const [pid, ...more] = servePids(sid);
      if (pid === undefined || more.length > 0)
        throw new Error(`expected one serve process for pod ${sid}, found ${[pid, ...more].join(', ')}`);
      await sleep(2_000);
      podOnlyKiB = await sampledSmapsRollupKiB(pid);
    });
    const oneContainerSamplesKiB = [await serveMemory(shimWarm.sid)];
    const idleNodeKiB = await idleNodeMemory();
    progress(`warm-up: shim ${formatTiming(shimWarm.timing)}`);
    const shimShape = qemuShape(path.join(stateRoot, 'k8s.io', shimWarm.sid.slice(0, 16)));
    await removePod(door('shim'), shimWarm.sid);
    await fsp.rm(peakFlagFile, { force: true });
    const invocations = (await readShimRuns(peakFile)).map((run) => ({
      ...run,
      task: run.id === shimWarm.sid ? ('sandbox' as const) : ('container' as const),
    }));
    const standaloneWarm = await podWithContainer(door('standalone'), 'warm-standalone');
    const standaloneShape = qemuShape(daemon.stateDir);
    progress(`warm-up: standalone ${formatTiming(standaloneWarm.timing)}`);
    await removePod(door('standalone'), standaloneWarm.sid);
    const runcWarm = await podWithContainer(door('runc'), 'warm-runc');
    progress(`warm-up: runc ${formatTiming(runcWarm.timing)}`);
    await removePod(door('runc'), runcWarm.sid);
    progress(`VM shape: shim ${shimShape}, standalone ${standaloneShape}`);

    const loadBefore = os.loadavg()[0]!;
    const samples: ShimBenchResult['rounds'] = [];
    for (let r = 0; r < rounds; r++) {
      const order = SIDES.map((_, i) => SIDES[(i + r) % SIDES.length]!);
      const sample = { order } as ShimBenchResult['rounds'][number];
      for (const side of order) {
        const pod = await podWithContainer(door(side), `r${r}-${side}`);
        sample[side] = pod.timing;
        if (side === 'shim') oneContainerSamplesKiB.push(await serveMemory(pod.sid));
        await removePod(door(side), pod.sid);
      }
      samples.push(sample);
      progress(`round ${r + 1}/${rounds} (${order.join(', ')}): ${SIDES.map((s) => `${s} ${sample[s].totalMs.toFixed(0)} ms`).join(', ')}`);
    }
    const medianMs = Object.fromEntries(SIDES.map((s) => [s, median(samples.map((x) => x[s].totalMs))])) as Record<Side, number>;
    const ratioShimStandalone = medianMs.shim / medianMs.standalone;
    const roundRatios = samples.map((x) => x.shim.totalMs / x.standalone.totalMs);
    const result: ShimBenchResult = {
      bench: 'shim',
      date: new Date().toISOString(),
      commit: currentCommit(),
      loadavg1: [loadBefore, os.loadavg()[0]!],
      shimCode,
      shimCodeWhy,
      vmShape: { shim: shimShape, standalone: standaloneShape },
      rounds: samples,
      medianMs,
      ratioShimStandalone,
      ratioShimRunc: medianMs.shim / medianMs.runc,
      roundRatios,
      medianRoundRatio: median(roundRatios),
      goalMet: ratioShimStandalone <= GOAL_RATIO,
      memory: {
        podOnlyKiB: podOnlyKiB!,
        oneContainerSamplesKiB,
        oneContainerKiB: medianSmaps(oneContainerSamplesKiB),
        idleNodeKiB,
        invocations,
        invocationsNote: timeInstalled ? 'GNU time, the warm-up pod' : `not measured: ${GNU_TIME} is not installed`,
      },
      leftovers,
      logProblems: problems,
    };
    await teardown();
    result.logProblems = problems;
    return result;
  } finally {
    await teardown();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** `total (pod P, started S)` in ms. */
function formatTiming(p: PodTiming): string {
  return `${p.totalMs.toFixed(0)} ms (RunPodSandbox ${p.podMs.toFixed(0)}, StartContainer answered ${p.startedMs.toFixed(0)})`;
}

/** smaps_rollup of an idle node process (the same binary the shim runs on), after a second of start-up. */
async function idleNodeMemory(): Promise<SmapsRollupKiB> {
  const child = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
  try {
    await sleep(1_000);
    return await sampledSmapsRollupKiB(child.pid!);
  } finally {
    child.kill('SIGKILL');
  }
}

export function formatShimReport(r: ShimBenchResult): string {
  const mib = (kib: number) => `${(kib / 1024).toFixed(1)} MiB`;
  const mem = (m: SmapsRollupKiB) =>
    `RSS ${mib(m.rss)}, PSS ${mib(m.pss)}, private ${mib(m.private)}${m.swap > 0 ? `, swap ${mib(m.swap)}` : ''}`;
  return [
    `pod + first container until its first output line in the CRI log (${r.rounds.length} rounds, order rotating; load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
    `  shim ran ${r.shimCodeWhy}`,
    `  VM shape: shim ${r.vmShape.shim}; standalone ${r.vmShape.standalone}${r.vmShape.shim === r.vmShape.standalone ? ' (same)' : ' (DIFFERENT)'}`,
    ...r.rounds.map(
      (s, i) => `  round ${i + 1} (${s.order.join(', ')}): ${SIDES.map((side) => `${side} ${formatTiming(s[side])}`).join('; ')}`,
    ),
    `  median: shim ${r.medianMs.shim.toFixed(0)} ms, standalone ${r.medianMs.standalone.toFixed(0)} ms, runc ${r.medianMs.runc.toFixed(0)} ms`,
    `  shim / standalone ${r.ratioShimStandalone.toFixed(3)} (goal <= ${GOAL_RATIO.toFixed(2)}: ${r.goalMet ? 'met' : 'not met'}); per round ${r.roundRatios.map((x) => x.toFixed(3)).join(', ')}, their median ${r.medianRoundRatio.toFixed(3)}`,
    `  shim / runc ${r.ratioShimRunc.toFixed(1)}`,
    `the shim's serve process, one per pod (smaps_rollup, median of 5 readings):`,
    `  pod alone:       ${mem(r.memory.podOnlyKiB)}`,
    `  one container:   ${mem(r.memory.oneContainerKiB)} (median of ${r.memory.oneContainerSamplesKiB.length} pods; PSS ${r.memory.oneContainerSamplesKiB.map((m) => (m.pss / 1024).toFixed(1)).join(' / ')} MiB)`,
    `  Kata's Go shim (containerd-shim-kata-v2), published: ~${KATA_GO_SHIM_PSS_MB} MB PSS per pod`,
    `  an idle node process, for scale: ${mem(r.memory.idleNodeKiB)}`,
    `the shim's start and delete invocations (${r.memory.invocationsNote}):${r.memory.invocations.length === 0 ? ' none recorded' : ''}`,
    ...r.memory.invocations.map((run) => `  ${run.action} (${run.task}): peak RSS ${mib(run.maxRssKiB)}, ${run.elapsedMs.toFixed(0)} ms`),
    r.leftovers.length === 0 ? 'left behind: nothing' : `left behind:\n${r.leftovers.map((l) => `  ${l}`).join('\n')}`,
    r.logProblems.shimCount === 0
      ? "the shim's log (through containerd's): no warning or error"
      : `the shim's log (through containerd's): ${r.logProblems.shimCount} warning/error lines, the last ${r.logProblems.shimLast.length}:\n${r.logProblems.shimLast.map((l) => `  ${l}`).join('\n')}`,
    `containerd's own warnings and errors: ${r.logProblems.containerd.length === 0 ? 'none' : r.logProblems.containerd.map((p) => `${p.count}x ${p.level} "${p.msg}"`).join(', ')}`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      'shim-tsx': { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
    },
  });
  const missing = containerdMissing();
  if (missing !== null) {
    process.stderr.write(`bench shim skipped: ${missing}\n`);
    if (values.json) process.stdout.write(`${JSON.stringify({ bench: 'shim', skipped: missing })}\n`);
  } else {
    const result = await runShimBench(Number(values.rounds), { forceTsx: values['shim-tsx'] });
    process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatShimReport(result)}\n`);
  }
}
