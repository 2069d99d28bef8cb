/**
 * What a measured pod costs, in one run (issue 31's measures):
 *
 * 1. **vtpm pod + first container** (the `kata-ts-cvm` handler on a host without SNP or TDX:
 *    OVMF from pflash, a per-pod swtpm with its EK certificate, measured direct kernel boot)
 *    against a **`kata-ts` pod + first container** (SeaBIOS, no TPM): RunPodSandbox +
 *    CreateContainer + StartContainer through the CRI, until StartContainer answers. Goal: <= 2.0
 *    under TCG, where OVMF alone costs about twice SeaBIOS's boot.
 * 2. The same vtpm pod against a **bare QEMU with the same OVMF + swtpm argv** (taken from a
 *    warm-up vtpm pod's verbose status, its paths pointed at a directory of the bench's own, a
 *    fresh swtpm and virtiofsd started for it) until the guest's KATA_TS_READY line. Goal: <= 1.15.
 *
 * Rounds rotate which of the three goes first, so each shares the machine's moment with the others.
 *
 *   node --import tsx bench/vtpm.ts [--rounds N] [--json]
 */
import { spawn } from 'node:child_process';
import { existsSync, promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { startVirtiofsd } from '../src/hypervisor/virtiofsd.js';
import { initTpmCa } from '../src/tpm/ca.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { bootBare, killBareQemus } from './lib/bare-qemu.js';
import { type BenchDaemon, benchPodConfig, createBenchDaemon } from './lib/daemon.js';
import { median } from './lib/proc.js';

const CVM_HANDLER = 'kata-ts-cvm';
const GOAL_VS_POD = 2.0;
const GOAL_VS_BARE = 1.15;
const SWTPM_BINARY = '/usr/bin/swtpm';

export interface VtpmBenchResult {
  bench: 'vtpm';
  date: string;
  loadavg1: [number, number];
  rounds: Array<{ order: string[]; vtpmMs: number; podMs: number; bareMs: number }>;
  medianVtpmMs: number;
  medianPodMs: number;
  medianBareMs: number;
  /** vtpm pod + container / kata-ts pod + container. */
  ratioVsPod: number;
  /** vtpm pod + container / bare QEMU (same OVMF + swtpm argv) to ready. */
  ratioVsBare: number;
}

interface PodInfo {
  workDir: string;
  confinement: { vmmDir: string | null } | null;
  plan: { qemu: { binary: string; argv: string[] } };
}

/** QEMU option values double a literal comma (src/hypervisor/argv.ts does the same). */
const optionValue = (v: string) => v.replaceAll(',', ',,');

/** The value of `key=` in a QEMU option string (`a=b,key=value,...`). */
function optionOf(arg: string, key: string): string | undefined {
  return arg
    .split(/,(?!,)/)
    .find((p) => p.startsWith(`${key}=`))
    ?.slice(key.length + 1);
}

/**
 * The vtpm pod's argv for a bare run: every path under the pod's work dir (and its VMM dir, where
 * a confined QEMU's sockets and vars copy are) pointed into `dir`, `-S` dropped (QEMU runs from
 * its first instruction). Throws when a path of the pod is left.
 */
function bareVtpmArgv(argv: readonly string[], info: PodInfo, dir: string): string[] {
  const froms = [info.confinement?.vmmDir ?? null, info.workDir].filter((d): d is string => d !== null);
  const out = argv
    .filter((a) => a !== '-S')
    .map((a) => froms.reduce((acc, from) => acc.split(optionValue(from)).join(optionValue(dir)), a));
  if (out.some((a) => froms.some((from) => a.includes(from)))) throw new Error('the bare argv still names a path of the pod');
  return out;
}

async function startSwtpm(dir: string, socketPath: string): Promise<{ stop(): Promise<void> }> {
  const state = path.join(dir, 'tpm-state');
  await fsp.mkdir(state, { recursive: true, mode: 0o700 });
  await fsp.mkdir(path.dirname(socketPath), { recursive: true, mode: 0o700 });
  const child = spawn(
    SWTPM_BINARY,
    [
      'socket',
      '--tpm2',
      '--tpmstate',
      `dir=${state}`,
      '--ctrl',
      `type=unixio,path=${socketPath}`,
      '--log',
      `file=${path.join(dir, 'swtpm.log')}`,
    ],
    { stdio: 'ignore' },
  );
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  for (let i = 0; i < 500 && !existsSync(socketPath); i++) await new Promise((r) => setTimeout(r, 10));
  if (!existsSync(socketPath)) {
    child.kill('SIGKILL');
    throw new Error(`swtpm did not listen on ${socketPath}`);
  }
  return {
    stop: async () => {
      child.kill('SIGTERM');
      await exited;
    },
  };
}

export async function runVtpmBench(
  rounds: number,
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<VtpmBenchResult> {
  await ensureGuestAssets();
  const registry = await startRegistry();
  const rt: BenchDaemon = await createBenchDaemon();
  const barePids = new Set<number>();
  try {
    const image = await pushBusyboxImage(registry, 'bench/busybox', '1.0', ['sleep']);
    await allowLoopbackRegistries(rt);
    // The node's EK CA, as setup makes it (kata-ts tpm-ca init), in the bench daemon's own dir.
    const caDir = path.join(rt.dir, 'tpm-ca');
    await initTpmCa(caDir);
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    cfg.hypervisor = { ...(cfg.hypervisor as object), tpm: { caDir } };
    await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
    const loadBefore = os.loadavg()[0]!;
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });

    const podWithContainer = async (name: string, handler: string) => {
      const config = benchPodConfig(rt, name);
      const t0 = performance.now();
      const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config, runtime_handler: handler });
      const { container_id: cid } = await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: { metadata: { name: 'c', attempt: 0 }, image: { image }, command: ['sleep', '100000'] },
        sandbox_config: config,
      });
      await rt.cri.runtime.StartContainer({ container_id: cid });
      return { sid, ms: performance.now() - t0 };
    };
    const removePod = async (sid: string) => {
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    };

    progress('warm-up: a vtpm pod and a kata-ts pod (not counted); the vtpm argv is the bare baseline');
    const warm = await podWithContainer('warm-vtpm', CVM_HANDLER);
    const info = JSON.parse((await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: warm.sid, verbose: true })).info.info!) as PodInfo;
    await removePod(warm.sid);
    await removePod((await podWithContainer('warm-pod', '')).sid);

    const samples: VtpmBenchResult['rounds'] = [];
    for (let r = 0; r < rounds; r++) {
      const s = { order: [] as string[], vtpmMs: 0, podMs: 0, bareMs: 0 };
      const steps: Record<string, () => Promise<void>> = {
        vtpm: async () => {
          const pod = await podWithContainer(`vtpm-${r}`, CVM_HANDLER);
          s.vtpmMs = pod.ms;
          await removePod(pod.sid);
        },
        pod: async () => {
          const pod = await podWithContainer(`pod-${r}`, '');
          s.podMs = pod.ms;
          await removePod(pod.sid);
        },
        bare: async () => {
          const dir = path.join(rt.dir, `bare-${r}`);
          await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
          const argv = bareVtpmArgv(info.plan.qemu.argv, info, dir);
          const chardev = (id: string) => argv.find((a) => a.startsWith(`socket,id=${id},`));
          const tpmSocket = optionOf(chardev('chrtpm') ?? '', 'path');
          const vfsSocket = optionOf(chardev('virtiofs') ?? '', 'path');
          const varsFile = argv
            .map((a) => (a.includes('if=pflash') && a.includes('unit=1') ? optionOf(a, 'file') : undefined))
            .find(Boolean);
          if (tpmSocket === undefined || varsFile === undefined) throw new Error('the vtpm argv has no swtpm chardev or vars pflash');
          const shared = path.join(dir, 'shared');
          await fsp.mkdir(shared, { recursive: true });
          await fsp.mkdir(path.dirname(varsFile), { recursive: true });
          const t0 = performance.now();
          await fsp.copyFile('/usr/share/OVMF/OVMF_VARS_4M.fd', varsFile);
          const swtpm = await startSwtpm(dir, tpmSocket);
          const vfs =
            vfsSocket === undefined
              ? undefined
              : await startVirtiofsd({
                  socketPath: vfsSocket,
                  sourceDir: shared,
                  logFile: path.join(dir, 'virtiofsd.log'),
                  logger: silentLogger(),
                });
          const setupMs = performance.now() - t0;
          try {
            const boot = await bootBare({
              qemuBinary: info.plan.qemu.binary,
              argv,
              dir,
              mode: 'direct',
              readyTimeoutMs: 300_000,
              onSpawn: (pid) => barePids.add(pid),
            });
            s.bareMs = setupMs + boot.readyMs;
            await boot.stop();
            barePids.delete(boot.pid);
          } finally {
            await vfs?.stop();
            await swtpm.stop();
          }
        },
      };
      const names = Object.keys(steps);
      const order = names.map((_, i) => names[(i + r) % names.length]!);
      s.order = order;
      for (const name of order) await steps[name]!();
      samples.push(s);
      progress(
        `round ${r + 1}/${rounds} (${order.join(', ')}): vtpm ${s.vtpmMs.toFixed(0)} ms, kata-ts ${s.podMs.toFixed(0)} ms, bare ${s.bareMs.toFixed(0)} ms`,
      );
    }
    const m = (k: 'vtpmMs' | 'podMs' | 'bareMs') => median(samples.map((x) => x[k]));
    return {
      bench: 'vtpm',
      date: new Date().toISOString(),
      loadavg1: [loadBefore, os.loadavg()[0]!],
      rounds: samples,
      medianVtpmMs: m('vtpmMs'),
      medianPodMs: m('podMs'),
      medianBareMs: m('bareMs'),
      ratioVsPod: m('vtpmMs') / m('podMs'),
      ratioVsBare: m('vtpmMs') / m('bareMs'),
    };
  } finally {
    killBareQemus(barePids);
    await rt.cleanup();
    await registry.stop();
  }
}

export function formatVtpmReport(r: VtpmBenchResult): string {
  return [
    `vtpm pod + first container against a kata-ts pod + first container and a bare QEMU of the vtpm argv (${r.rounds.length} rounds; load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
    ...r.rounds.map(
      (s, i) =>
        `  round ${i + 1} (${s.order.join(', ')}): vtpm ${s.vtpmMs.toFixed(0)} ms, kata-ts ${s.podMs.toFixed(0)} ms, bare ${s.bareMs.toFixed(0)} ms`,
    ),
    `  median: vtpm ${r.medianVtpmMs.toFixed(0)} ms, kata-ts ${r.medianPodMs.toFixed(0)} ms, bare ${r.medianBareMs.toFixed(0)} ms`,
    `  vtpm / kata-ts ${r.ratioVsPod.toFixed(3)} (goal <= ${GOAL_VS_POD}: ${r.ratioVsPod <= GOAL_VS_POD ? 'met' : 'not met'})`,
    `  vtpm / bare ${r.ratioVsBare.toFixed(3)} (goal <= ${GOAL_VS_BARE}: ${r.ratioVsBare <= GOAL_VS_BARE ? 'met' : 'not met'})`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({ options: { rounds: { type: 'string', default: '3' }, json: { type: 'boolean', default: false } } });
  const result = await runVtpmBench(Number(values.rounds));
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatVtpmReport(result)}\n`);
}
