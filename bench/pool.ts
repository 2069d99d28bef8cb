import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { confidentialHandlerProfile, defaultHandlerProfile } from '../src/config/defaults.js';
import { startVirtiofsd } from '../src/hypervisor/virtiofsd.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { bareArgv, bootBare, killBareQemus, msToFirstBytes } from './lib/bare-qemu.js';
import { benchPodConfig, createBenchDaemon } from './lib/daemon.js';
import { median, sleep } from './lib/proc.js';

export interface PoolBenchResult {
  bench: 'pool';
  date: string;
  loadavg1: [number, number];
  rounds: Array<{ pooledMs: number; coldMs: number; bareAgentMs: number }>;
  medianPooledMs: number;
  medianColdMs: number;
  medianBareAgentMs: number;
  pooledToCold: number;
  pooledToBare: number;
  refillCpuMs: number[];
  refillWallMs: number[];
  execIdleMs: number[];
  execDuringRefillMs: number[];
  execRatio: number;
}

interface PoolStatus {
  handler: string;
  ready: number;
  booting: number;
  lastBootMs: number | null;
  lastBootCpuMs: number | null;
}

export async function runPoolBench(
  rounds: number,
  execs: number,
  progress = (l: string) => process.stderr.write(`${l}\n`),
): Promise<PoolBenchResult> {
  await ensureGuestAssets();
  const registry = await startRegistry();
  const profile = defaultHandlerProfile();
  const rt = await createBenchDaemon({
    handlers: { 'kata-ts': profile, 'kata-ts-cold': profile, 'kata-ts-cvm': confidentialHandlerProfile() },
    pool: { sizes: { 'kata-ts': 1 } },
  });
  const barePids = new Set<number>();
  try {
    const image = await pushBusyboxImage(registry, 'bench/busybox', '1.0', ['sleep', 'true']);
    await allowLoopbackRegistries(rt);
    const loadBefore = os.loadavg()[0]!;
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const poolStatus = async (): Promise<PoolStatus> => {
      const { info } = await rt.cri.runtime.Status({ verbose: true });
      return (JSON.parse(info.pool ?? '[]') as PoolStatus[]).find((s) => s.handler === 'kata-ts')!;
    };
    const poolFull = async (): Promise<PoolStatus> => {
      for (;;) {
        const s = await poolStatus();
        if (s.ready === 1 && s.booting === 0) return s;
        await sleep(250);
      }
    };
    let n = 0;
    const startContainer = async (sid: string, config: object) => {
      const { container_id: id } = await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: { metadata: { name: `c${n++}`, attempt: 0 }, image: { image }, command: ['sleep', '100000'] },
        sandbox_config: config,
      });
      await rt.cri.runtime.StartContainer({ container_id: id });
      return id;
    };
    const podWithContainer = async (name: string, handler: string) => {
      const config = benchPodConfig(rt, name);
      const t0 = performance.now();
      const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config, runtime_handler: handler });
      const cid = await startContainer(sid, config);
      return { sid, cid, ms: performance.now() - t0 };
    };
    const removePod = async (sid: string) => {
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    };

    progress('warm-up: a cold pod (its argv is the bare baseline); the pool fills meanwhile');
    const warm = await podWithContainer('warm', 'kata-ts-cold');
    const info = JSON.parse((await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: warm.sid, verbose: true })).info.info!) as {
      workDir: string;
      confinement: { vmmDir: string | null } | null;
      plan: { qemu: { binary: string; argv: string[] } };
      origin: { kind: string } | null;
    };
    if (info.origin?.kind !== 'cold') throw new Error('the warm-up pod was not cold');

    // 3. exec round trips in the warm pod, the pool full, then while a refill boots.
    const execOnce = async (): Promise<number> => {
      const t0 = performance.now();
      await rt.cri.runtime.ExecSync({ container_id: warm.cid, cmd: ['true'], timeout: 60 });
      return performance.now() - t0;
    };
    const refillCpuMs: number[] = [];
    const refillWallMs: number[] = [];
    const full = await poolFull();
    if (full.lastBootCpuMs !== null) refillCpuMs.push(full.lastBootCpuMs);
    if (full.lastBootMs !== null) refillWallMs.push(full.lastBootMs);
    const execIdleMs: number[] = [];
    for (let i = 0; i < execs; i++) execIdleMs.push(await execOnce());
    const execDuringRefillMs: number[] = [];

    const samples: PoolBenchResult['rounds'] = [];
    for (let r = 0; r < rounds; r++) {
      const s = { pooledMs: 0, coldMs: 0, bareAgentMs: 0 };
      const pooled = async () => {
        await poolFull();
        const pod = await podWithContainer(`pooled-${r}`, 'kata-ts');
        s.pooledMs = pod.ms;
        // The refill boots now: exec round trips meanwhile (while it is still booting).
        for (let i = 0; i < execs; i++) {
          const st = await poolStatus();
          if (st.booting === 0) break;
          execDuringRefillMs.push(await execOnce());
        }
        await removePod(pod.sid);
        const after = await poolFull();
        if (after.lastBootCpuMs !== null) refillCpuMs.push(after.lastBootCpuMs);
        if (after.lastBootMs !== null) refillWallMs.push(after.lastBootMs);
      };
      const cold = async () => {
        await poolFull();
        const pod = await podWithContainer(`cold-${r}`, 'kata-ts-cold');
        s.coldMs = pod.ms;
        await removePod(pod.sid);
      };
      const bare = async () => {
        await poolFull();
        const dir = path.join(rt.dir, `bare-${r}`);
        const shared = path.join(rt.dir, `bare-${r}-shared`);
        await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
        await fsp.mkdir(shared, { recursive: true });
        const socketPath = path.join(dir, 'vfs.sock');
        const argv = bareArgv(info.plan.qemu.argv, info.confinement?.vmmDir ?? info.workDir, dir, 'direct').map((a) =>
          a.startsWith('socket,id=virtiofs,path=') ? `socket,id=virtiofs,path=${socketPath}` : a,
        );
        const t0 = performance.now();
        const vfs = await startVirtiofsd({
          socketPath,
          sourceDir: shared,
          logFile: path.join(rt.dir, `bare-${r}-vfs.log`),
          logger: silentLogger(),
        });
        const vfsMs = performance.now() - t0;
        const agentSocket = argv
          .find((a) => a.startsWith('socket,id=agent,path='))
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
          s.bareAgentMs = vfsMs + (await agentUp);
          await boot.stop();
          barePids.delete(boot.pid);
        } finally {
          await vfs.stop();
        }
      };
      const order = r % 2 === 0 ? [pooled, cold, bare] : [bare, cold, pooled];
      for (const step of order) await step();
      samples.push(s);
      progress(
        `round ${r + 1}/${rounds}: pooled ${s.pooledMs.toFixed(0)} ms, cold ${s.coldMs.toFixed(0)} ms, bare to agent ${s.bareAgentMs.toFixed(0)} ms`,
      );
    }
    await removePod(warm.sid);
    const m = (k: keyof PoolBenchResult['rounds'][number]) => median(samples.map((x) => x[k]));
    return {
      bench: 'pool',
      date: new Date().toISOString(),
      loadavg1: [loadBefore, os.loadavg()[0]!],
      rounds: samples,
      medianPooledMs: m('pooledMs'),
      medianColdMs: m('coldMs'),
      medianBareAgentMs: m('bareAgentMs'),
      pooledToCold: m('pooledMs') / m('coldMs'),
      pooledToBare: m('pooledMs') / m('bareAgentMs'),
      refillCpuMs,
      refillWallMs,
      execIdleMs,
      execDuringRefillMs,
      execRatio: execDuringRefillMs.length === 0 ? Number.NaN : median(execDuringRefillMs) / median(execIdleMs),
    };
  } finally {
    killBareQemus(barePids);
    await rt.cleanup();
    await registry.stop();
  }
}

export function formatPoolReport(r: PoolBenchResult): string {
  const ms = (v: number) => `${v.toFixed(0)} ms`;
  return [
    `pool: pod + first container, pooled vs cold vs bare QEMU to the agent's first bytes (${r.rounds.length} rounds; load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
    ...r.rounds.map((s, i) => `  round ${i + 1}: pooled ${ms(s.pooledMs)}, cold ${ms(s.coldMs)}, bare ${ms(s.bareAgentMs)}`),
    `  median: pooled ${ms(r.medianPooledMs)}, cold ${ms(r.medianColdMs)}, bare ${ms(r.medianBareAgentMs)}`,
    `  pooled / cold ${r.pooledToCold.toFixed(3)} (goal <= 0.25: ${r.pooledToCold <= 0.25 ? 'met' : 'not met'}); pooled / bare ${r.pooledToBare.toFixed(3)} (goal <= 0.3: ${r.pooledToBare <= 0.3 ? 'met' : 'not met'})`,
    `refill: QEMU CPU time per pooled VM ${r.refillCpuMs.map(ms).join(', ')} (median ${ms(median(r.refillCpuMs))}); wall ${r.refillWallMs.map(ms).join(', ')}`,
    `exec round trip: pool full median ${ms(median(r.execIdleMs))} (${r.execIdleMs.length}), during a refill median ${r.execDuringRefillMs.length === 0 ? 'n/a' : ms(median(r.execDuringRefillMs))} (${r.execDuringRefillMs.length}); ratio ${r.execRatio.toFixed(2)}`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      execs: { type: 'string', default: '8' },
      json: { type: 'boolean', default: false },
    },
  });
  const result = await runPoolBench(Number(values.rounds), Number(values.execs));
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatPoolReport(result)}\n`);
}
