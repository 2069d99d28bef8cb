/**
 * Exec through the streaming server (Exec rpc, SPDY upgrade as client-go speaks it, streams,
 * status) side by side with the same command run by the agent and crun in the guest without
 * the streaming path (ExecSync: the agent's exec through crun, output collected by the agent
 * client), in one pod VM and one run:
 *
 * 1. round-trip latency of `true`: ratio streaming / ExecSync;
 * 2. stdout throughput of `head -c 3 MiB /dev/zero` (MiB/s each): ratio streaming / ExecSync.
 *
 * Rounds alternate which side goes first. Medians; nothing is asserted.
 *
 *   node --import tsx bench/streaming.ts [--rounds N] [--json]
 */

import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { podConfig } from '../test/helpers/runtime-daemon.js';
import { spdyCommand } from '../test/helpers/streaming-client.js';
import { createBenchDaemon } from './lib/daemon.js';
import { median } from './lib/proc.js';

/** Below the gRPC client's 4 MiB message limit, which bounds the ExecSync baseline. */
const BYTES = 3 * 1024 * 1024;

export interface StreamingBenchResult {
  rounds: number;
  streamTrueMs: number[];
  syncTrueMs: number[];
  streamMiBps: number[];
  syncMiBps: number[];
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

export async function runStreamingBench(rounds: number, progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`)) {
  await ensureGuestAssets();
  const registry = await startRegistry();
  // The handlers' defaults (the VMM budget holds TCG's bounded translation cache since it is planned).
  const rt = await createBenchDaemon();
  try {
    const image = await pushBusyboxImage(registry, 'bench/busybox', 'stream', ['sleep', 'head']);
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const sandboxConfig = { ...podConfig(rt, 'bench'), log_directory: path.join(rt.dir, 'logs') };
    const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig });
    const { container_id: id } = await rt.cri.runtime.CreateContainer({
      pod_sandbox_id: sid,
      config: { metadata: { name: 'holder', attempt: 0 }, image: { image }, command: ['sleep', '100000'], log_path: 'holder.log' },
      sandbox_config: sandboxConfig,
    });
    await rt.cri.runtime.StartContainer({ container_id: id });
    const stream = async (cmd: string[]) => {
      const { url } = await rt.cri.runtime.Exec({ container_id: id, cmd, stdout: true, stderr: true });
      const r = await spdyCommand(url);
      return r.stdout.length;
    };
    const sync = async (cmd: string[]) => (await rt.cri.runtime.ExecSync({ container_id: id, cmd, timeout: 60 })).stdout.length;
    const big = ['head', '-c', String(BYTES), '/dev/zero'];
    await stream(['true']);
    await sync(['true']);
    const r: StreamingBenchResult = { rounds, streamTrueMs: [], syncTrueMs: [], streamMiBps: [], syncMiBps: [] };
    const mib = BYTES / (1024 * 1024);
    for (let i = 0; i < rounds; i++) {
      const steps: Array<() => Promise<void>> = [
        async () => {
          r.streamTrueMs.push(await timed(() => stream(['true'])));
          r.streamMiBps.push(mib / ((await timed(() => stream(big))) / 1000));
        },
        async () => {
          r.syncTrueMs.push(await timed(() => sync(['true'])));
          r.syncMiBps.push(mib / ((await timed(() => sync(big))) / 1000));
        },
      ];
      for (const step of i % 2 === 0 ? steps : steps.reverse()) await step();
      progress(`round ${i + 1}/${rounds}: true ${r.streamTrueMs.at(-1)!.toFixed(0)} vs ${r.syncTrueMs.at(-1)!.toFixed(0)} ms`);
    }
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    return r;
  } finally {
    await rt.cleanup();
    await registry.stop();
  }
}

export function formatStreamingReport(r: StreamingBenchResult): string {
  return [
    `exec through the streaming server vs ExecSync (${r.rounds} rounds, alternating)`,
    `  true round trip: streaming median ${median(r.streamTrueMs).toFixed(1)} ms, ExecSync ${median(r.syncTrueMs).toFixed(1)} ms, ratio ${(median(r.streamTrueMs) / median(r.syncTrueMs)).toFixed(2)}`,
    `  stdout 3 MiB: streaming median ${median(r.streamMiBps).toFixed(1)} MiB/s, ExecSync ${median(r.syncMiBps).toFixed(1)} MiB/s, ratio ${(median(r.streamMiBps) / median(r.syncMiBps)).toFixed(2)}`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({ options: { rounds: { type: 'string', default: '5' }, json: { type: 'boolean', default: false } } });
  const result = await runStreamingBench(Number(values.rounds));
  process.stdout.write(values.json ? `${JSON.stringify({ bench: 'streaming', ...result })}\n` : `${formatStreamingReport(result)}\n`);
}
