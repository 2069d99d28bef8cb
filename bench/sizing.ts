/**
 * Sizing throughput: how many plans per second planSizing() makes for a pod of 64 containers
 * (4 init containers, 4 sidecars, 56 regular ones, each with requests and limits), measured side
 * by side with a baseline of the same pod shape cut down to 1 container. Rounds alternate the two
 * cases so machine noise hits both alike; the result is the ratio, not an absolute time.
 *
 *   node --import tsx bench/sizing.ts [--rounds N] [--round-ms MS]
 */
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { defaultConfig } from '../src/config/defaults.js';
import { resolveHandler } from '../src/config/handlers.js';
import type { ContainerResourceConfigInput, PodSandboxConfigInput } from '../src/sizing/input.js';
import { planSizing } from '../src/sizing/shape.js';

const q = (text: string) => ({ string: text });

function benchContainer(i: number): ContainerResourceConfigInput {
  const type = i < 8 ? (i % 2 === 0 ? 'INIT_CONTAINER' : 'SIDECAR_CONTAINER') : 'REGULAR_CONTAINER';
  return {
    name: `container-${i}`,
    type,
    kubernetes_resources: {
      requests: { cpu: q(`${50 + (i % 5) * 10}m`), memory: q(`${32 + (i % 4) * 16}Mi`) },
      limits: { cpu: q('200m'), memory: q('128Mi'), ...(i === 10 ? { 'hugepages-2Mi': q('64Mi') } : {}) },
    },
    mounts: [],
    devices: [],
    CDI_devices: [],
  };
}

export function benchPod(containers: number): PodSandboxConfigInput {
  return {
    metadata: { name: `bench-${containers}`, namespace: 'bench', uid: 'bench-uid', attempt: 0 },
    annotations: {},
    linux: { cgroup_parent: '/kubepods/burstable/podbench', overhead: null, resources: null },
    pod_resources: {
      containers: Array.from({ length: containers }, (_, i) => benchContainer(containers === 1 ? 8 : i)),
      kubernetes_resources: null,
    },
  };
}

export interface SizingBenchResult {
  plansPerSecond64: number;
  plansPerSecond1: number;
  /** How many 1-container plans fit in the time of one 64-container plan. */
  ratio: number;
}

/** Run `fn` for about `ms` milliseconds; return plans per second. */
function measure(fn: () => unknown, ms: number): number {
  const budget = BigInt(ms) * 1_000_000n;
  const start = process.hrtime.bigint();
  let n = 0;
  let elapsed = 0n;
  do {
    for (let i = 0; i < 50; i++) fn();
    n += 50;
    elapsed = process.hrtime.bigint() - start;
  } while (elapsed < budget);
  return (n * 1e9) / Number(elapsed);
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export function runSizingBench(rounds = 10, roundMs = 200): SizingBenchResult {
  const handler = resolveHandler(defaultConfig(), 'kata-ts');
  const host = { cpus: 64, memoryMiB: 262_144 };
  const big = benchPod(64);
  const small = benchPod(1);
  const planBig = () => planSizing({ config: big, handler, host });
  const planSmall = () => planSizing({ config: small, handler, host });
  if (planBig().containers.length !== 64 || planSmall().containers.length !== 1) throw new Error('bench pods are not what they claim');
  measure(planBig, roundMs); // warm-up (JIT)
  measure(planSmall, roundMs);
  const bigRates: number[] = [];
  const smallRates: number[] = [];
  for (let r = 0; r < rounds; r++) {
    // Alternate which case goes first, so neither always runs on a warmer or cooler machine.
    if (r % 2 === 0) {
      bigRates.push(measure(planBig, roundMs));
      smallRates.push(measure(planSmall, roundMs));
    } else {
      smallRates.push(measure(planSmall, roundMs));
      bigRates.push(measure(planBig, roundMs));
    }
  }
  const plansPerSecond64 = median(bigRates);
  const plansPerSecond1 = median(smallRates);
  return { plansPerSecond64, plansPerSecond1, ratio: plansPerSecond1 / plansPerSecond64 };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({ options: { rounds: { type: 'string' }, 'round-ms': { type: 'string' } } });
  const rounds = Number(values.rounds ?? 10);
  const roundMs = Number(values['round-ms'] ?? 200);
  const r = runSizingBench(rounds, roundMs);
  const fmt = (n: number) => Math.round(n).toLocaleString('en-US');
  console.log(`sizing: planSizing() throughput, median of ${rounds} alternating rounds of ${roundMs} ms`);
  console.log(`  pod with 64 containers : ${fmt(r.plansPerSecond64)} plans/s`);
  console.log(`  pod with  1 container  : ${fmt(r.plansPerSecond1)} plans/s (baseline)`);
  console.log(
    `  ratio                  : one 64-container plan costs ${r.ratio.toFixed(1)}x a 1-container plan (${(r.ratio / 64).toFixed(2)}x per container)`,
  );
}
