/**
 * Fault-injection soak: a seeded loop of CRI requests (pods run, stopped and removed, containers
 * created, started, stopped and removed, exec, resize) over the socket of a real `kata-ts serve`
 * (real VMs, a real registry on loopback, the cgroupfs driver under a private parent), with faults
 * injected at spread-out points, in turn: SIGKILL of the daemon (and restart), SIGKILL of a QEMU,
 * SIGKILL of a virtiofsd, and a hung guest (its QEMU SIGSTOPped for a few seconds, then SIGCONT:
 * QMP `stop` cannot be sent from outside, since QEMU's QMP socket serves one client and the daemon
 * holds it), the agent SIGKILLed inside the guest (by a container in the guest's root PID
 * namespace; the guest's init restarts it), and a registry that drops every blob transfer midway
 * (a pull through it must fail as UNAVAILABLE and leave no partial file), and a full disk (the
 * state dir and the pods' log dirs are small tmpfs, filled to their last page by ballast files:
 * reads and execs keep answering, a new pod, container and pull are refused RESOURCE_EXHAUSTED and
 * change nothing, the daemon restarts on the full disk and finds everything again, and the tickers'
 * logs catch up without a gap once there is room again), on pods with a CNI network (see
 * SoakOptions.podNetwork). After every fault and at the end the invariants are checked:
 * - every listed sandbox is READY and usable (a container starts in it) or NOTREADY and removable
 *   (Stop + Remove succeed); no id and no pod uid is listed twice;
 * - the orphan audit finds nothing under the state dir nor a pod network namespace (with its TAP)
 *   that no record names, and no `kata-ts-<id>` cgroup under the soak's private cgroup parent
 *   belongs to no record; a READY pod has its pod IP (with `--network cni`, the default);
 * - each pod's ticker container (printing tick-0, tick-1, ... ) has a CRI log with every tick from
 *   0 on, none lost, none twice;
 * - a killed QEMU turns its sandbox NOTREADY (latency measured: p50/p99; not within 10 s is a violation).
 * Prints `soak: N requests, N faults, N invariant violations`; exits 1 on any violation.
 *
 * The run is in phases: setUp + prepare, runWithFaults, endChecks, removePods, cleanUp (always); the
 * faults are in bench/lib/soak-faults.ts, the invariants in bench/lib/soak-checks.ts.
 *
 *   node --import tsx bench/soak.ts [--requests 1000] [--faults 40] [--seed 1] [--kinds disk-full,...] [--network cni|none] [--json]
 */

import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { netnsNameFor } from '../src/network/index.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { createNetworkNode } from '../test/helpers/network-node.js';
import { mountTmpfs } from '../test/helpers/runtime-daemon.js';
import { createBenchDaemon } from './lib/daemon.js';
import { checkInvariants, checkTicker } from './lib/soak-checks.js';
import {
  bootPod,
  call,
  containerCycle,
  FAULT_KINDS,
  type FaultKind,
  type Pod,
  portOf,
  type Soak,
  type SoakOptions,
  type SoakResult,
  signal,
} from './lib/soak-context.js';
import { injectFault } from './lib/soak-faults.js';

export { FAULT_KINDS, type FaultKind, type SoakOptions, type SoakResult } from './lib/soak-context.js';

/** The state dir is a tmpfs this small, so the disk-full fault can fill it in a moment. */
const STATE_DISK_MIB = 256;
/** The pods' log directories are on a tmpfs too, filled with the state disk. */
const LOG_DISK_MIB = 64;

/** mulberry32: a small seeded PRNG, so a run can be repeated. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((sorted.length * p) / 100) - 1))]!;
}

export async function runSoak(opts: SoakOptions): Promise<SoakResult> {
  const soak = await setUp(opts);
  try {
    await prepare(soak);
    await runWithFaults(soak);
    await endChecks(soak);
    await removePods(soak);
    return soak.result;
  } finally {
    await cleanUp(soak);
  }
}

/** Setup, part one: the guest assets, the registry, the network node and the daemon (not started). */
async function setUp(opts: SoakOptions): Promise<Soak> {
  const progress = opts.progress ?? ((l: string) => process.stderr.write(`${l}\n`));
  const random = prng(opts.seed);
  const startedAtMs = Date.now();
  await ensureGuestAssets();
  const registry = await startRegistry();
  const podNetwork = opts.podNetwork ?? true;
  const node = podNetwork ? await createNetworkNode() : undefined;
  const rt = await createBenchDaemon(node === undefined ? {} : { network: node.networkConfig() }, {
    stateTmpfsMiB: STATE_DISK_MIB,
    netnsPath: node?.netnsPath,
  });
  const result: SoakResult = {
    requests: 0,
    faults: 0,
    faultKinds: Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>,
    violations: [],
    notReadyMs: [],
    boots: 0,
    resizes: 0,
    failed: 0,
    durationMs: 0,
  };
  return {
    opts,
    progress,
    random,
    startedAtMs,
    registry,
    node,
    podNetwork,
    rt,
    logDisk: path.join(rt.dir, 'logs'),
    result,
    pods: new Map<string, Pod>(),
    everyPod: [],
    images: { image: '', unpullable: '', onFullDisk: '' },
    seq: { pod: 0, container: 0 },
  };
}

/**
 * Setup, part two (under runSoak's clean-up): the images pushed, the log disk mounted, the
 * registry relayed into the node, the daemon started and the image every container runs pulled.
 */
async function prepare(soak: Soak): Promise<void> {
  const { registry, rt } = soak;
  soak.images.image = await pushBusyboxImage(registry, 'soak/busybox', '1.0', ['sleep', 'grep']);
  soak.images.unpullable = await pushBusyboxImage(registry, 'soak/dropped', '1.0', ['sleep', 'grep', 'wc']);
  soak.images.onFullDisk = await pushBusyboxImage(registry, 'soak/full', '1.0', ['sleep', 'head']);
  await allowLoopbackRegistries(rt);
  // The pods' log directories (the kubelet's /var/log/pods) on a small disk of their own, under
  // the runtime's temp dir: rt.cleanup() unmounts it with everything mounted there.
  await mountTmpfs(soak.logDisk, LOG_DISK_MIB, 'kata-ts-soak-logs');
  await soak.node?.relayLoopbackPort(portOf(registry.host));
  await rt.start();
  await call(soak, soak.rt.cri.image.PullImage({ image: { image: soak.images.image } }));
}

/**
 * The loop: seeded requests on the first pod (booted when there is none), and every so many
 * requests a fault of the next kind, until the request budget is spent or the run is aborted.
 */
async function runWithFaults(soak: Soak): Promise<void> {
  const { opts, result } = soak;
  const kinds = opts.kinds ?? FAULT_KINDS;
  const faultEvery = Math.max(5, Math.floor(opts.requests / Math.max(1, opts.faults + 1)));
  let nextFault = faultEvery;
  while (result.requests < opts.requests && opts.signal?.aborted !== true) {
    let pod = [...soak.pods.values()][0];
    if (pod === undefined) pod = await bootPod(soak);
    if (result.faults < opts.faults && result.requests >= nextFault) {
      // Faults hit a READY pod; one that is not is first judged (and removed) by the invariants.
      const st = await call(soak, soak.rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id })).catch(() => undefined);
      if (st?.status?.state !== 'SANDBOX_READY') {
        await checkInvariants(soak, 'before a fault');
        continue;
      }
      nextFault += faultEvery;
      await injectFault(soak, kinds[result.faults % kinds.length]!, pod);
      continue;
    }
    try {
      await randomRequest(soak, pod);
    } catch (err) {
      // A request may fail right after a fault (the pod is NOTREADY); the invariants judge the state.
      result.failed++;
      soak.progress(`request failed: ${(err as Error).message.slice(0, 200)}`);
    }
  }
}

/** One request of the loop, chosen by the seeded PRNG: mostly cheap reads and execs, some churn. */
async function randomRequest(soak: Soak, pod: Pod): Promise<void> {
  const { random } = soak;
  const r = random();
  if (r < 0.5) {
    const { runtime, image } = soak.rt.cri;
    const cheap: Array<() => Promise<unknown>> = [
      () => runtime.Version({}),
      () => runtime.Status({}),
      () => runtime.ListPodSandbox({}),
      () => runtime.ListContainers({}),
      () => image.ListImages({}),
      () => runtime.PodSandboxStatus({ pod_sandbox_id: pod.id }),
      () => runtime.ContainerStatus({ container_id: pod.ticker }),
      () => image.ImageFsInfo({}),
    ];
    await call(soak, cheap[Math.floor(random() * cheap.length)]!());
  } else if (r < 0.75) {
    await call(soak, soak.rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['echo', 'x'], timeout: 30 }));
  } else if (r < 0.82) {
    // A resize as the kubelet sends one (in-place pod resize): the ticker's CPU and memory
    // limits within the pod's planned headroom. A refusal is logged like any failed request.
    await call(
      soak,
      soak.rt.cri.runtime.UpdateContainerResources({
        container_id: pod.ticker,
        linux: {
          cpu_period: 100_000,
          cpu_quota: 20_000 + Math.floor(random() * 80_000),
          cpu_shares: 2 + Math.floor(random() * 1022),
          memory_limit_in_bytes: (64 + Math.floor(random() * 192)) * 2 ** 20,
        },
      }),
    );
    soak.result.resizes++;
  } else if (r < 0.97) {
    await containerCycle(soak, pod);
  } else {
    await call(soak, soak.rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: pod.id }));
    await checkTicker(soak, pod, 'pod churn');
    await call(soak, soak.rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: pod.id }));
    soak.pods.delete(pod.id);
  }
}

/** The invariants once more, with the daemon started again if a Ctrl-C stopped it. */
async function endChecks(soak: Soak): Promise<void> {
  const { rt } = soak;
  if (soak.opts.signal?.aborted === true && !signal(rt.pid(), 0)) {
    // A Ctrl-C reaches the daemon too (it is in the terminal's process group) and it stops as
    // for SIGTERM, VMs left running: start it again for the end checks and the clean-up.
    await rt.stop();
    await rt.start();
  }
  await checkInvariants(soak, 'at the end');
}

/** Every remaining pod stopped and removed through the CRI, as the kubelet would. */
async function removePods(soak: Soak): Promise<void> {
  for (const pod of [...soak.pods.values()]) {
    await call(soak, soak.rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: pod.id }));
    await call(soak, soak.rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: pod.id }));
  }
}

/** Whatever happened: the daemon's log kept if asked, the daemon, the node and the registry gone. */
async function cleanUp(soak: Soak): Promise<void> {
  const { rt } = soak;
  soak.result.durationMs = Date.now() - soak.startedAtMs;
  if (process.env.KATA_TS_SOAK_LOG !== undefined) await fsp.copyFile(rt.logFile, process.env.KATA_TS_SOAK_LOG).catch(() => undefined);
  await rt.cleanup();
  await soak.node?.cleanup(soak.everyPod.map(netnsNameFor));
  await soak.registry.stop();
}

export function formatSoakReport(r: SoakResult): string {
  const kinds = Object.entries(r.faultKinds)
    .map(([k, n]) => `${k} ${n}`)
    .join(', ');
  return [
    `soak: ${r.requests} requests, ${r.faults} faults, ${r.violations.length} invariant violations`,
    `  requests of the loop that failed: ${r.failed}`,
    `  faults: ${kinds}; VM boots ${r.boots}; resizes ${r.resizes}; ${(r.durationMs / 1000).toFixed(0)} s`,
    `  dead QEMU -> NOTREADY: p50 ${percentile(r.notReadyMs, 50).toFixed(0)} ms, p99 ${percentile(r.notReadyMs, 99).toFixed(0)} ms (${r.notReadyMs.length} samples)`,
    ...r.violations.map((v) => `  violation: ${v}`),
  ].join('\n');
}

function parseKinds(list: string): FaultKind[] {
  const kinds = list.split(',').filter((k) => k !== '');
  for (const k of kinds)
    if (!(FAULT_KINDS as readonly string[]).includes(k))
      throw new Error(`--kinds: unknown fault kind "${k}" (known: ${FAULT_KINDS.join(', ')})`);
  return kinds as FaultKind[];
}

const USAGE = `usage: node --import tsx bench/soak.ts [--requests 1000] [--faults 40] [--seed 1] [--kinds ${FAULT_KINDS.join(',')}] [--network cni|none] [--json]
  Runs the fault-injection soak against a real daemon (real VMs; root, minutes to hours) and prints
  "soak: N requests, N faults, N invariant violations"; exits 1 on any violation.`;

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      requests: { type: 'string', default: '1000' },
      faults: { type: 'string', default: '40' },
      seed: { type: 'string', default: '1' },
      kinds: { type: 'string', default: FAULT_KINDS.join(',') },
      network: { type: 'string', default: 'cni' },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const stop = new AbortController();
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => stop.abort());
  const result = await runSoak({
    requests: Number(values.requests),
    faults: Number(values.faults),
    seed: Number(values.seed),
    kinds: parseKinds(values.kinds),
    podNetwork: values.network !== 'none',
    signal: stop.signal,
  });
  process.stdout.write(values.json ? `${JSON.stringify({ bench: 'soak', ...result })}\n` : `${formatSoakReport(result)}\n`);
  process.exitCode = result.violations.length === 0 ? 0 : 1;
}
