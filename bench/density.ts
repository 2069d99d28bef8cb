/**
 * How the cost of a pod grows with the number of pods on the node (issue 35, "curves"): N pods
 * started at once (N = 1, 2, 4, 8 by default), each with a first container, per mode:
 *
 * - **cold**: a standalone `kata-ts serve` with no pool: every pod boots its VM;
 * - **pool**: a fresh `kata-ts serve` whose pool is sized N and full before the burst: every pod
 *   claims a pre-booted VM (each pod's origin is read back from PodSandboxStatus and printed);
 * - **template**: a fresh `kata-ts serve` whose handler clones its VM template
 *   (docs/templates.md), the template built (or, after the first N, verified) before the burst:
 *   every pod is a clone grown to its shape. The handler runs QEMU unconfined (templates need it
 *   on QEMU 7.2), the cold and pool modes confined: the jail's cost is on their side;
 * - **runc**: the same N through the private containerd 1.6.20 of test/helpers/containerd.ts and
 *   runc (as bench/shim.ts does), when containerd is installed;
 * - **bare**: the runtime's own QEMU argv (from a cold warm-up pod, as bench/pool.ts takes it) with
 *   its virtiofsd, started by hand `--bare-n` at once (default 1 and 8), timed to the agent's first
 *   bytes on its port: the point a pod's container can start. The contention baseline.
 *
 * Per pod and N: start latency (RunPodSandbox until the container's first output line is in its
 * CRI log, as bench/shim.ts times it; all N RunPodSandbox calls are sent at once); host memory per
 * idle pod, read IDLE_S after the last pod started: PSS (smaps_rollup) of the pod's QEMU, its
 * virtiofsd, its swtpm when it has one, and every descendant of those, plus the daemon's PSS / N
 * (runc: the pod cgroup's processes and its containerd-shim-runc-v2, plus containerd's PSS / N);
 * and the daemon's CPU time per pod: utime + stime of the daemon process (runc: containerd's) from
 * just before the burst to the memory reading, / N. For pool mode this window includes the start of
 * the pool's refill (the daemon's side of it: spawning and watching the refill's QEMU).
 *
 * Each run writes its JSON to `--out` (default .cache/density/density-<time>.json; rewritten after
 * every burst, so a run stopped halfway keeps what it measured) and renders the
 * charts (docs/img/density-*.svg, or `--img-dir`) from that run merged with the `--merge` files
 * (the later file wins for a (mode, N) measured twice); `--plot-only` renders from `--merge` alone.
 *
 *   node --import tsx bench/density.ts [--n 1,2,4,8] [--bare-n 1,8] [--modes cold,pool,runc]
 *       [--idle-s S] [--out FILE] [--merge FILE ...] [--img-dir DIR] [--plot-only] [--json]
 *
 * Needs root, QEMU and the guest assets; runc mode needs containerd (else it is skipped, saying why).
 */
import { randomUUID } from 'node:crypto';
import { promises as fsp, readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { packageRoot } from '../src/common/paths.js';
import { defaultHandlerProfile } from '../src/config/defaults.js';
import { startVirtiofsd } from '../src/hypervisor/virtiofsd.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { type ContainerdHandle, containerdMissing, startContainerd } from '../test/helpers/containerd.js';
import type { CriClient } from '../test/helpers/cri-client.js';
import { criClient } from '../test/helpers/cri-client.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../test/helpers/images-registry.js';
import { bareArgv, bootBare, msToFirstBytes } from './lib/bare-qemu.js';
import { currentCommit } from './lib/commit.js';
import { type BenchDaemon, createBenchDaemon } from './lib/daemon.js';
import { lineChartSvg, type Series } from './lib/plot.js';
import { median, processArgs, readSmapsRollupKiB, sleep } from './lib/proc.js';
import { timedPodWithContainer } from './lib/timed-pod.js';

export const MODES = ['cold', 'pool', 'template', 'runc'] as const;
export type Mode = (typeof MODES)[number];
type VmMode = 'cold' | 'pool' | 'template';

/** Kata Containers' published figures the issue compares with (KVM, not TCG). */
export const KATA_PUBLISHED = {
  templateStartS: 0.25,
  coldStartS: 1.16,
  startSource: 'Kata 4.1 VM templates on Cloud Hypervisor / Dragonball, as quoted in issue 35',
  templatePods: 100,
  templatePodMB: 128,
  templateSavedGB: 9,
  templateSavedFraction: 0.72,
  memorySource: 'kata-containers docs/how-to/what-is-vm-templating-and-how-do-I-use-it.md',
} as const;

/** Goals of issue 35 (ratios in one run). */
export const GOALS = { poolToCold: 0.25, templateToCold: 0.15, templateMemoryToCold: 0.5 } as const;

const MARKER = 'kata-ts-density-ready';
const POD_NAMESPACE = 'kata-ts-bench';
const HANDLER = 'kata-ts';
/** Generous: 8 TCG boots at once on 2 shared cores take minutes. */
const RPC_DEADLINE_MS = 1_200_000;
const READY_TIMEOUT_MS = 1_200_000;
/** The pool is full when it holds N ready VMs; a refill that stops making progress this long is an error. */
const POOL_STALL_MS = 600_000;

/**
 * How a VM mode is set up: the daemon config it needs for a burst of `n` pods and the handler the
 * pods ask for. `null` with a reason: the mode does not exist yet, and nothing is measured for it.
 */
interface VmModeSetup {
  daemonConfig(n: number): Record<string, unknown>;
  handler: string;
  /** Waits until the daemon is ready for a burst of `n` (the pool full); `progress` says how it goes. */
  prepare(rt: BenchDaemon, n: number, progress: (l: string) => void): Promise<void>;
}

function baseConfig(): Record<string, unknown> {
  return { hypervisor: { readyTimeoutMs: READY_TIMEOUT_MS }, handlers: { [HANDLER]: defaultHandlerProfile() } };
}

export const MODE_SETUPS: Record<VmMode, VmModeSetup | { unavailable: string }> = {
  cold: { daemonConfig: () => baseConfig(), handler: HANDLER, prepare: async () => undefined },
  pool: {
    daemonConfig: (n) => ({ ...baseConfig(), pool: { sizes: { [HANDLER]: n } } }),
    handler: HANDLER,
    prepare: (rt, n, progress) => poolFull(rt.cri, n, progress),
  },
  template: {
    daemonConfig: () => ({
      ...baseConfig(),
      handlers: {
        [HANDLER]: {
          ...defaultHandlerProfile(),
          vmmConfinement: { seccomp: true, unprivileged: false, optOutReason: 'templates: clones need the RAM file writable on QEMU 7.2' },
        },
      },
      templates: { handlers: [HANDLER], root: TEMPLATE_ROOT },
    }),
    handler: HANDLER,
    prepare: (rt, _n, progress) => templateReady(rt.cri, progress),
  },
};

/** One template root for the run: built by the first template daemon, verified by the next (same inputs, same key). */
const TEMPLATE_ROOT = path.join('/dev/shm', `kata-ts-bench-templates-${process.pid}`);

/** Waits until HANDLER's template is ready (built or verified); a failed build is an error. */
async function templateReady(cri: CriClient, progress: (l: string) => void): Promise<void> {
  const started = Date.now();
  for (;;) {
    const { info } = await cri.runtime.Status({ verbose: true });
    const s = (JSON.parse(info.templates ?? '[]') as Array<{ handler: string; phase: string; failure: unknown }>).find(
      (x) => x.handler === HANDLER,
    );
    if (s?.phase === 'ready') {
      progress(`  template ready after ${((Date.now() - started) / 1000).toFixed(1)} s`);
      return;
    }
    if (s?.phase === 'failed') throw new Error(`the template failed: ${JSON.stringify(s.failure)}`);
    if (Date.now() - started > POOL_STALL_MS) throw new Error(`the template was not ready within ${POOL_STALL_MS} ms`);
    await sleep(500);
  }
}

interface PoolStatus {
  handler: string;
  ready: number;
  booting: number;
}

/** Waits until the pool of HANDLER holds `n` ready VMs; fails only when it stops progressing for POOL_STALL_MS. */
async function poolFull(cri: CriClient, n: number, progress: (l: string) => void): Promise<void> {
  let last = -1;
  let lastChange = Date.now();
  for (;;) {
    const { info } = await cri.runtime.Status({ verbose: true });
    const s = (JSON.parse(info.pool ?? '[]') as PoolStatus[]).find((x) => x.handler === HANDLER);
    const ready = s?.ready ?? 0;
    if (ready >= n && (s?.booting ?? 0) === 0) return;
    if (ready !== last) {
      progress(`  pool: ${ready}/${n} ready, ${s?.booting ?? 0} booting`);
      last = ready;
      lastChange = Date.now();
    }
    if (Date.now() - lastChange > POOL_STALL_MS) throw new Error(`the pool stayed at ${ready}/${n} ready for ${POOL_STALL_MS} ms`);
    await sleep(1_000);
  }
}

export interface PodSample {
  /** RunPodSandbox's answer, StartContainer's answer, the first output line (the timed end), ms from the burst. */
  podMs: number;
  startedMs: number;
  totalMs: number;
  /** Host memory of the idle pod (its own processes, without the daemon's share), KiB. */
  ownPssKiB: number;
  /** Where its VM came from (kata-ts: PodSandboxStatus origin.kind; runc: 'runc'). */
  origin: string;
  /** Why it missed the template or the pool: the miss's own sentence (origin.*Miss.message). */
  miss?: string;
}

export interface BurstResult {
  mode: Mode | 'bare';
  n: number;
  pods: PodSample[];
  /** The daemon's (runc: containerd's) PSS at the memory reading, KiB; bare: 0. */
  daemonPssKiB: number;
  /** The daemon's (containerd's) utime + stime over the burst window, ms. */
  daemonCpuMs: number;
  windowMs: number;
  medianLatencyMs: number;
  /** Median over the pods of (own PSS + daemon PSS / N), MiB. */
  memoryPerPodMiB: number;
  daemonCpuPerPodMs: number;
  loadavg1: [number, number];
}

export interface DensityResult {
  bench: 'density';
  date: string;
  commit: string | null;
  host: { cpus: number; memMiB: number };
  idleS: number;
  bursts: BurstResult[];
  /** Modes not measured, and why. */
  skipped: Array<{ mode: Mode; why: string }>;
  /**
   * Where each pool claim's or clone's time went, from the daemon's ready log lines (ms): the
   * whole claim, the pod network attached and the clone ready (templates), and the overlapped
   * growth / CreatePod / ConfigureNetwork (`steps`, from their common start).
   */
  claims?: Array<{ mode: Mode; n: number; totalMs: number; attachedMs?: number; clonedMs?: number; steps?: Record<string, number> }>;
  /** Bursts that failed (a pod did not start within the bounds), with the first error: a result too. */
  failed?: Array<{ mode: Mode | 'bare'; n: number; error: string; loadavg1: number }>;
}

const CLK_TCK = 100;

/** utime + stime of a process in ms (/proc/<pid>/stat fields 14 and 15); NaN when it is gone. */
export function cpuMs(pid: number): number {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return Number.NaN;
  }
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // rest[0] is field 3 (state): utime is field 14, stime field 15.
  return ((Number(rest[11]) + Number(rest[12])) * 1000) / CLK_TCK;
}

/** `roots` and every process descending from them (by ppid), each once. */
export function withDescendants(roots: readonly number[]): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // gone meanwhile
    }
  }
  const out = new Set<number>();
  const walk = (pid: number): void => {
    if (out.has(pid)) return;
    out.add(pid);
    for (const c of children.get(pid) ?? []) walk(c);
  };
  for (const r of roots) walk(r);
  return [...out];
}

function pssSumKiB(pids: readonly number[]): number {
  return pids.reduce((sum, pid) => sum + (readSmapsRollupKiB(pid)?.pss ?? 0), 0);
}

/** Where a burst's pods go: a CRI, its handler, where pods log and are placed, and the node's pod costs. */
interface Door {
  mode: Mode;
  cri: CriClient;
  handler: string;
  logRoot: string;
  cgroupParent(uid: string): string;
  /** The daemon process (kata-ts serve, or containerd). */
  daemonPid(): number;
  /** The pids an idle pod costs on the host (without the daemon), and where its VM came from. */
  podCost(sid: string, uid: string): Promise<{ pids: number[]; origin: string; miss?: string }>;
}

interface PodInfo {
  pid: number;
  virtiofsd: { pid: number } | null;
  tpm?: { pid: number } | null;
  origin: {
    kind: string;
    poolMiss?: { reason: string; message: string } | null;
    templateMiss?: { reason: string; message: string } | null;
  } | null;
  workDir: string;
  confinement: { vmmDir: string | null } | null;
  plan: { qemu: { binary: string; argv: string[] } };
}

async function podInfo(cri: CriClient, sid: string): Promise<PodInfo> {
  return JSON.parse((await cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid, verbose: true })).info.info!) as PodInfo;
}

function kataDoor(mode: Mode, rt: BenchDaemon, handler: string): Door {
  return {
    mode,
    cri: rt.cri,
    handler,
    logRoot: path.join(rt.dir, 'pods'),
    cgroupParent: (uid) => rt.cgroupParent(uid),
    daemonPid: () => rt.pid(),
    podCost: async (sid) => {
      const info = await podInfo(rt.cri, sid);
      const roots = [info.pid, info.virtiofsd?.pid, info.tpm?.pid].filter((p): p is number => p !== undefined);
      // A pool claim always records its origin; a pod without one booted its own VM. A pod that
      // missed the template or the pool says why: `cold(TEMPLATE_NOT_READY)`.
      const o = info.origin;
      const miss = mode === 'template' ? o?.templateMiss : mode === 'pool' ? o?.poolMiss : undefined;
      const kind = o?.kind ?? 'cold';
      if (miss == null || kind === mode) return { pids: withDescendants(roots), origin: kind };
      return { pids: withDescendants(roots), origin: `${kind}(${miss.reason})`, miss: miss.message };
    },
  };
}

function runcDoor(ctrd: ContainerdHandle, cri: CriClient, logRoot: string): Door {
  const parent = (uid: string) => `/kubepods/besteffort/pod${uid}`;
  return {
    mode: 'runc',
    cri,
    handler: '',
    logRoot,
    cgroupParent: parent,
    daemonPid: () => ctrd.pid,
    podCost: async (sid, uid) => {
      const inCgroup = new Set<number>();
      for (const dir of ctrd.cgroupDirs(parent(uid))) {
        // Every container's cgroup lies below the pod's: walk the tree.
        const walk = async (d: string): Promise<void> => {
          const procs = await fsp.readFile(path.join(d, 'cgroup.procs'), 'utf8').catch(() => '');
          for (const l of procs.split('\n')) if (l.trim() !== '') inCgroup.add(Number(l));
          for (const e of await fsp.readdir(d, { withFileTypes: true }).catch(() => []))
            if (e.isDirectory()) await walk(path.join(d, e.name));
        };
        await walk(dir);
      }
      const shims = processArgs()
        .filter(
          ({ args }) =>
            path.basename(args[0] ?? '').startsWith('containerd-shim-runc') && args.some((a, i) => a === '-id' && args[i + 1] === sid),
        )
        .map(({ pid }) => pid);
      return { pids: [...new Set([...inCgroup, ...shims])], origin: 'runc' };
    },
  };
}

/** N pods with a first container each, all sent at once; then idle, read, removed. */
async function burst(door: Door, image: string, n: number, idleS: number, progress: (l: string) => void): Promise<BurstResult> {
  const load0 = os.loadavg()[0]!;
  const daemonPid = door.daemonPid();
  const cpu0 = cpuMs(daemonPid);
  const t0 = performance.now();
  const live: string[] = [];
  const deadline = () => ({ deadline: Date.now() + RPC_DEADLINE_MS });
  const one = async (i: number) => {
    const pod = await timedPodWithContainer({
      cri: door.cri,
      handler: door.handler,
      logRoot: door.logRoot,
      namespace: POD_NAMESPACE,
      name: `${door.mode}-${n}-${i}`,
      cgroupParent: (uid) => door.cgroupParent(uid),
      image,
      marker: MARKER,
      rpcDeadlineMs: RPC_DEADLINE_MS,
      markerTimeoutMs: RPC_DEADLINE_MS,
      t0Ms: t0,
      onPod: (sid) => live.push(sid),
    });
    progress(`  ${door.mode} N=${n}: pod ${i + 1} up in ${(pod.totalMs / 1000).toFixed(1)} s`);
    return { ...pod, sid: pod.sandboxId };
  };
  try {
    const settled = await Promise.allSettled(Array.from({ length: n }, (_, i) => one(i)));
    const failed = settled.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failed.length > 0) throw new Error(`${failed.length} of ${n} ${door.mode} pods failed: ${(failed[0]!.reason as Error).message}`);
    const started = settled.map((s) => (s as PromiseFulfilledResult<Awaited<ReturnType<typeof one>>>).value);
    await sleep(idleS * 1000);
    const pods: PodSample[] = [];
    for (const p of started) {
      const cost = await door.podCost(p.sid, p.uid);
      pods.push({
        podMs: p.podMs,
        startedMs: p.startedMs,
        totalMs: p.totalMs,
        ownPssKiB: pssSumKiB(cost.pids),
        origin: cost.origin,
        ...(cost.miss === undefined ? {} : { miss: cost.miss }),
      });
      if (cost.miss !== undefined) progress(`  ${door.mode} N=${n}: a pod missed: ${cost.miss}`);
    }
    const daemonPssKiB = readSmapsRollupKiB(daemonPid)?.pss ?? Number.NaN;
    const daemonCpuMs = cpuMs(daemonPid) - cpu0;
    const windowMs = performance.now() - t0;
    return summarize(door.mode, n, pods, daemonPssKiB, daemonCpuMs, windowMs, [load0, os.loadavg()[0]!]);
  } finally {
    await Promise.allSettled(
      live.map(async (sid) => {
        await door.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid }, deadline());
        await door.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid }, deadline());
      }),
    );
  }
}

function summarize(
  mode: Mode | 'bare',
  n: number,
  pods: PodSample[],
  daemonPssKiB: number,
  daemonCpuMs: number,
  windowMs: number,
  loadavg1: [number, number],
): BurstResult {
  return {
    mode,
    n,
    pods,
    daemonPssKiB,
    daemonCpuMs,
    windowMs,
    medianLatencyMs: median(pods.map((p) => p.totalMs)),
    memoryPerPodMiB: median(pods.map((p) => (p.ownPssKiB + daemonPssKiB / n) / 1024)),
    daemonCpuPerPodMs: daemonCpuMs / n,
    loadavg1,
  };
}

/** `n` bare QEMUs of the runtime's argv, each with its virtiofsd, started at once; timed to the agent's first bytes. */
async function bareBurst(template: PodInfo, root: string, n: number, idleS: number, progress: (l: string) => void): Promise<BurstResult> {
  const load0 = os.loadavg()[0]!;
  const pids = new Set<number>();
  const stops: Array<() => Promise<void>> = [];
  const t0 = performance.now();
  const one = async (i: number): Promise<{ totalMs: number; roots: number[] }> => {
    const dir = path.join(root, `bare-${n}-${i}`);
    const shared = path.join(root, `bare-${n}-${i}-shared`);
    await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
    await fsp.mkdir(shared, { recursive: true });
    const socketPath = path.join(dir, 'vfs.sock');
    const argv = bareArgv(template.plan.qemu.argv, template.confinement?.vmmDir ?? template.workDir, dir, 'direct').map((a) =>
      a.startsWith('socket,id=virtiofs,path=') ? `socket,id=virtiofs,path=${socketPath}` : a,
    );
    const agentSocket = argv
      .find((a) => a.startsWith('socket,id=agent,path='))
      ?.split('path=')[1]
      ?.split(',')[0];
    if (agentSocket === undefined) throw new Error('the runtime argv has no agent socket');
    const vfs = await startVirtiofsd({
      socketPath,
      sourceDir: shared,
      logFile: path.join(root, `bare-${n}-${i}-vfs.log`),
      logger: silentLogger(),
    });
    stops.push(() => vfs.stop());
    const agentUp = msToFirstBytes(agentSocket, t0, READY_TIMEOUT_MS);
    const boot = await bootBare({
      qemuBinary: template.plan.qemu.binary,
      argv,
      dir,
      mode: 'direct',
      readyTimeoutMs: READY_TIMEOUT_MS,
      onSpawn: (pid) => pids.add(pid),
    });
    stops.unshift(() => boot.stop());
    const totalMs = await agentUp;
    if (Number.isNaN(totalMs)) throw new Error(`bare QEMU ${i}: no agent bytes within ${READY_TIMEOUT_MS} ms`);
    progress(`  bare N=${n}: VM ${i + 1} agent up in ${(totalMs / 1000).toFixed(1)} s`);
    return { totalMs, roots: [boot.pid, vfs.pid] };
  };
  try {
    const done = await Promise.all(Array.from({ length: n }, (_, i) => one(i)));
    await sleep(idleS * 1000);
    const pods = done.map((d) => ({
      podMs: Number.NaN,
      startedMs: Number.NaN,
      totalMs: d.totalMs,
      ownPssKiB: pssSumKiB(withDescendants(d.roots)),
      origin: 'bare',
    }));
    return summarize('bare', n, pods, 0, 0, performance.now() - t0, [load0, os.loadavg()[0]!]);
  } finally {
    await Promise.allSettled(stops.map((s) => s()));
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
  }
}

export interface DensityOptions {
  ns: number[];
  bareNs: number[];
  modes: Mode[];
  idleS: number;
}

/**
 * Runs the bursts `o` asks for: runc first (seconds), then cold with the bare baseline, then pool
 * and template (a fresh daemon per N). `onBurst` gets the result so far after every burst, so a
 * run stopped halfway (a burst of 8 TCG boots can take many minutes) keeps what it measured.
 */
export async function runDensityBench(
  o: DensityOptions,
  progress: (l: string) => void,
  onBurst: (soFar: DensityResult) => Promise<void> = async () => undefined,
): Promise<DensityResult> {
  await ensureGuestAssets();
  const result: DensityResult = {
    bench: 'density',
    date: new Date().toISOString(),
    commit: currentCommit(),
    host: { cpus: os.cpus().length, memMiB: Math.round(os.totalmem() / 2 ** 20) },
    idleS: o.idleS,
    bursts: [],
    skipped: [],
  };
  /** Runs one burst and keeps its result, or its failure (the run goes on with the next burst). */
  const record = async (mode: Mode | 'bare', n: number, run: () => Promise<BurstResult>): Promise<void> => {
    try {
      const b = await run();
      result.bursts.push(b);
      progress(fmtBurst(b));
    } catch (err) {
      const error = (err as Error).message;
      const failed = result.failed ?? [];
      failed.push({ mode, n, error, loadavg1: os.loadavg()[0]! });
      result.failed = failed;
      progress(`  ${mode} N=${n}: FAILED: ${error}`);
    }
    result.date = new Date().toISOString();
    await onBurst(result);
  };
  const registry: RegistryHandle = await startRegistry();
  const daemons: BenchDaemon[] = [];
  const onSignal = (signal: NodeJS.Signals): void => {
    progress(`${signal}: cleaning up`);
    void Promise.allSettled(daemons.map((d) => d.cleanup())).finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const image = await pushBusyboxImage(registry, 'bench/busybox', 'density', ['sleep']);
  const daemon = async (config: Record<string, unknown>): Promise<BenchDaemon> => {
    const rt = await createBenchDaemon(config);
    daemons.push(rt);
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    return rt;
  };
  const done = async (rt: BenchDaemon): Promise<void> => {
    daemons.splice(daemons.indexOf(rt), 1);
    await rt.cleanup();
  };
  try {
    if (o.modes.includes('runc')) {
      const missing = containerdMissing();
      if (missing !== null) {
        result.skipped.push({ mode: 'runc', why: missing });
        progress(`runc: skipped: ${missing}`);
      } else {
        const ctrd = await startContainerd({ registry });
        const cri = criClient(ctrd.criSocket);
        try {
          await cri.image.PullImage({ image: { image } });
          const door = runcDoor(ctrd, cri, path.join(ctrd.dir, 'density-pods'));
          await burst(door, image, 1, 0, progress); // warm-up, not counted
          for (const n of o.ns) {
            progress(`runc: ${n} pods at once`);
            await record('runc', n, () => burst(door, image, n, o.idleS, progress));
          }
        } finally {
          cri.close();
          await ctrd.stop();
        }
      }
    }

    if (o.modes.includes('cold') || o.bareNs.length > 0) {
      // Cold: one daemon for every N, its warm-up pod (not counted) gives the bare argv.
      const cold = MODE_SETUPS.cold as VmModeSetup;
      const coldRt = await daemon(cold.daemonConfig(0));
      progress('warm-up: one cold pod (not counted; its argv is the bare baseline)');
      const warm = await burst(kataDoor('cold', coldRt, cold.handler), image, 1, 0, progress);
      progress(`warm-up: ${(warm.medianLatencyMs / 1000).toFixed(1)} s`);
      const { pod_sandbox_id: tsid } = await coldRt.cri.runtime.RunPodSandbox(
        {
          config: {
            metadata: { name: 'argv', uid: randomUUID(), namespace: POD_NAMESPACE, attempt: 0 },
            linux: { cgroup_parent: coldRt.cgroupParent(randomUUID()) },
          },
          runtime_handler: cold.handler,
        },
        { deadline: Date.now() + RPC_DEADLINE_MS },
      );
      const template = await podInfo(coldRt.cri, tsid);
      await coldRt.cri.runtime.StopPodSandbox({ pod_sandbox_id: tsid });
      await coldRt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: tsid });
      const bareDir = path.join(coldRt.dir, 'bare');
      for (const n of [...new Set([...o.ns, ...o.bareNs])].sort((a, b) => a - b)) {
        if (o.modes.includes('cold') && o.ns.includes(n)) {
          progress(`cold: ${n} pods at once`);
          await record('cold', n, () => burst(kataDoor('cold', coldRt, cold.handler), image, n, o.idleS, progress));
        }
        if (o.bareNs.includes(n)) {
          progress(`bare QEMU: ${n} at once`);
          await record('bare', n, () => bareBurst(template, bareDir, n, o.idleS, progress));
        }
      }
      await done(coldRt);
    }

    for (const mode of ['pool', 'template'] as const) {
      if (!o.modes.includes(mode)) continue;
      const setup = MODE_SETUPS[mode];
      if ('unavailable' in setup) {
        result.skipped.push({ mode, why: setup.unavailable });
        progress(`${mode}: skipped: ${setup.unavailable}`);
        continue;
      }
      for (const n of o.ns) {
        // A fresh daemon per N: its pool (or template) sized for this burst.
        const rt = await daemon(setup.daemonConfig(n));
        try {
          progress(`${mode}: preparing for ${n}`);
          await setup.prepare(rt, n, progress);
          progress(`${mode}: ${n} pods at once`);
          await record(mode, n, () => burst(kataDoor(mode, rt, setup.handler), image, n, o.idleS, progress));
          for (const c of await claimTimes(rt.logFile)) {
            result.claims = [...(result.claims ?? []), { mode, n, ...c }];
            progress(`  ${mode} N=${n} claim: ${JSON.stringify(c)}`);
          }
        } finally {
          await done(rt);
        }
      }
    }
  } finally {
    for (const rt of [...daemons]) await rt.cleanup();
    await fsp.rm(TEMPLATE_ROOT, { recursive: true, force: true });
    await registry.stop();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  return result;
}

/** The pool claims' and clones' ready log lines of a daemon's log (info level: one line each). */
async function claimTimes(
  logFile: string,
): Promise<Array<{ totalMs: number; attachedMs?: number; clonedMs?: number; steps?: Record<string, number> }>> {
  const out: Array<{ totalMs: number; attachedMs?: number; clonedMs?: number; steps?: Record<string, number> }> = [];
  const text = await fsp.readFile(logFile, 'utf8').catch(() => '');
  for (const line of text.split('\n')) {
    if (!line.includes('sandbox ready from')) continue;
    try {
      const d = JSON.parse(line) as {
        claimMs?: number;
        readyMs?: number;
        attachedMs?: number;
        clonedMs?: number;
        steps?: Record<string, number>;
      };
      out.push({
        totalMs: d.claimMs ?? d.readyMs ?? -1,
        ...(d.attachedMs === undefined ? {} : { attachedMs: d.attachedMs }),
        ...(d.clonedMs === undefined ? {} : { clonedMs: d.clonedMs }),
        ...(d.steps === undefined ? {} : { steps: d.steps }),
      });
    } catch {
      // not a JSON line
    }
  }
  return out;
}

function fmtBurst(b: BurstResult): string {
  const origins = [...new Set(b.pods.map((p) => p.origin))].join('/');
  return `  ${b.mode} N=${b.n}: latency median ${(b.medianLatencyMs / 1000).toFixed(1)} s (${b.pods.map((p) => (p.totalMs / 1000).toFixed(1)).join(', ')}), memory/pod ${b.memoryPerPodMiB.toFixed(0)} MiB, daemon CPU/pod ${b.daemonCpuPerPodMs.toFixed(0)} ms, origin ${origins}, load ${b.loadavg1.map((l) => l.toFixed(1)).join(' -> ')}`;
}

/** The bursts of several runs, the later run winning for a (mode, N) measured twice. Pure. */
export function mergeRuns(runs: readonly DensityResult[]): {
  bursts: BurstResult[];
  runs: Array<{ date: string; commit: string | null }>;
  skipped: DensityResult['skipped'];
  failed: NonNullable<DensityResult['failed']>;
} {
  const byKey = new Map<string, BurstResult>();
  const failed = new Map<string, NonNullable<DensityResult['failed']>[number]>();
  for (const r of runs) {
    for (const f of r.failed ?? []) failed.set(`${f.mode}:${f.n}`, f);
    for (const b of r.bursts) {
      byKey.set(`${b.mode}:${b.n}`, b);
      failed.delete(`${b.mode}:${b.n}`);
    }
  }
  const skipped = new Map<Mode, string>();
  for (const r of runs) for (const s of r.skipped) skipped.set(s.mode, s.why);
  for (const b of byKey.values()) skipped.delete(b.mode as Mode);
  return {
    bursts: [...byKey.values()].sort((a, b) => a.mode.localeCompare(b.mode) || a.n - b.n),
    runs: runs.map((r) => ({ date: r.date, commit: r.commit })),
    skipped: [...skipped].map(([mode, why]) => ({ mode, why })),
    failed: [...failed.values()],
  };
}

function find(bursts: readonly BurstResult[], mode: Mode | 'bare', n: number): BurstResult | undefined {
  return bursts.find((b) => b.mode === mode && b.n === n);
}

/** For a template burst whose pods did not all clone: how many did (the ratio is then not the clones'). */
function clonedNote(b: BurstResult | undefined): string {
  if (b === undefined) return '';
  const cloned = b.pods.filter((p) => p.origin === 'template').length;
  return cloned === b.n ? '' : ` [only ${cloned} of ${b.n} pods cloned: not a measure of clones]`;
}

/** The table and the goals of issue 35, from merged bursts. Pure. */
export function formatDensityReport(m: ReturnType<typeof mergeRuns>): string {
  const lines: string[] = [];
  lines.push(`runs: ${m.runs.map((r) => `${r.date} (commit ${r.commit ?? '?'})`).join('; ')}`);
  lines.push('mode      N   latency median (min-max) s   memory/pod MiB   daemon CPU/pod ms   load     origins');
  for (const b of m.bursts) {
    const lat = b.pods.map((p) => p.totalMs / 1000);
    const origins = [...new Set(b.pods.map((p) => p.origin))].map((o) => `${b.pods.filter((p) => p.origin === o).length}x ${o}`).join(', ');
    lines.push(
      `${b.mode.padEnd(8)} ${String(b.n).padStart(2)}   ${(b.medianLatencyMs / 1000).toFixed(1).padStart(6)} (${Math.min(...lat).toFixed(1)}-${Math.max(...lat).toFixed(1)})`.padEnd(
        42,
      ) +
        `${b.memoryPerPodMiB.toFixed(0).padStart(8)}   ${b.mode === 'bare' ? '         -' : b.daemonCpuPerPodMs.toFixed(0).padStart(10)}          ${b.loadavg1
          .map((l) => l.toFixed(1))
          .join('->')
          .padEnd(11)} ${origins}`,
    );
  }
  for (const s of m.skipped) lines.push(`${s.mode}: not measured: ${s.why}`);
  for (const f of m.failed) lines.push(`${f.mode} N=${f.n}: FAILED (load ${f.loadavg1.toFixed(1)}): ${f.error}`);
  lines.push('goals (issue 35):');
  const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined ? Number.NaN : a / b);
  for (const n of [1, 4]) {
    const r = ratio(find(m.bursts, 'pool', n)?.medianLatencyMs, find(m.bursts, 'cold', n)?.medianLatencyMs);
    lines.push(
      `  pool / cold start at N=${n}: ${Number.isNaN(r) ? 'not measured' : `${r.toFixed(3)} (goal <= ${GOALS.poolToCold}: ${r <= GOALS.poolToCold ? 'met' : 'not met'})`}`,
    );
    const t = find(m.bursts, 'template', n);
    const tr = ratio(t?.medianLatencyMs, find(m.bursts, 'cold', n)?.medianLatencyMs);
    lines.push(
      `  template / cold start at N=${n}: ${Number.isNaN(tr) ? 'not measured' : `${tr.toFixed(3)} (goal <= ${GOALS.templateToCold}: ${tr <= GOALS.templateToCold ? 'met' : 'not met'})${clonedNote(t)}`}`,
    );
  }
  const t8 = find(m.bursts, 'template', 8);
  const m8 = ratio(t8?.memoryPerPodMiB, find(m.bursts, 'cold', 8)?.memoryPerPodMiB);
  lines.push(
    `  memory of 8 idle cloned pods / 8 cold: ${Number.isNaN(m8) ? 'not measured' : `${m8.toFixed(3)} (goal <= ${GOALS.templateMemoryToCold}: ${m8 <= GOALS.templateMemoryToCold ? 'met' : 'not met'})${clonedNote(t8)}`}`,
  );
  const p8 = ratio(find(m.bursts, 'pool', 8)?.memoryPerPodMiB, find(m.bursts, 'cold', 8)?.memoryPerPodMiB);
  if (!Number.isNaN(p8))
    lines.push(`    for scale: pool / cold memory per idle pod at N=8: ${p8.toFixed(3)} (a pooled VM shares nothing either)`);
  const bare = ratio(find(m.bursts, 'bare', 8)?.medianLatencyMs, find(m.bursts, 'bare', 1)?.medianLatencyMs);
  for (const mode of ['cold', 'pool', 'template'] as const) {
    const r = ratio(find(m.bursts, mode, 8)?.medianLatencyMs, find(m.bursts, mode, 1)?.medianLatencyMs);
    lines.push(
      `  contention, ${mode} start latency N=8 / N=1: ${Number.isNaN(r) ? 'not measured' : r.toFixed(2)}; bare QEMU to the agent N=8 / N=1: ${Number.isNaN(bare) ? 'not measured' : bare.toFixed(2)}` +
        (Number.isNaN(r) || Number.isNaN(bare) ? '' : ` (goal ${mode} <= bare: ${r <= bare ? 'met' : 'not met'})`),
    );
  }
  for (const n of [1, 8]) {
    const cr = ratio(find(m.bursts, 'cold', n)?.medianLatencyMs, find(m.bursts, 'runc', n)?.medianLatencyMs);
    const mr = ratio(find(m.bursts, 'cold', n)?.memoryPerPodMiB, find(m.bursts, 'runc', n)?.memoryPerPodMiB);
    if (!Number.isNaN(cr))
      lines.push(`  beside runc at N=${n}: cold start ${cr.toFixed(1)}x runc's, memory per idle pod ${mr.toFixed(1)}x`);
  }
  const k = KATA_PUBLISHED;
  lines.push(
    `Kata's published figures (KVM): template start ${k.templateStartS} s vs ${k.coldStartS} s cold = ${(k.templateStartS / k.coldStartS).toFixed(3)} (${k.startSource}); ` +
      `${k.templatePods} pods x ${k.templatePodMB} MB with templates saved ${k.templateSavedGB} GB, ~${k.templateSavedFraction * 100}% of guest memory (${k.memorySource})`,
  );
  return lines.join('\n');
}

const CHART_MODES: ReadonlyArray<Mode | 'bare'> = ['cold', 'pool', 'template', 'runc', 'bare'];

/** Renders docs/img/density-{latency,memory,cpu}.svg from merged bursts; answers the files written. */
export async function writeCharts(m: ReturnType<typeof mergeRuns>, imgDir: string): Promise<string[]> {
  const ns = [...new Set(m.bursts.map((b) => b.n))].sort((a, b) => a - b);
  const sub = `kata-ts, TCG, ${os.cpus().length} shared cores; ${m.runs.map((r) => `${r.date.slice(0, 16)}Z ${r.commit ?? ''}`).join(', ')}`;
  const series = (pick: (b: BurstResult) => number, modes: ReadonlyArray<Mode | 'bare'>): Series[] =>
    modes
      .map((mode) => ({
        name: mode === 'bare' ? 'bare QEMU (to agent)' : mode === 'runc' ? 'runc (containerd)' : mode,
        dashed: mode === 'bare' || mode === 'runc',
        points: m.bursts.filter((b) => b.mode === mode).map((b) => ({ x: b.n, y: pick(b) })),
      }))
      .filter((s) => s.points.length > 0);
  await fsp.mkdir(imgDir, { recursive: true });
  const charts: Array<[string, Parameters<typeof lineChartSvg>[0]]> = [
    [
      'density-latency.svg',
      {
        title: 'Pod + first container, N started at once: median per-pod start latency',
        subtitle: sub,
        xTitle: 'pods started at once (N)',
        yTitle: 'seconds to first output line',
        xTicks: ns,
        series: series((b) => b.medianLatencyMs / 1000, CHART_MODES),
      },
    ],
    [
      'density-memory.svg',
      {
        title: 'Host memory per idle pod (PSS: VMM, virtiofsd, + daemon PSS / N)',
        subtitle: sub,
        xTitle: 'idle pods (N)',
        yTitle: 'MiB per pod',
        xTicks: ns,
        series: series(
          (b) => b.memoryPerPodMiB,
          CHART_MODES.filter((x) => x !== 'bare'),
        ),
      },
    ],
    [
      'density-cpu.svg',
      {
        title: "Daemon CPU time per pod (kata-ts serve; runc: containerd's)",
        subtitle: sub,
        xTitle: 'pods started at once (N)',
        yTitle: 'CPU ms per pod',
        xTicks: ns,
        series: series(
          (b) => b.daemonCpuPerPodMs,
          CHART_MODES.filter((x) => x !== 'bare'),
        ),
      },
    ],
  ];
  const written: string[] = [];
  for (const [file, chart] of charts) {
    const out = path.join(imgDir, file);
    await fsp.writeFile(out, await lineChartSvg(chart));
    written.push(out);
  }
  return written;
}

function numberList(s: string, field: string): number[] {
  const values = s
    .split(',')
    .filter((x) => x !== '')
    .map(Number);
  if (values.some((v) => !Number.isInteger(v) || v < 1 || v > 64))
    throw new Error(`--${field} must be a comma-separated list of pod counts 1..64, got "${s}"`);
  return values;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: {
      n: { type: 'string', default: '1,2,4,8' },
      'bare-n': { type: 'string', default: '1,8' },
      modes: { type: 'string', default: 'cold,pool,template,runc' },
      'idle-s': { type: 'string', default: '15' },
      out: { type: 'string' },
      merge: { type: 'string', multiple: true, default: [] },
      'img-dir': { type: 'string', default: path.join(packageRoot(), 'docs', 'img') },
      'plot-only': { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
    },
  });
  const modes = values.modes.split(',') as Mode[];
  const bad = modes.find((x) => !MODES.includes(x));
  if (bad !== undefined) throw new Error(`--modes: unknown mode "${bad}" (known: ${MODES.join(', ')})`);
  const runs: DensityResult[] = values.merge.map((f) => JSON.parse(readFileSync(f, 'utf8')) as DensityResult);
  if (!values['plot-only']) {
    const stamp = new Date().toISOString().replaceAll(':', '');
    const out = values.out ?? path.join(packageRoot(), '.cache', 'density', `density-${stamp}.json`);
    await fsp.mkdir(path.dirname(out), { recursive: true });
    const save = (r: DensityResult) => fsp.writeFile(out, `${JSON.stringify(r)}\n`);
    const result = await runDensityBench(
      { ns: numberList(values.n, 'n'), bareNs: numberList(values['bare-n'], 'bare-n'), modes, idleS: Number(values['idle-s']) },
      (l) => process.stderr.write(`${l}\n`),
      save,
    );
    await save(result);
    process.stderr.write(`results: ${out}\n`);
    runs.push(result);
  }
  const merged = mergeRuns(runs);
  const files = await writeCharts(merged, values['img-dir']);
  process.stderr.write(`charts: ${files.join(', ')}\n`);
  process.stdout.write(values.json ? `${JSON.stringify(merged)}\n` : `${formatDensityReport(merged)}\n`);
}
