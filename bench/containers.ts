/**
 * Containers inside one running pod VM, side by side with a baseline in the same run:
 *
 * 1. container start: CreateContainer + StartContainer until the container runs (its first log
 *    line is not waited for: StartContainer answers once crun started it), against ExecSync of
 *    `true` in a running container (the same agent, crun and reaper path for one process, without
 *    the rootfs bind mount, spec, record and log pump): ratio start / exec.
 * 2. ExecSync round trip (`echo`), against the CRI `Version` rpc (the gRPC floor of the socket):
 *    ratio exec / version.
 *
 * Rounds alternate which side goes first. Medians and p95 in ms; nothing is asserted.
 *
 *   node --import tsx bench/containers.ts [--rounds N] [--json]
 */

import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { podConfig } from '../test/helpers/runtime-daemon.js';
import { createBenchDaemon } from './lib/daemon.js';
import { median } from './lib/proc.js';

function p95(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * 0.95) - 1)]!;
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

export interface ContainerBenchResult {
  rounds: number;
  startMs: number[];
  execTrueMs: number[];
  execEchoMs: number[];
  versionMs: number[];
}

export async function runContainerBench(
  rounds: number,
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<ContainerBenchResult> {
  await ensureGuestAssets();
  const registry = await startRegistry();
  // The handlers' defaults (the VMM budget holds TCG's bounded translation cache since it is planned).
  const rt = await createBenchDaemon();
  try {
    const image = await pushBusyboxImage(registry, 'bench/busybox', '1.0', ['sleep']);
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const sandboxConfig = { ...podConfig(rt, 'bench'), log_directory: path.join(rt.dir, 'logs') };
    const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig });
    let n = 0;
    const startOne = async () => {
      const name = `c${n++}`;
      const { container_id: id } = await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: { metadata: { name, attempt: 0 }, image: { image }, command: ['sleep', '100000'], log_path: `${name}.log` },
        sandbox_config: sandboxConfig,
      });
      await rt.cri.runtime.StartContainer({ container_id: id });
      return id;
    };
    const holder = await startOne();
    const exec = (cmd: string[]) => rt.cri.runtime.ExecSync({ container_id: holder, cmd, timeout: 30 });
    // Warm-up, not counted.
    await exec(['true']);
    await exec(['echo', 'warm']);
    const started: string[] = [];
    const r: ContainerBenchResult = { rounds, startMs: [], execTrueMs: [], execEchoMs: [], versionMs: [] };
    for (let i = 0; i < rounds; i++) {
      const pair: Array<() => Promise<void>> = [
        async () => {
          r.startMs.push(
            await timed(async () => {
              started.push(await startOne());
            }),
          );
        },
        async () => void r.execTrueMs.push(await timed(() => exec(['true']))),
      ];
      for (const step of i % 2 === 0 ? pair : pair.reverse()) await step();
      const rt2: Array<() => Promise<void>> = [
        async () => void r.execEchoMs.push(await timed(() => exec(['echo', 'round', String(i)]))),
        async () => void r.versionMs.push(await timed(() => rt.cri.runtime.Version({}))),
      ];
      for (const step of i % 2 === 0 ? rt2 : rt2.reverse()) await step();
      progress(`round ${i + 1}/${rounds}: start ${r.startMs.at(-1)!.toFixed(0)} ms, exec true ${r.execTrueMs.at(-1)!.toFixed(0)} ms`);
      // Keep the pod small: containers of earlier rounds go.
      while (started.length > 2) await rt.cri.runtime.RemoveContainer({ container_id: started.shift()! });
    }
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    return r;
  } finally {
    await rt.cleanup();
    await registry.stop();
  }
}

export function formatContainerReport(r: ContainerBenchResult): string {
  const line = (name: string, v: number[]) => `  ${name.padEnd(34)} median ${median(v).toFixed(1)} ms, p95 ${p95(v).toFixed(1)} ms`;
  return [
    `containers in a running pod VM (${r.rounds} rounds, alternating)`,
    line('CreateContainer + StartContainer', r.startMs),
    line('ExecSync true (baseline)', r.execTrueMs),
    `  ratio start / exec: ${(median(r.startMs) / median(r.execTrueMs)).toFixed(2)}`,
    line('ExecSync echo', r.execEchoMs),
    line('Version rpc (baseline)', r.versionMs),
    `  ratio exec / version: ${(median(r.execEchoMs) / median(r.versionMs)).toFixed(1)}`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({ options: { rounds: { type: 'string', default: '7' }, json: { type: 'boolean', default: false } } });
  const result = await runContainerBench(Number(values.rounds));
  process.stdout.write(values.json ? `${JSON.stringify({ bench: 'containers', ...result })}\n` : `${formatContainerReport(result)}\n`);
}
