/** The boot bench's result document (its JSON line) and its text table. */
import type { BareMode } from './bare-qemu.js';

export interface RoundSample {
  round: number;
  /** Which of the two booted first in this round (alternates). */
  first: 'runtime' | 'bare';
  /** RunPodSandbox call to response, through the CRI socket. */
  runtimeMs: number;
  /** Bare QEMU spawn to the KATA_TS_READY line. */
  bareMs: number;
  runtimeQemuRssKiB: number | undefined;
  bareQemuRssKiB: number | undefined;
}

export interface BootBenchResult {
  bench: 'boot';
  date: string;
  /** `git rev-parse --short=12 HEAD`, null outside a git checkout. */
  commit: string | null;
  /** 1-minute load average before and after: other work on the machine shows here. */
  host: { cpus: number; accel: string; loadavg1Before: number; loadavg1After: number };
  bareMode: BareMode;
  pod: {
    source: string;
    vcpus: number;
    maxVcpus: number;
    memoryMiB: number;
    maxMemoryMiB: number;
    guestVcpus: number;
    guestMemoryKiB: number;
  };
  /** The cgroup limits the runtime's QEMU ran under (the bare one runs in the bench's own cgroup). */
  placement: { cpuQuotaMillicores: number; memoryLimitBytes: number };
  warmupRuntimeMs: number;
  rounds: RoundSample[];
  medianRuntimeMs: number;
  medianBareMs: number;
  /** median(runtime) / median(bare). */
  ratio: number;
  /** The median of the per-round ratios, a second view less sensitive to one slow round. */
  medianRoundRatio: number;
  overheadPct: number;
  /** ratio < 1.10; reported, never asserted. */
  goalMet: boolean;
  memory: {
    /** Right after start, before any rpc. */
    daemonFreshRssKiB: number;
    /** Index n: VmRSS with n sandboxes running (index 0: after the timing rounds, none running). */
    daemonRssBySandboxesKiB: number[];
    incrementsKiB: number[];
    /** Least-squares slope over the readings above, and its value at 0 sandboxes. */
    slopeKiBPerSandbox: number;
    baselineKiB: number;
    /** QEMU's own RSS, for reference: it is not the daemon's. */
    qemuRssKiB: { runtimeAtReady: Array<number | null>; bareAtReady: Array<number | null>; running: number[] };
  };
}

const mib = (kib: number): string => (kib / 1024).toFixed(1);
const signedMib = (kib: number): string => `${kib >= 0 ? '+' : ''}${mib(kib)}`;
const pad = (text: string | number, width: number): string => String(text).padStart(width);

function medianOf(values: Array<number | null>): number | undefined {
  const known = values.filter((v): v is number => v !== null).sort((a, b) => a - b);
  if (known.length === 0) return undefined;
  const mid = Math.floor(known.length / 2);
  return known.length % 2 === 1 ? known[mid]! : (known[mid - 1]! + known[mid]!) / 2;
}

export function formatBootReport(r: BootBenchResult): string {
  const out: string[] = [];
  const how = r.bareMode === 'direct' ? 'direct: -S dropped, no QMP' : 'paused: -S kept, QMP cont sent at once';
  out.push(`boot: RunPodSandbox-to-ready vs bare QEMU to the same KATA_TS_READY line, ${r.rounds.length} alternating rounds`);
  out.push(
    `  host: ${r.host.cpus} CPUs, accel ${r.host.accel}, load ${r.host.loadavg1Before.toFixed(2)} -> ${r.host.loadavg1After.toFixed(2)}; bare mode ${how}; ${r.date}${r.commit === null ? '' : `, commit ${r.commit}`}`,
  );
  out.push(
    `  pod (${r.pod.source}): ${r.pod.vcpus} vCPU (max ${r.pod.maxVcpus}), ${r.pod.memoryMiB} MiB (max ${r.pod.maxMemoryMiB}); ` +
      `guest sees ${r.pod.guestVcpus} vCPU, ${r.pod.guestMemoryKiB} KiB`,
  );
  const quota = r.placement.cpuQuotaMillicores === 0 ? 'no CPU quota' : `CPU quota ${r.placement.cpuQuotaMillicores}m`;
  const memLimit =
    r.placement.memoryLimitBytes === 0 ? 'no memory limit' : `memory limit ${Math.round(r.placement.memoryLimitBytes / 2 ** 20)} MiB`;
  out.push(
    `  runtime's QEMU cgroup: ${quota}, ${memLimit} (bare QEMU: none); warm-up boot ${r.warmupRuntimeMs.toFixed(0)} ms, not counted`,
  );
  out.push('');
  out.push(`  round  first    runtime ms   bare ms   ratio`);
  for (const s of r.rounds) {
    out.push(
      `  ${pad(s.round, 5)}  ${s.first.padEnd(7)}  ${pad(s.runtimeMs.toFixed(0), 10)}  ${pad(s.bareMs.toFixed(0), 8)}  ${(s.runtimeMs / s.bareMs).toFixed(3)}`,
    );
  }
  out.push(
    `  median          ${pad(r.medianRuntimeMs.toFixed(0), 10)}  ${pad(r.medianBareMs.toFixed(0), 8)}  ${r.ratio.toFixed(3)}  (median of per-round ratios ${r.medianRoundRatio.toFixed(3)})`,
  );
  out.push(
    `  overhead: ${r.overheadPct >= 0 ? '+' : ''}${r.overheadPct.toFixed(1)}% of bare (${(r.medianRuntimeMs - r.medianBareMs).toFixed(0)} ms); ` +
      `goal < 10%: ${r.goalMet ? 'met' : 'NOT met'}`,
  );
  out.push('');
  const m = r.memory;
  out.push(`memory: daemon VmRSS (median of 5 readings 200 ms apart)`);
  out.push(`  fresh daemon, before any rpc       : ${mib(m.daemonFreshRssKiB)} MiB`);
  out.push(
    `  ${`with 0..${m.daemonRssBySandboxesKiB.length - 1} sandboxes running`.padEnd(35)}: ${m.daemonRssBySandboxesKiB.map(mib).join(' / ')} MiB`,
  );
  out.push(`  increments per added sandbox       : ${m.incrementsKiB.map(signedMib).join(', ')} MiB`);
  out.push(`  per sandbox (least-squares slope)  : ${signedMib(m.slopeKiBPerSandbox)} MiB; baseline (fit at 0) ${mib(m.baselineKiB)} MiB`);
  const q = m.qemuRssKiB;
  const runtimeQ = medianOf(q.runtimeAtReady);
  const bareQ = medianOf(q.bareAtReady);
  out.push(
    `  QEMU's own VmRSS (not the daemon's): at ready, runtime median ${runtimeQ === undefined ? '?' : mib(runtimeQ)} MiB, ` +
      `bare median ${bareQ === undefined ? '?' : mib(bareQ)} MiB; ${q.running.length} running: ${q.running.map(mib).join(' / ')} MiB`,
  );
  return out.join('\n');
}
