/**
 * kata-ts's shim v2 face measured side by side with its other front door and with runc, in one run:
 *
 * 1. **pod + first container**: RunPodSandbox + CreateContainer + StartContainer until the
 *    container's first output line is in its CRI log, through
 *    (a) containerd (sid's 2.1.9 by default, `--containerd 1.6` for Debian 12's 1.6.20) + kata-ts's
 *        shim (`containerd-shim-kata-ts-v2`, the compiled dist/ when it is fresh, else the sources
 *        through tsx: the output says which), in each shim mode asked (`--modes pod,node`:
 *        `shim` is shim.mode "pod", a serve process per pod; `node` is shim.mode "node", the node
 *        shim server and a relay per pod; docs/shim.md "Shim modes"),
 *    (b) the standalone kata-ts daemon (`kata-ts serve`, its own CRI), and
 *    (c) the same containerd + runc;
 *    rounds rotate which goes first; medians; ratios shim / standalone and node / standalone
 *    (goal <= 1.05) and shim / runc. One warm-up of each is not counted.
 * 2. **the shim's memory per pod**: RSS, PSS and private memory (/proc/<pid>/smaps_rollup) of the
 *    pod's `serve` process (found by its command line: `-id <pod id>` ... `serve`) with the pod
 *    alone (the warm-up pod) and with one container (every shim pod, read after its timing
 *    ended), beside the ~18 MB PSS per pod published for Kata's Go shim and an idle `node`
 *    process (Node's own floor); and the peak RSS and wall time of the `start` and `delete`
 *    invocations (GNU time), read on the warm-up pod.
 *
 * 3. **shim memory per pod at 1, 5 and 10 pods** (`--pods 1,5,10`), in each mode: pods with one
 *    running container each (what a real pod is; `--bare-pods` for pods without one) started one
 *    after another through containerd; at each count, PSS (smaps_rollup) summed over every shim
 *    process (pod mode: the pods' serve processes; node mode: the node server, the relays and the
 *    containers' output holders), divided by the pods (goal <= 10 MiB per pod at 10).
 *
 * The same busybox image from one loopback registry everywhere. containerd is the private harness
 * of test/helpers/containerd.ts (its own namespaces, cgroups, CNI bridge); the daemon runs in
 * containerd's node network namespace with containerd's own CNI config, so both kata-ts doors pay
 * the same CNI ADD and TAP wiring, and both run the same handler profile and guest.
 *
 *   node --import tsx bench/shim.ts [--rounds N] [--containerd 2.1|1.6] [--modes pod,node] [--pods 1,5,10]
 *                                   [--skip-timing] [--skip-memory] [--bare-pods] [--parallel] [--warm-node-server]
 *                                   [--shim-tsx | --shim-dist] [--shim-front] [--json]
 *
 * `--shim-front`: containerd's `containerd-shim-kata-ts-v2` execs the native start front
 * (native/shim-start.c), which answers a start whose pod already answers and execs the Node shim
 * for everything else (docs/shim.md "The start fast path").
 */

import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs, promisify } from 'node:util';
import { packageRoot } from '../src/common/paths.js';
import { netnsNameFor } from '../src/network/wiring.js';
import { HOLD_FLAG } from '../src/shim/node-output-holder.js';
import { RELAY_BINARY_NAME } from '../src/shim/node-relay.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import {
  type ContainerdHandle,
  type ContainerdStopReport,
  containerdMissing,
  KATA_TS_HANDLER,
  startContainerd,
} from '../test/helpers/containerd.js';
import { containerdRelease } from '../test/helpers/containerd-releases.js';
import { type CriClient, criClient } from '../test/helpers/cri-client.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../test/helpers/images-registry.js';
import { DEBIAN_CNI_BIN_DIR } from '../test/helpers/network-node.js';
import { guestDirConfig } from '../test/helpers/runtime-daemon.js';
import { shimTestConfig } from '../test/helpers/shim-config.js';
import { currentCommit } from './lib/commit.js';
import { type BenchDaemon, createBenchDaemon } from './lib/daemon.js';
import { median, processArgs, type SmapsRollupKiB, sampledSmapsRollupKiB, sleep } from './lib/proc.js';
import { distStaleness, GNU_TIME, readShimRuns, type ShimCode, type ShimRun, writeShimWrapper } from './lib/shim-binary.js';
import { timedPodWithContainer } from './lib/timed-pod.js';

const execFileAsync = promisify(execFile);

export const SIDES = ['shim', 'node', 'standalone', 'runc'] as const;
export type Side = (typeof SIDES)[number];
/** The shim's modes (config shim.mode): `pod` is the `shim` side, `node` the `node` side. */
export type BenchShimMode = 'pod' | 'node';
/** The goal for shim memory per pod at the largest pod count (PSS summed over the shim's processes / pods). */
export const GOAL_MEMORY_PER_POD_MIB = 10;

/** Kata Containers' Go shim (containerd-shim-kata-v2): its published PSS per pod, in MB. */
export const KATA_GO_SHIM_PSS_MB = 18;
/** The goal for shim / standalone (issue 33's lighter shim: 1.05; it was 1.10 before). */
export const GOAL_RATIO = 1.05;
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
  /** containerd's `--version` line. */
  containerd: string;
  /** The sides timed (the shim modes asked, standalone, runc); empty with --skip-timing. */
  sides: Side[];
  /** Whether a bare node-mode pod kept the node server up through the timing (--warm-node-server). */
  warmNodeServer: boolean;
  rounds: Array<{ order: Side[] } & Partial<Record<Side, PodTiming>>>;
  medianMs: Partial<Record<Side, number>>;
  /** Ratios of the medians (NaN for a side not timed). */
  ratioShimStandalone: number;
  ratioNodeStandalone: number;
  ratioShimRunc: number;
  /** Shim memory per pod at each pod count, per mode. */
  perPodMemory: PerPodMemory[];
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

/** The kinds of shim process the memory readings sum. */
export type ShimProcessKind = 'serve' | 'node-serve' | 'relay' | 'holder';

/** One reading of the shim's memory with `pods` pods in `mode`. */
export interface PerPodMemory {
  mode: BenchShimMode;
  pods: number;
  /** Whether each pod ran one container (a node-mode container has an output holder) or none (--bare-pods). */
  withContainer: boolean;
  /** PSS (KiB) summed over every shim process. */
  pssSumKiB: number;
  /** pssSumKiB / pods, in MiB. */
  perPodMiB: number;
  /** Each process read: what it is, pid and PSS (KiB). */
  processes: Array<{ kind: ShimProcessKind; pid: number; pssKiB: number }>;
  loadavg1: number;
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
  /** A kata-ts shim door: the shim mode its pods are started in. */
  mode?: BenchShimMode;
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

/** The bench's options beyond the rounds. */
export interface ShimBenchOptions {
  forceTsx?: boolean;
  /** Run the compiled dist/ even when a src/ file is newer (the output names it): a rebuild under a running bench would swap code mid-run. */
  forceDist?: boolean;
  /** containerd runs the shim through its native start front (dist/native/kata-ts-shim-start, docs/shim.md "The start fast path"). */
  front?: boolean;
  /** The containerd release (test/helpers/containerd-releases.ts); default 2.1. */
  containerd?: '2.1' | '1.6';
  /** The shim modes to run; default both. */
  modes?: BenchShimMode[];
  /** The pod counts the memory per pod is read at; default 1, 5, 10. */
  podCounts?: number[];
  skipTiming?: boolean;
  skipMemory?: boolean;
  /** The memory readings' pods without a container (the readings before issue 33's last session were of such pods). */
  barePods?: boolean;
  /**
   * Keep one bare node-mode pod running through the timing (started before the warm-ups), so
   * the node server is up when each timed node-mode pod starts, as on a node that runs pods;
   * without it the server leaves 30 s after each timed pod and every node-mode pod starts it anew.
   */
  warmNodeServer?: boolean;
  /** Start each batch of the memory readings' pods together. */
  parallel?: boolean;
}

/** Node shim server processes of the containerd at `grpcAddress` (not the relays, whose revive command names it too). */
export function nodeServerPids(grpcAddress: string): number[] {
  return processArgs()
    .filter(({ args }) => args.at(-1) === 'node-serve' && args.includes(grpcAddress) && args[0] === process.execPath)
    .map(({ pid }) => pid);
}

/** Relays listening under the shim state root `stateRoot` (for the pod `sandboxId` when given: its upstream is under its state dir). */
export function relayPids(stateRoot: string, sandboxId?: string): number[] {
  const podDir = sandboxId === undefined ? stateRoot : path.join(stateRoot, 'k8s.io', sandboxId.slice(0, 16));
  return processArgs()
    .filter(({ args }) => path.basename(args[0] ?? '') === RELAY_BINARY_NAME && args.some((a) => a.startsWith(podDir)))
    .map(({ pid }) => pid);
}

/**
 * Output holders (`kata-ts-shim-relay --hold <container id>`, node mode's, one per started
 * container) of the containers `containerIds`: their command line names no pod dir, only the id.
 */
export function holderPids(containerIds: ReadonlySet<string>): number[] {
  return processArgs()
    .filter(({ args }) => path.basename(args[0] ?? '') === RELAY_BINARY_NAME && args[1] === HOLD_FLAG && containerIds.has(args[2] ?? ''))
    .map(({ pid }) => pid);
}

export async function runShimBench(
  rounds: number,
  options: ShimBenchOptions = {},
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<ShimBenchResult> {
  await ensureGuestAssets();
  const root = packageRoot();
  const modes = options.modes ?? ['pod', 'node'];
  const podCounts = [...(options.podCounts ?? [1, 5, 10])].sort((a, b) => a - b);
  const stale = options.forceTsx === true ? '--shim-tsx' : distStaleness(root);
  const shimCode: ShimCode = stale === null || (options.forceDist === true && stale !== '--shim-tsx') ? 'dist' : 'tsx';
  const shimCodeWhy =
    stale === null
      ? 'compiled dist/ (fresh: every src/ file built)'
      : shimCode === 'dist'
        ? `compiled dist/ (--shim-dist, though not fresh: ${stale})`
        : stale === '--shim-tsx'
          ? 'the sources through tsx (--shim-tsx)'
          : `the sources through tsx: dist/ is not fresh (${stale}); run \`npm run build\` to bench the compiled shim`;
  progress(`shim code: ${shimCodeWhy}${options.front === true ? ', through the native start front' : ''}`);
  const label = options.containerd ?? '2.1';
  const found = await containerdRelease(label);
  if (found.release === null) throw new Error(`containerd ${label} cannot run here: ${found.missing}`);
  const release = found.release;
  progress(`containerd: ${release.versionText} (${release.source})`);

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
  const configPath = path.join(dir, 'kata-ts-shim.json');
  /** The shim's config in `mode`: every shim invocation reads it, so the next pod runs in that mode. */
  const writeShimConfig = async (mode: BenchShimMode) =>
    fsp.writeFile(
      configPath,
      JSON.stringify(
        shimTestConfig(dir, stateRoot, {
          logLevel: 'info',
          shim: { stateRoot, mode },
          // Several TCG boots at once on a loaded machine: wait on the boot, not a clock sized for an idle one.
          hypervisor: { ...guestDirConfig(), readyTimeoutMs: 900_000 },
          // Bound inside the harness's node (a mount namespace that goes with it).
          mountNamespacePath: path.join(dir, 'mntns', 'mnt'),
        }),
      ),
    );

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
        // The node server leaves 30 s after its last pod: it must not outlive the harness.
        const deadline = Date.now() + 90_000;
        while (nodeServerPids(ctrd.grpcAddress).length > 0 && Date.now() < deadline) await sleep(500);
        for (const pid of nodeServerPids(ctrd.grpcAddress)) {
          leftovers.push(`node shim server ${pid} still running 90 s after the last pod`);
          process.kill(pid, 'SIGKILL');
        }
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
  /** The containers of each shim pod (their output holders are found by container id). */
  const podContainers = new Map<string, string[]>();
  /**
   * `pid action` of every short-lived shim invocation and pod-mode serve of this bench's
   * containerd running (any pod: one runs at a time); the node server (shared, leaves 30 s after
   * its last pod) and the relays (whose revive command names the binary) are not counted here.
   * Only this containerd's (its address is on every invocation's command line): other sessions'
   * tests run the same shim binary behind their own containerd, and their processes held each
   * removal here for its whole 120 s bound. Nor the serve processes of pods still running (the
   * memory readings remove their pods one by one, each of the others' serve still up).
   */
  const shimProcesses = () => {
    const live = new Set([...doors.values()].flatMap((d) => [...d.live]));
    return processArgs()
      .filter(
        ({ args }) =>
          args.includes(shimBin) &&
          !(args.at(-1) === 'serve' && args.some((a, i) => a === '-id' && live.has(args[i + 1] ?? ''))) &&
          ctrd !== undefined &&
          args.includes(ctrd.grpcAddress) &&
          args.at(-1) !== 'node-serve' &&
          path.basename(args[0] ?? '') !== RELAY_BINARY_NAME,
      )
      .map(({ pid, args }) => `${pid} ${args.at(-1)}`);
  };

  /**
   * StopPodSandbox + RemovePodSandbox; for a shim pod, then waits for its serve process (or its
   * relay) and state dir to go, and for containerd's background `delete` invocations to end.
   */
  async function removePod(door: Door, sid: string): Promise<void> {
    await door.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
    await door.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    door.live.delete(sid);
    if (door.mode === undefined) return;
    const podDir = path.join(stateRoot, 'k8s.io', sid.slice(0, 16));
    const holders = new Set(podContainers.get(sid) ?? []);
    podContainers.delete(sid);
    const own = () => [...servePids(sid), ...relayPids(stateRoot, sid), ...holderPids(holders)];
    const deadline = Date.now() + 60_000;
    while ((own().length > 0 || existsSync(podDir)) && Date.now() < deadline) await sleep(100);
    const pids = own();
    if (pids.length > 0)
      leftovers.push(`shim pod ${sid.slice(0, 12)}: serve, relay or holder ${pids.join(', ')} still running 60 s after RemovePodSandbox`);
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
    await writeShimConfig(modes[0] ?? 'pod');
    const binDir = path.join(dir, 'bin');
    await writeShimWrapper({ binDir, root, configPath, code: shimCode, peakFlagFile, peakFile, front: options.front === true });
    ctrd = await startContainerd({ registry, shimBinDir: binDir, ...(release.label === '1.6' ? {} : { release }) });
    ctrdCri = criClient(ctrd.criSocket);
    await ctrdCri.image.PullImage({ image: { image } });
    const ctrdLogs = path.join(dir, 'pods');
    const podParent = (uid: string) => `/kubepods/besteffort/pod${uid}`;
    for (const mode of modes) {
      const side: Side = mode === 'pod' ? 'shim' : 'node';
      doors.set(side, {
        side,
        cri: ctrdCri,
        runtimeHandler: KATA_TS_HANDLER,
        logRoot: ctrdLogs,
        cgroupParent: podParent,
        live: new Set(),
        mode,
      });
    }
    doors.set('runc', { side: 'runc', cri: ctrdCri, runtimeHandler: '', logRoot: ctrdLogs, cgroupParent: podParent, live: new Set() });

    const door = (side: Side): Door => doors.get(side)!;
    /** A pod (no container), for the memory readings. */
    const idlePod = async (d: Door, name: string): Promise<string> => {
      if (d.mode !== undefined) await writeShimConfig(d.mode);
      const uid = randomUUID();
      const config = {
        metadata: { name, uid, namespace: POD_NAMESPACE, attempt: 0 },
        linux: { cgroup_parent: d.cgroupParent(uid) },
      };
      const { pod_sandbox_id: sid } = await d.cri.runtime.RunPodSandbox(
        { config, runtime_handler: d.runtimeHandler },
        { deadline: Date.now() + 1_800_000 },
      );
      d.live.add(sid);
      return sid;
    };
    /**
     * A pod and its first container, timed to the container's first output line; a shim pod's
     * containers are recorded after the timing (their output holders are found by container id).
     */
    const podWithContainer = async (d: Door, name: string, afterPod?: (sid: string) => Promise<void>) => {
      if (d.mode !== undefined) await writeShimConfig(d.mode);
      const pod = await timedPodWithContainer({
        cri: d.cri,
        handler: d.runtimeHandler,
        logRoot: d.logRoot,
        namespace: POD_NAMESPACE,
        name,
        cgroupParent: (uid) => d.cgroupParent(uid),
        image,
        marker: MARKER,
        rpcDeadlineMs: 300_000,
        markerTimeoutMs: 120_000,
        onPod: (sid) => d.live.add(sid),
        ...(afterPod === undefined ? {} : { afterPod }),
      });
      if (d.mode !== undefined) {
        const { containers } = await d.cri.runtime.ListContainers({ filter: { pod_sandbox_id: pod.sandboxId } });
        podContainers.set(
          pod.sandboxId,
          containers.map((c) => c.id),
        );
      }
      return { sid: pod.sandboxId, timing: { podMs: pod.podMs, startedMs: pod.startedMs, totalMs: pod.totalMs } };
    };
    /** A pod for the memory readings: with its one container (the default), or bare. */
    const memoryPod = async (d: Door, name: string): Promise<string> =>
      options.barePods === true ? idlePod(d, name) : (await podWithContainer(d, name)).sid;
    /** PSS of every shim process of the mode now running (serve per pod, or the node server and the relays). */
    const shimPss = async (mode: BenchShimMode, sids: readonly string[]): Promise<PerPodMemory['processes']> => {
      const containers = new Set(sids.flatMap((sid) => podContainers.get(sid) ?? []));
      const procs: Array<{ kind: ShimProcessKind; pid: number }> =
        mode === 'pod'
          ? sids.flatMap((sid) => servePids(sid).map((pid) => ({ kind: 'serve' as const, pid })))
          : [
              ...nodeServerPids(ctrd!.grpcAddress).map((pid) => ({ kind: 'node-serve' as const, pid })),
              ...relayPids(stateRoot).map((pid) => ({ kind: 'relay' as const, pid })),
              ...holderPids(containers).map((pid) => ({ kind: 'holder' as const, pid })),
            ];
      const out: PerPodMemory['processes'] = [];
      for (const p of procs) out.push({ ...p, pssKiB: (await sampledSmapsRollupKiB(p.pid)).pss });
      return out;
    };

    // 3. memory per pod, first (nothing else of the bench is running then).
    const perPodMemory: PerPodMemory[] = [];
    if (options.skipMemory !== true) {
      for (const mode of modes) {
        const d = door(mode === 'pod' ? 'shim' : 'node');
        const sids: string[] = [];
        for (const count of podCounts) {
          // One after another, or together with --parallel (only the memory at rest is read; but
          // on a loaded machine TCG guests booting together miss the agent's keepalive pings).
          const t0 = performance.now();
          const names = Array.from({ length: count - sids.length }, (_, i) => `mem-${mode}-${sids.length + i}`);
          const started: Array<PromiseSettledResult<string>> = [];
          if (options.parallel === true) started.push(...(await Promise.allSettled(names.map((name) => memoryPod(d, name)))));
          else for (const name of names) started.push(...(await Promise.allSettled([memoryPod(d, name)])));
          for (const r of started) if (r.status === 'fulfilled') sids.push(r.value);
          const failed = started.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
          if (failed.length > 0)
            throw new Error(`memory (${mode} mode): ${failed.length} pods did not start: ${String(failed[0]!.reason)}`);
          progress(`memory (${mode} mode): ${sids.length} pods running after ${(performance.now() - t0).toFixed(0)} ms`);
          // Settled: the last boot's garbage collected, the agents' connections idle.
          await sleep(5_000);
          const processes = await shimPss(mode, sids);
          const withContainer = options.barePods !== true;
          // Pod mode: a serve per pod. Node mode: the server, a relay per pod, a holder per container.
          const expected = mode === 'pod' ? count : 1 + count + (withContainer ? count : 0);
          if (processes.length !== expected)
            leftovers.push(`memory (${mode} mode, ${count} pods): ${processes.length} shim processes found, ${expected} expected`);
          const pssSumKiB = processes.reduce((a, p) => a + p.pssKiB, 0);
          const reading = {
            mode,
            pods: count,
            withContainer,
            pssSumKiB,
            perPodMiB: pssSumKiB / 1024 / count,
            processes,
            loadavg1: os.loadavg()[0]!,
          };
          perPodMemory.push(reading);
          progress(
            `memory (${mode} mode): ${count} pods, shim PSS ${(pssSumKiB / 1024).toFixed(1)} MiB, ${reading.perPodMiB.toFixed(1)} MiB per pod`,
          );
        }
        for (const sid of sids) await removePod(d, sid);
      }
    }

    const sides: Side[] =
      options.skipTiming === true ? [] : [...modes.map((m): Side => (m === 'pod' ? 'shim' : 'node')), 'standalone', 'runc'];
    const result: ShimBenchResult = {
      bench: 'shim',
      date: new Date().toISOString(),
      commit: currentCommit(),
      loadavg1: [os.loadavg()[0]!, os.loadavg()[0]!],
      shimCode,
      shimCodeWhy: `${shimCodeWhy}${options.front === true ? ', through the native start front' : ''}`,
      containerd: release.versionText,
      sides,
      warmNodeServer: options.warmNodeServer === true && modes.includes('node') && sides.length > 0,
      vmShape: { shim: '', standalone: '' },
      rounds: [],
      medianMs: {},
      ratioShimStandalone: Number.NaN,
      ratioNodeStandalone: Number.NaN,
      ratioShimRunc: Number.NaN,
      roundRatios: [],
      medianRoundRatio: Number.NaN,
      goalMet: false,
      perPodMemory,
      memory: {
        podOnlyKiB: { rss: 0, pss: 0, private: 0, swap: 0 },
        oneContainerSamplesKiB: [],
        oneContainerKiB: { rss: 0, pss: 0, private: 0, swap: 0 },
        idleNodeKiB: await idleNodeMemory(),
        invocations: [],
        invocationsNote: 'not measured (--skip-timing)',
      },
      leftovers,
      logProblems: problems,
    };
    if (sides.length > 0) {
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

      // Warm-up, not counted: code paths and guest files into the page cache. The pod-mode shim's
      // warm-up pod is where the pod-alone memory and the start and delete invocations are read.
      if (result.warmNodeServer) {
        const keeper = await idlePod(door('node'), 'node-server-keeper');
        progress(`node server kept up by the bare node-mode pod ${keeper.slice(0, 12)} through the timing`);
      }
      progress('warm-up: one pod with a container through each door (not counted)');
      const timeInstalled = existsSync(GNU_TIME);
      let shimShape = '';
      if (doors.has('shim')) {
        if (timeInstalled) await fsp.writeFile(peakFlagFile, '');
        const shimWarm = await podWithContainer(door('shim'), 'warm-shim', async (sid) => {
          const [pid, ...more] = servePids(sid);
          if (pid === undefined || more.length > 0)
            throw new Error(`expected one serve process for pod ${sid}, found ${[pid, ...more].join(', ')}`);
          await sleep(2_000);
          result.memory.podOnlyKiB = await sampledSmapsRollupKiB(pid);
        });
        result.memory.oneContainerSamplesKiB.push(await serveMemory(shimWarm.sid));
        progress(`warm-up: shim ${formatTiming(shimWarm.timing)}`);
        shimShape = qemuShape(path.join(stateRoot, 'k8s.io', shimWarm.sid.slice(0, 16)));
        await removePod(door('shim'), shimWarm.sid);
        await fsp.rm(peakFlagFile, { force: true });
        result.memory.invocations = (await readShimRuns(peakFile)).map((run) => ({
          ...run,
          task: run.id === shimWarm.sid ? ('sandbox' as const) : ('container' as const),
        }));
        result.memory.invocationsNote = timeInstalled ? 'GNU time, the warm-up pod' : `not measured: ${GNU_TIME} is not installed`;
      }
      if (doors.has('node')) {
        const nodeWarm = await podWithContainer(door('node'), 'warm-node');
        progress(`warm-up: node ${formatTiming(nodeWarm.timing)}`);
        shimShape ||= qemuShape(path.join(stateRoot, 'k8s.io', nodeWarm.sid.slice(0, 16)));
        await removePod(door('node'), nodeWarm.sid);
      }
      const standaloneWarm = await podWithContainer(door('standalone'), 'warm-standalone');
      const standaloneShape = qemuShape(daemon.stateDir);
      progress(`warm-up: standalone ${formatTiming(standaloneWarm.timing)}`);
      await removePod(door('standalone'), standaloneWarm.sid);
      const runcWarm = await podWithContainer(door('runc'), 'warm-runc');
      progress(`warm-up: runc ${formatTiming(runcWarm.timing)}`);
      await removePod(door('runc'), runcWarm.sid);
      progress(`VM shape: shim ${shimShape}, standalone ${standaloneShape}`);
      result.vmShape = { shim: shimShape, standalone: standaloneShape };

      const loadBefore = os.loadavg()[0]!;
      for (let r = 0; r < rounds; r++) {
        const order = sides.map((_, i) => sides[(i + r) % sides.length]!);
        const sample = { order } as ShimBenchResult['rounds'][number];
        for (const side of order) {
          const pod = await podWithContainer(door(side), `r${r}-${side}`);
          sample[side] = pod.timing;
          if (side === 'shim') result.memory.oneContainerSamplesKiB.push(await serveMemory(pod.sid));
          await removePod(door(side), pod.sid);
        }
        result.rounds.push(sample);
        progress(
          `round ${r + 1}/${rounds} (${order.join(', ')}): ${order.map((s) => `${s} ${sample[s]!.totalMs.toFixed(0)} ms`).join(', ')}`,
        );
      }
      for (const side of sides) result.medianMs[side] = median(result.rounds.map((x) => x[side]!.totalMs));
      const m = result.medianMs;
      result.ratioShimStandalone = (m.shim ?? Number.NaN) / (m.standalone ?? Number.NaN);
      result.ratioNodeStandalone = (m.node ?? Number.NaN) / (m.standalone ?? Number.NaN);
      result.ratioShimRunc = (m.shim ?? m.node ?? Number.NaN) / (m.runc ?? Number.NaN);
      const main: Side = doors.has('node') ? 'node' : 'shim';
      result.roundRatios = result.rounds.map((x) => x[main]!.totalMs / x.standalone!.totalMs);
      result.medianRoundRatio = median(result.roundRatios);
      result.goalMet = (main === 'node' ? result.ratioNodeStandalone : result.ratioShimStandalone) <= GOAL_RATIO;
      result.loadavg1 = [loadBefore, os.loadavg()[0]!];
      if (result.memory.oneContainerSamplesKiB.length > 0)
        result.memory.oneContainerKiB = medianSmaps(result.memory.oneContainerSamplesKiB);
    }
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
  const ms = (v: number | undefined) => (v === undefined ? '-' : `${v.toFixed(0)} ms`);
  const lines = [`containerd: ${r.containerd}; shim ran ${r.shimCodeWhy}`];
  if (r.perPodMemory.length > 0) {
    const what = r.perPodMemory.every((m) => m.withContainer) ? 'with one container each' : 'bare (no container)';
    lines.push(`shim memory per pod, ${what}: PSS (smaps_rollup) summed over every shim process / pods`);
    for (const m of r.perPodMemory) {
      const kinds = new Map<string, number[]>();
      for (const p of m.processes) kinds.set(p.kind, [...(kinds.get(p.kind) ?? []), p.pssKiB]);
      const detail = [...kinds].map(([k, v]) => `${v.length} ${k} ${mib(v.reduce((a, b) => a + b, 0))}`).join(', ');
      lines.push(
        `  ${m.mode} mode, ${String(m.pods).padStart(2)} pods: ${mib(m.pssSumKiB)} in all, ${m.perPodMiB.toFixed(1)} MiB per pod (${detail}; load ${m.loadavg1.toFixed(1)})`,
      );
    }
    const at = (mode: BenchShimMode) => r.perPodMemory.filter((m) => m.mode === mode).at(-1);
    const [pod, node] = [at('pod'), at('node')];
    if (pod !== undefined && node !== undefined)
      lines.push(
        `  at ${node.pods} pods: node / pod mode ${(node.perPodMiB / pod.perPodMiB).toFixed(3)}; goal <= ${GOAL_MEMORY_PER_POD_MIB} MiB per pod: node ${node.perPodMiB <= GOAL_MEMORY_PER_POD_MIB ? 'met' : 'not met'}, pod ${pod.perPodMiB <= GOAL_MEMORY_PER_POD_MIB ? 'met' : 'not met'}`,
      );
  }
  if (r.sides.length > 0) {
    lines.push(
      `pod + first container until its first output line in the CRI log (${r.rounds.length} rounds, order rotating; load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
      `  node server: ${r.warmNodeServer ? 'kept up by a bare node-mode pod (--warm-node-server)' : 'started by each node-mode pod (it leaves 30 s after its last pod)'}`,
      `  VM shape: shim ${r.vmShape.shim}; standalone ${r.vmShape.standalone}${r.vmShape.shim === r.vmShape.standalone ? ' (same)' : ' (DIFFERENT)'}`,
      ...r.rounds.map(
        (s, i) => `  round ${i + 1} (${s.order.join(', ')}): ${s.order.map((side) => `${side} ${formatTiming(s[side]!)}`).join('; ')}`,
      ),
      `  median: ${r.sides.map((side) => `${side} ${ms(r.medianMs[side])}`).join(', ')}`,
      `  shim (pod mode) / standalone ${r.ratioShimStandalone.toFixed(3)}; node mode / standalone ${r.ratioNodeStandalone.toFixed(3)} (goal <= ${GOAL_RATIO.toFixed(2)}: ${r.goalMet ? 'met' : 'not met'}); per round ${r.roundRatios.map((x) => x.toFixed(3)).join(', ')}, their median ${r.medianRoundRatio.toFixed(3)}`,
      `  shim / runc ${r.ratioShimRunc.toFixed(1)}`,
      `the pod-mode shim's serve process, one per pod (smaps_rollup, median of 5 readings):`,
      `  pod alone:       ${mem(r.memory.podOnlyKiB)}`,
      `  one container:   ${mem(r.memory.oneContainerKiB)} (median of ${r.memory.oneContainerSamplesKiB.length} pods; PSS ${r.memory.oneContainerSamplesKiB.map((m) => (m.pss / 1024).toFixed(1)).join(' / ')} MiB)`,
      `the shim's start and delete invocations (${r.memory.invocationsNote}):${r.memory.invocations.length === 0 ? ' none recorded' : ''}`,
      ...r.memory.invocations.map((run) => `  ${run.action} (${run.task}): peak RSS ${mib(run.maxRssKiB)}, ${run.elapsedMs.toFixed(0)} ms`),
    );
  }
  lines.push(
    `Kata's Go shim (containerd-shim-kata-v2), published: ~${KATA_GO_SHIM_PSS_MB} MB PSS per pod; an idle node process, for scale: ${mem(r.memory.idleNodeKiB)}`,
    r.leftovers.length === 0 ? 'left behind: nothing' : `left behind:\n${r.leftovers.map((l) => `  ${l}`).join('\n')}`,
    r.logProblems.shimCount === 0
      ? "the shim's log (through containerd's): no warning or error"
      : `the shim's log (through containerd's): ${r.logProblems.shimCount} warning/error lines, the last ${r.logProblems.shimLast.length}:\n${r.logProblems.shimLast.map((l) => `  ${l}`).join('\n')}`,
    `containerd's own warnings and errors: ${r.logProblems.containerd.length === 0 ? 'none' : r.logProblems.containerd.map((p) => `${p.count}x ${p.level} "${p.msg}"`).join(', ')}`,
  );
  return lines.join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      containerd: { type: 'string', default: '2.1' },
      modes: { type: 'string', default: 'pod,node' },
      pods: { type: 'string', default: '1,5,10' },
      'skip-timing': { type: 'boolean', default: false },
      'skip-memory': { type: 'boolean', default: false },
      'bare-pods': { type: 'boolean', default: false },
      parallel: { type: 'boolean', default: false },
      'warm-node-server': { type: 'boolean', default: false },
      'shim-tsx': { type: 'boolean', default: false },
      'shim-dist': { type: 'boolean', default: false },
      'shim-front': { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
    },
  });
  const containerd = values.containerd;
  if (containerd !== '2.1' && containerd !== '1.6') throw new Error(`--containerd must be 2.1 or 1.6, not ${containerd}`);
  const modes = values.modes.split(',').filter((m) => m !== '');
  for (const m of modes) if (m !== 'pod' && m !== 'node') throw new Error(`--modes takes pod and node, not ${m}`);
  const podCounts = values.pods.split(',').map((n) => Number(n));
  for (const n of podCounts) if (!Number.isInteger(n) || n < 1) throw new Error(`--pods takes positive integers, not ${values.pods}`);
  const missing = containerdMissing();
  if (missing !== null) {
    process.stderr.write(`bench shim skipped: ${missing}\n`);
    if (values.json) process.stdout.write(`${JSON.stringify({ bench: 'shim', skipped: missing })}\n`);
  } else {
    const result = await runShimBench(Number(values.rounds), {
      forceTsx: values['shim-tsx'],
      forceDist: values['shim-dist'],
      front: values['shim-front'],
      containerd,
      modes: modes as BenchShimMode[],
      podCounts,
      skipTiming: values['skip-timing'],
      skipMemory: values['skip-memory'],
      barePods: values['bare-pods'],
      parallel: values.parallel,
      warmNodeServer: values['warm-node-server'],
    });
    process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatShimReport(result)}\n`);
  }
}
