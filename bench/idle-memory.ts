/**
 * An idle pod's host memory, with and without free page reporting, against a bare QEMU booted to
 * the same point, in one run:
 *
 * - **pod**: RunPodSandbox + CreateContainer + StartContainer (busybox `sleep`) through a real
 *   `kata-ts serve`; from StartContainer's answer the pod is left idle and its host memory is
 *   read at 5, 10, 15, 30, 45 and 60 s: PSS (smaps_rollup) of its QEMU + its virtiofsd + the
 *   daemon's share (the daemon's PSS then minus its PSS just before RunPodSandbox). While the pod
 *   boots (RunPodSandbox to StartContainer's answer) its QEMU's PSS is read every 250 ms (the QEMU
 *   found by the daemon's state directory in its argv): the boot's high-water mark.
 * - **bare**: the runtime's own argv for that pod (PodSandboxStatus verbose `plan.qemu.argv`, as
 *   bench/boot.ts takes it) run by hand with its virtiofsd, until the agent's first bytes on its
 *   port (the guest booted and its agent running: the point where the pod's container starts),
 *   then read the same way for 60 s: PSS of QEMU + virtiofsd (its QEMU's PSS read every 250 ms
 *   while it boots, too).
 *
 * Two handlers of one daemon: `kata-ts` (defaults: free page reporting on) and `kata-ts-nofpr`
 * (the same with `vm.freePageReporting: false`). One VM at a time, in the order pod-on, bare-on,
 * pod-off, bare-off. Printed: each trajectory (the boot's peak, then the series after the start),
 * the 60 s values, the ratios pod / bare, last / first reading after the start and last / boot
 * peak (falling after boot?), and Kata Containers' published 122 MB per pod beside them. The goal
 * (<= 1.1x bare and falling after boot: the 60 s value at least 2% below the highest reading,
 * boot included) is printed as met or not; nothing is asserted.
 *
 *   node --import tsx bench/idle-memory.ts [--rounds N] [--idle-s S] [--json]
 *
 * Needs root, QEMU and the guest with the real agent: KATA_TS_GUEST_DIR, else the installed one.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { defaultHandlerProfile } from '../src/config/defaults.js';
import { startVirtiofsd } from '../src/hypervisor/virtiofsd.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { bareArgv, killBareQemus } from './lib/bare-qemu.js';
import { type BenchDaemon, createBenchDaemon } from './lib/daemon.js';
import { median, processArgs, readSmapsRollupKiB, sampledSmapsRollupKiB, sleep } from './lib/proc.js';

/** Kata Containers' published memory per pod (the figure the issue compares with), in MB. */
const KATA_PUBLISHED_MB_PER_POD = 122;
const GOAL_RATIO = 1.1;
const SAMPLE_AT_S = [5, 10, 15, 30, 45, 60];
/** How often QEMU's PSS is read while the VM boots. */
const BOOT_SAMPLE_MS = 250;
/** "Falling": the last reading at least this much below the highest one. */
const FALLING_FRACTION = 0.98;
const VIRTIOFS_CHARDEV = 'virtiofs';
const AGENT_CHARDEV = 'agent';
const HANDLERS = { on: 'kata-ts', off: 'kata-ts-nofpr' } as const;
type Reporting = keyof typeof HANDLERS;

interface Trajectory {
  /** Seconds after the container started (pod) or the agent's first bytes (bare) -> PSS in KiB. */
  pssKiBAt: Record<string, number>;
  /** The same readings, QEMU's part alone (what the boot peak compares with). */
  qemuKiBAt: Record<string, number>;
  /** The parts at the last reading. */
  partsKiB: Record<string, number>;
  /** The highest PSS of the VM's QEMU while it booted (sampled every BOOT_SAMPLE_MS), in KiB. */
  bootPeakQemuKiB?: number;
  /** Pod only: the daemon's PSS minus its PSS before RunPodSandbox, at each reading (may be < 0). */
  daemonShareRawKiB?: number[];
}

interface RoundResult {
  reporting: Reporting;
  pod: Trajectory;
  bare: Trajectory;
}

function pssKiB(pid: number): number {
  return readSmapsRollupKiB(pid)?.pss ?? Number.NaN;
}

/** Read `parts()` at each of SAMPLE_AT_S (cut at idleS) seconds after `t0`. */
async function follow(t0: number, idleS: number, parts: () => Record<string, number>): Promise<Trajectory> {
  const pssKiBAt: Record<string, number> = {};
  const qemuKiBAt: Record<string, number> = {};
  let last: Record<string, number> = {};
  for (const at of SAMPLE_AT_S.filter((s) => s <= idleS)) {
    const wait = t0 + at * 1000 - performance.now();
    if (wait > 0) await sleep(wait);
    last = parts();
    pssKiBAt[String(at)] = Object.values(last).reduce((a, b) => a + b, 0);
    qemuKiBAt[String(at)] = last.qemu ?? Number.NaN;
  }
  return { pssKiBAt, qemuKiBAt, partsKiB: last };
}

/**
 * Reads the PSS of the QEMU `findPid` names (once it exists) every BOOT_SAMPLE_MS until stopped;
 * `stop` answers the highest reading (NaN if none).
 */
function bootPeak(findPid: () => number | undefined): { stop: () => number } {
  let pid: number | undefined;
  let peak = Number.NaN;
  const timer = setInterval(() => {
    pid ??= findPid();
    if (pid === undefined) return;
    const kib = pssKiB(pid);
    if (!Number.isNaN(kib) && !(kib <= peak)) peak = kib;
  }, BOOT_SAMPLE_MS);
  return {
    stop: () => {
      clearInterval(timer);
      return peak;
    },
  };
}

/** The QEMU whose argv names `dir` (the bench daemon's state directory). */
function qemuUnder(dir: string): number | undefined {
  return processArgs().find((p) => /qemu-system/.test(p.args[0] ?? '') && p.args.some((a) => a.includes(dir)))?.pid;
}

/** Resolves when something arrives on the unix socket (retried until it exists). */
async function firstBytes(socketPath: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await new Promise<boolean>((resolve) => {
      const sock = net.connect(socketPath);
      sock.once('data', () => {
        resolve(true);
        sock.destroy();
      });
      sock.once('error', () => resolve(false));
      sock.once('close', () => resolve(false));
    });
    if (got) return;
    if (Date.now() > deadline) throw new Error(`no bytes on ${socketPath} within ${timeoutMs} ms`);
    await sleep(50);
  }
}

export async function runIdleMemoryBench(rounds: number, idleS: number, progress: (l: string) => void): Promise<Record<string, unknown>> {
  await ensureGuestAssets();
  const registry = await startRegistry();
  const profile = defaultHandlerProfile();
  const rt: BenchDaemon = await createBenchDaemon({
    defaultHandler: HANDLERS.on,
    // Boots on a loaded shared machine take minutes under TCG; this bench measures memory, not time.
    hypervisor: { readyTimeoutMs: 600_000 },
    handlers: {
      [HANDLERS.on]: profile,
      [HANDLERS.off]: { ...profile, vm: { ...profile.vm, freePageReporting: false } },
    },
  });
  const barePids = new Set<number>();
  const results: RoundResult[] = [];
  const loadBefore = os.loadavg()[0]!;
  try {
    const image = await pushBusyboxImage(registry, 'bench/busybox', '1.0', ['sleep']);
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const daemonPid = rt.pid();

    const pod = async (reporting: Reporting): Promise<{ trajectory: Trajectory; argv: string[]; binary: string; fromDir: string }> => {
      const uid = randomBytes(8).toString('hex');
      const config = {
        metadata: { name: `idle-${reporting}`, namespace: 'kata-ts-bench', uid, attempt: 0 },
        linux: { cgroup_parent: rt.cgroupParent(uid) },
      };
      const daemonBefore = (await sampledSmapsRollupKiB(daemonPid)).pss;
      const boot = bootPeak(() => qemuUnder(rt.dir));
      const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config, runtime_handler: HANDLERS[reporting] });
      try {
        const { container_id: cid } = await rt.cri.runtime.CreateContainer({
          pod_sandbox_id: sid,
          config: { metadata: { name: 'sleep', attempt: 0 }, image: { image }, command: ['sleep', '100000'] },
          sandbox_config: config,
        });
        await rt.cri.runtime.StartContainer({ container_id: cid });
        const t0 = performance.now();
        const bootPeakQemuKiB = boot.stop();
        const info = JSON.parse((await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid, verbose: true })).info.info!) as {
          pid: number;
          workDir: string;
          confinement: { vmmDir: string | null } | null;
          virtiofsd: { pid: number } | null;
          plan: { qemu: { binary: string; argv: string[] } };
        };
        const vfsPid = info.virtiofsd?.pid;
        const daemonShareRawKiB: number[] = [];
        const trajectory = await follow(t0, idleS, () => {
          // The daemon's PSS moves with its garbage collector by more than one pod costs it: a
          // difference below 0 counts as 0 in the total (the raw differences are in the JSON).
          const raw = (readSmapsRollupKiB(daemonPid)?.pss ?? Number.NaN) - daemonBefore;
          daemonShareRawKiB.push(raw);
          return {
            qemu: pssKiB(info.pid),
            virtiofsd: vfsPid === undefined ? 0 : pssKiB(vfsPid),
            daemonShare: Math.max(0, raw),
          };
        });
        trajectory.daemonShareRawKiB = daemonShareRawKiB;
        trajectory.bootPeakQemuKiB = bootPeakQemuKiB;
        return { trajectory, argv: info.plan.qemu.argv, binary: info.plan.qemu.binary, fromDir: info.confinement?.vmmDir ?? info.workDir };
      } finally {
        boot.stop();
        await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
        await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      }
    };

    const bare = async (template: { argv: string[]; binary: string; fromDir: string }, tag: string): Promise<Trajectory> => {
      const dir = path.join(rt.dir, `bare-${tag}`);
      const shared = path.join(rt.dir, `bare-${tag}-shared`);
      await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
      await fsp.mkdir(shared, { recursive: true });
      const socketPath = path.join(dir, 'vfs.sock');
      const argv = bareArgv(template.argv, template.fromDir, dir, 'direct').map((a) =>
        a.startsWith(`socket,id=${VIRTIOFS_CHARDEV},path=`) ? `socket,id=${VIRTIOFS_CHARDEV},path=${socketPath}` : a,
      );
      const agentSocket = argv
        .find((a) => a.startsWith(`socket,id=${AGENT_CHARDEV},path=`))
        ?.split('path=')[1]
        ?.split(',')[0];
      if (agentSocket === undefined) throw new Error('the runtime argv has no agent socket');
      const vfs = await startVirtiofsd({ socketPath, sourceDir: shared, logFile: path.join(dir, 'virtiofsd.log'), logger: silentLogger() });
      const { spawn } = await import('node:child_process');
      const logFd = await fsp.open(path.join(dir, 'qemu.log'), 'w');
      const child = spawn(template.binary, argv, { detached: true, stdio: ['ignore', logFd.fd, logFd.fd] });
      await logFd.close();
      const pid = child.pid!;
      barePids.add(pid);
      child.unref();
      const boot = bootPeak(() => pid);
      try {
        await firstBytes(agentSocket, 600_000);
        const t0 = performance.now();
        const bootPeakQemuKiB = boot.stop();
        const trajectory = await follow(t0, idleS, () => ({ qemu: pssKiB(pid), virtiofsd: pssKiB(vfs.pid) }));
        return { ...trajectory, bootPeakQemuKiB };
      } finally {
        boot.stop();
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
        barePids.delete(pid);
        await vfs.stop();
      }
    };

    for (let r = 0; r < rounds; r++) {
      for (const reporting of ['on', 'off'] as const) {
        progress(`round ${r + 1}: pod with free page reporting ${reporting}`);
        const p = await pod(reporting);
        progress(`  pod  ${fmtTrajectory(p.trajectory)}`);
        const b = await bare(p, `${r}-${reporting}`);
        progress(`  bare ${fmtTrajectory(b)}`);
        results.push({ reporting, pod: p.trajectory, bare: b });
      }
    }
  } finally {
    killBareQemus(barePids);
    await rt.cleanup();
    await registry.stop();
  }
  const summary = Object.fromEntries(
    (['on', 'off'] as const).map((reporting) => [
      reporting,
      summarize(
        results.filter((x) => x.reporting === reporting),
        idleS,
      ),
    ]),
  );
  return {
    bench: 'idle-memory',
    date: new Date().toISOString(),
    rounds,
    idleS,
    loadavg1: [loadBefore, os.loadavg()[0]!],
    kataPublishedMBPerPod: KATA_PUBLISHED_MB_PER_POD,
    results,
    summary,
  };
}

interface Summary {
  /** Totals (QEMU + virtiofsd [+ daemon share]) at the last reading, medians over rounds, MiB. */
  podMiB: number;
  bareMiB: number;
  ratio: number;
  /** The pod's first reading after the start, and last / first. */
  podFirstMiB: number;
  podLastOverFirst: number;
  /** The pod's QEMU: highest reading (boot peak or after the start) and the last one / it. */
  podQemuPeakMiB: number;
  podQemuLastMiB: number;
  podQemuLastOverPeak: number;
  bareQemuPeakMiB: number;
  bareQemuLastOverPeak: number;
  /** The pod's QEMU ends at least 2% below its highest reading. */
  fallingAfterBoot: boolean;
}

function qemuPeakKiB(t: Trajectory): number {
  return Math.max(t.bootPeakQemuKiB ?? Number.NEGATIVE_INFINITY, ...Object.values(t.qemuKiBAt).filter((v) => !Number.isNaN(v)));
}

function summarize(of: RoundResult[], idleS: number): Summary {
  const ats = SAMPLE_AT_S.filter((s) => s <= idleS).map(String);
  const first = ats[0]!;
  const last = ats.at(-1)!;
  const m = (f: (x: RoundResult) => number): number => median(of.map(f));
  const podMiB = m((x) => x.pod.pssKiBAt[last]! / 1024);
  const bareMiB = m((x) => x.bare.pssKiBAt[last]! / 1024);
  const podFirstMiB = m((x) => x.pod.pssKiBAt[first]! / 1024);
  const podQemuPeakMiB = m((x) => qemuPeakKiB(x.pod) / 1024);
  const podQemuLastMiB = m((x) => x.pod.qemuKiBAt[last]! / 1024);
  const bareQemuPeakMiB = m((x) => qemuPeakKiB(x.bare) / 1024);
  const bareQemuLastMiB = m((x) => x.bare.qemuKiBAt[last]! / 1024);
  return {
    podMiB,
    bareMiB,
    ratio: podMiB / bareMiB,
    podFirstMiB,
    podLastOverFirst: podMiB / podFirstMiB,
    podQemuPeakMiB,
    podQemuLastMiB,
    podQemuLastOverPeak: podQemuLastMiB / podQemuPeakMiB,
    bareQemuPeakMiB,
    bareQemuLastOverPeak: bareQemuLastMiB / bareQemuPeakMiB,
    fallingAfterBoot: podQemuLastMiB <= podQemuPeakMiB * FALLING_FRACTION,
  };
}

function fmtTrajectory(t: Trajectory): string {
  const at = Object.entries(t.pssKiBAt)
    .map(([s, kib]) => `${s}s ${(kib / 1024).toFixed(0)}`)
    .join(', ');
  const parts = Object.entries(t.partsKiB)
    .map(([k, kib]) => `${k} ${(kib / 1024).toFixed(1)}`)
    .join(' + ');
  const values = Object.values(t.pssKiBAt);
  const boot = t.bootPeakQemuKiB === undefined ? '' : `QEMU boot peak ${(t.bootPeakQemuKiB / 1024).toFixed(0)}; `;
  return `${boot}PSS MiB at ${at} (last / first ${(values.at(-1)! / values[0]!).toFixed(3)}; last: ${parts})`;
}

function format(result: Record<string, unknown>): string {
  const s = result.summary as Record<Reporting, Summary>;
  const kataMiB = (KATA_PUBLISHED_MB_PER_POD * 1e6) / 2 ** 20;
  const line = (r: Reporting): string => {
    const x = s[r];
    const met = x.ratio <= GOAL_RATIO && x.fallingAfterBoot;
    return [
      `  free page reporting ${r.padEnd(3)}: pod ${x.podMiB.toFixed(0)} MiB, bare ${x.bareMiB.toFixed(0)} MiB, pod/bare ${x.ratio.toFixed(2)}x, pod/Kata ${(x.podMiB / kataMiB).toFixed(2)}x; goal <= ${GOAL_RATIO}x and falling: ${met ? 'met' : 'not met'}`,
      `      pod after the start: first ${x.podFirstMiB.toFixed(0)} -> last ${x.podMiB.toFixed(0)} MiB (last / first ${x.podLastOverFirst.toFixed(3)}); pod QEMU peak ${x.podQemuPeakMiB.toFixed(0)} -> ${x.podQemuLastMiB.toFixed(0)} MiB (last / peak ${x.podQemuLastOverPeak.toFixed(3)}); bare QEMU last / peak ${x.bareQemuLastOverPeak.toFixed(3)}`,
    ].join('\n');
  };
  return [
    `idle pod host memory ${result.idleS} s after the container started (PSS: QEMU + virtiofsd + daemon share), medians of ${result.rounds} round(s), load ${(result.loadavg1 as number[]).map((l) => l.toFixed(1)).join(' -> ')}:`,
    line('on'),
    line('off'),
    `  with / without reporting: pod ${(s.on.podMiB / s.off.podMiB).toFixed(2)}x, bare ${(s.on.bareMiB / s.off.bareMiB).toFixed(2)}x`,
    `  Kata Containers' published figure: ${KATA_PUBLISHED_MB_PER_POD} MB (${kataMiB.toFixed(0)} MiB) per pod`,
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: { rounds: { type: 'string', default: '1' }, 'idle-s': { type: 'string', default: '60' }, json: { type: 'boolean' } },
  });
  const result = await runIdleMemoryBench(Number(values.rounds), Number(values['idle-s']), (l) => console.error(l));
  console.log(values.json === true ? JSON.stringify(result) : format(result));
}
