import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { type BenchDaemon, benchPodConfig, createBenchDaemon } from './lib/daemon.js';
import { median } from './lib/proc.js';

const UNCONFINED = 'kata-ts-unconfined';
const GOAL_RATIO = 1.02;

export interface ConfineBenchResult {
  rounds: Array<{
    first: 'confined' | 'unconfined';
    confinedMs: number;
    unconfinedMs: number;
    confinedCpuMs: number;
    unconfinedCpuMs: number;
  }>;
  medianConfinedMs: number;
  medianUnconfinedMs: number;
  ratio: number;
  /**
   * QEMU's own CPU time (user + system) until the pod answered ready: much less disturbed by other
   * load on the machine than wall time, and where a seccomp filter's per-call cost would show.
   */
  cpuRatio: number;
  /** The median of each round's confined/unconfined ratio: the pair shares the machine's moment. */
  pairedRatio: number;
  /** Host-side setup (planned -> QEMU started), medians from the daemon's log. */
  setupConfinedMs: number;
  setupUnconfinedMs: number;
  goalMet: boolean;
}

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ: 100 on Linux/x86). */
const USER_HZ = 100;

/** CPU time (user + system) a process has used, from /proc/<pid>/stat fields 14 and 15. */
function cpuMs(pid: number): number {
  const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state): utime is field 14, stime field 15.
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / USER_HZ;
}

async function boot(daemon: BenchDaemon, name: string, handler: string): Promise<{ id: string; ms: number; qemuCpuMs: number }> {
  const t0 = performance.now();
  const { pod_sandbox_id: id } = await daemon.cri.runtime.RunPodSandbox({
    config: benchPodConfig(daemon, name, { app: name, 'kata-ts.dev/bench': 'confine' }),
    runtime_handler: handler,
  });
  const ms = performance.now() - t0;
  const status = await daemon.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
  const qemuCpuMs = cpuMs((JSON.parse(status.info.info!) as { pid: number }).pid);
  await daemon.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
  return { id, ms, qemuCpuMs };
}

/** planned -> QEMU started, per sandbox id, from the daemon's JSON log. */
async function setupMs(daemon: BenchDaemon, ids: string[]): Promise<number[]> {
  const lines = await daemon.logLines();
  // pino's time is an ISO string here (src/common/logger.ts).
  const at = (id: string, msg: string) => {
    const time = lines.find((l) => l.sandboxId === id && l.msg === msg)?.time;
    return typeof time === 'string' ? Date.parse(time) : undefined;
  };
  return ids.flatMap((id) => {
    const planned = at(id, 'sandbox planned');
    const started = at(id, 'QEMU started (paused)');
    return planned === undefined || started === undefined ? [] : [started - planned];
  });
}

export async function runConfineBench(rounds: number, progress: (line: string) => void): Promise<ConfineBenchResult> {
  await ensureGuestAssets();
  const daemon = await createBenchDaemon({
    handlers: {
      [UNCONFINED]: { vmmConfinement: { seccomp: false, unprivileged: false, optOutReason: 'bench: the unconfined baseline' } },
    },
  });
  try {
    await daemon.start();
    progress('warm-up: one pod of each (not counted)');
    await boot(daemon, 'warm-c', 'kata-ts');
    await boot(daemon, 'warm-u', UNCONFINED);
    const samples: ConfineBenchResult['rounds'] = [];
    const ids = { confined: [] as string[], unconfined: [] as string[] };
    for (let r = 0; r < rounds; r++) {
      const first: 'confined' | 'unconfined' = r % 2 === 0 ? 'confined' : 'unconfined';
      const run = async (kind: 'confined' | 'unconfined') => {
        const booted = await boot(daemon, `${kind}-${r}`, kind === 'confined' ? 'kata-ts' : UNCONFINED);
        ids[kind].push(booted.id);
        return booted;
      };
      const a = await run(first);
      const b = await run(first === 'confined' ? 'unconfined' : 'confined');
      const [c, u] = first === 'confined' ? [a, b] : [b, a];
      const s = { first, confinedMs: c.ms, unconfinedMs: u.ms, confinedCpuMs: c.qemuCpuMs, unconfinedCpuMs: u.qemuCpuMs };
      samples.push(s);
      progress(
        `round ${r + 1}/${rounds} (${first} first): confined ${s.confinedMs.toFixed(0)} ms (QEMU CPU ${s.confinedCpuMs} ms), unconfined ${s.unconfinedMs.toFixed(0)} ms (QEMU CPU ${s.unconfinedCpuMs} ms)`,
      );
    }
    const medianConfinedMs = median(samples.map((s) => s.confinedMs));
    const medianUnconfinedMs = median(samples.map((s) => s.unconfinedMs));
    const ratio = medianConfinedMs / medianUnconfinedMs;
    return {
      rounds: samples,
      medianConfinedMs,
      medianUnconfinedMs,
      ratio,
      cpuRatio: median(samples.map((s) => s.confinedCpuMs)) / median(samples.map((s) => s.unconfinedCpuMs)),
      pairedRatio: median(samples.map((s) => s.confinedMs / s.unconfinedMs)),
      setupConfinedMs: median(await setupMs(daemon, ids.confined)),
      setupUnconfinedMs: median(await setupMs(daemon, ids.unconfined)),
      goalMet: ratio <= GOAL_RATIO,
    };
  } finally {
    await daemon.cleanup();
  }
}

export function formatConfineReport(r: ConfineBenchResult): string {
  return [
    'confined VMM: RunPodSandbox-to-ready, confined (seccomp, own uid, no capabilities, jail) vs unconfined (root)',
    `  rounds                  ${r.rounds.length}`,
    `  median confined         ${r.medianConfinedMs.toFixed(0)} ms`,
    `  median unconfined       ${r.medianUnconfinedMs.toFixed(0)} ms`,
    `  ratio                   ${r.ratio.toFixed(3)} (goal <= ${GOAL_RATIO}: ${r.goalMet ? 'met' : 'NOT met'})`,
    `  paired                  median of the rounds' ratios ${r.pairedRatio.toFixed(3)}`,
    `  QEMU CPU time to ready  ratio of medians ${r.cpuRatio.toFixed(3)}`,
    `  host setup (planned -> QEMU started), median: confined ${r.setupConfinedMs.toFixed(0)} ms, unconfined ${r.setupUnconfinedMs.toFixed(0)} ms`,
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({ options: { rounds: { type: 'string', default: '5' }, json: { type: 'boolean' } } });
  const rounds = Number(values.rounds);
  if (!Number.isSafeInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive whole number, not ${values.rounds}`);
  const result = await runConfineBench(rounds, (line) => process.stderr.write(`${line}\n`));
  process.stdout.write(values.json === true ? `${JSON.stringify({ bench: 'confine', ...result })}\n` : `${formatConfineReport(result)}\n`);
}
