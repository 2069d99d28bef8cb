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
 *   node --import tsx bench/soak.ts [--requests 1000] [--faults 40] [--seed 1] [--kinds disk-full,...] [--network cni|none] [--json]
 */

import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { status } from '@grpc/grpc-js';
import { errnoCode } from '../src/common/errors.js';
import { NETNS_DIR, netnsNameFor } from '../src/network/index.js';
import { auditOrphans, ownersFromRecords } from '../src/runtime/sandbox/orphan-audit.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { ensureGuestAssets } from '../test/helpers/hypervisor-guest.js';
import { startProxy } from '../test/helpers/images-proxy.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { createNetworkNode } from '../test/helpers/network-node.js';
import { cgroupDirsUnder, mountTmpfs, podConfig } from '../test/helpers/runtime-daemon.js';
import { createBenchDaemon } from './lib/daemon.js';

export const FAULT_KINDS = [
  'daemon-kill',
  'qemu-kill',
  'virtiofsd-kill',
  'guest-hang',
  'agent-kill',
  'registry-drop',
  'disk-full',
] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

/** The state dir is a tmpfs this small, so the disk-full fault can fill it in a moment. */
const STATE_DISK_MIB = 256;
/** The pods' log directories are on a tmpfs too, filled with the state disk. */
const LOG_DISK_MIB = 64;

export interface SoakOptions {
  requests: number;
  faults: number;
  seed: number;
  /** The fault kinds injected, in turn (default: every kind, in FAULT_KINDS order). */
  kinds?: readonly FaultKind[];
  /**
   * Pods get a CNI network (default true): the daemon runs in a "node" network namespace of the
   * soak's own with a bridge CNI config, every pod gets its namespace, CNI ADD/DEL and a TAP, and
   * the audit also looks for pod namespaces no record names. The registry and the dropping proxy
   * stay on the host's loopback and are relayed into the node.
   */
  podNetwork?: boolean;
  progress?: (line: string) => void;
  /** Ends the loop early (SIGINT/SIGTERM in the CLI); the end checks and the clean-up still run. */
  signal?: AbortSignal;
}

export interface SoakResult {
  requests: number;
  faults: number;
  faultKinds: Record<FaultKind, number>;
  violations: string[];
  notReadyMs: number[];
  boots: number;
  /** UpdateContainerResources requests that succeeded. */
  resizes: number;
  /** Requests of the loop that failed (right after a fault, mostly): logged, judged by the invariants. */
  failed: number;
  durationMs: number;
}

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

/** Fill the file system holding `file` to its last page: write until ENOSPC. Returns the bytes written. */
async function fillDisk(file: string): Promise<number> {
  const handle = await fsp.open(file, 'wx', 0o600);
  let total = 0;
  try {
    for (const size of [1 << 20, 4096]) {
      const chunk = Buffer.alloc(size, 0x61);
      for (;;) {
        const written = await handle.write(chunk).then(
          (r) => r.bytesWritten,
          (err: unknown) => {
            if (errnoCode(err) === 'ENOSPC') return 0;
            throw err;
          },
        );
        total += written;
        if (written < size) break;
      }
    }
  } finally {
    await handle.close();
  }
  return total;
}

export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((sorted.length * p) / 100) - 1))]!;
}

interface Pod {
  id: string;
  config: Record<string, unknown>;
  logDir: string;
  ticker: string | undefined;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Send a signal to a process the soak's daemon started; false when it is already gone. */
function signal(pid: number | undefined, sig: NodeJS.Signals | 0): boolean {
  if (pid === undefined) return false;
  try {
    process.kill(pid, sig);
    return true;
  } catch {
    return false;
  }
}

export async function runSoak(opts: SoakOptions): Promise<SoakResult> {
  const progress = opts.progress ?? ((l: string) => process.stderr.write(`${l}\n`));
  const random = prng(opts.seed);
  const started = Date.now();
  await ensureGuestAssets();
  const registry = await startRegistry();
  const podNetwork = opts.podNetwork ?? true;
  const node = podNetwork ? await createNetworkNode() : undefined;
  const rt = await createBenchDaemon(node === undefined ? {} : { network: node.networkConfig() }, {
    stateTmpfsMiB: STATE_DISK_MIB,
    netnsPath: node?.netnsPath,
  });
  const logDisk = path.join(rt.dir, 'logs');
  /** Every sandbox the soak made, for the node's clean-up of any namespace left behind. */
  const everyPod: string[] = [];
  const kinds = opts.kinds ?? FAULT_KINDS;
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
  const pods = new Map<string, Pod>();
  let image = '';
  /** Counts a CRI request the soak sends (every call goes through here). */
  const call = <T>(request: Promise<T>): Promise<T> => {
    result.requests++;
    return request;
  };
  const within = (timeoutMs: number) => ({ deadline: Date.now() + timeoutMs });
  const violate = (what: string) => {
    result.violations.push(what);
    progress(`VIOLATION ${what}`);
  };

  try {
    image = await pushBusyboxImage(registry, 'soak/busybox', '1.0', ['sleep', 'grep']);
    // Pulled only through a proxy that drops every blob transfer midway (the registry-drop fault).
    const unpullable = await pushBusyboxImage(registry, 'soak/dropped', '1.0', ['sleep', 'grep', 'wc']);
    // Pulled only while the state disk is full (the disk-full fault): refused every time.
    const onFullDisk = await pushBusyboxImage(registry, 'soak/full', '1.0', ['sleep', 'head']);
    await allowLoopbackRegistries(rt);
    // The pods' log directories (the kubelet's /var/log/pods) on a small disk of their own, under
    // the runtime's temp dir: rt.cleanup() unmounts it with everything mounted there.
    await mountTmpfs(logDisk, LOG_DISK_MIB, 'kata-ts-soak-logs');
    await node?.relayLoopbackPort(portOf(registry.host));
    await rt.start();
    await call(rt.cri.image.PullImage({ image: { image } }));

    let podSeq = 0;
    const bootPod = async (): Promise<Pod> => {
      const name = `soak${podSeq++}`;
      const logDir = path.join(logDisk, name);
      await fsp.mkdir(logDir, { recursive: true });
      const config = { ...podConfig(rt, name), log_directory: logDir };
      result.boots++;
      const { pod_sandbox_id: id } = await call(rt.cri.runtime.RunPodSandbox({ config }));
      const pod: Pod = { id, config, logDir, ticker: undefined };
      pods.set(id, pod);
      everyPod.push(id);
      pod.ticker = await startContainer(pod, 'ticker', ['sh', '-c', 'i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.2; done']);
      progress(`pod ${name} ${id.slice(0, 12)} ready with its ticker`);
      return pod;
    };
    const startContainer = async (pod: Pod, name: string, command: string[], namespaces?: { pid: 'NODE' }): Promise<string> => {
      const linux = namespaces === undefined ? {} : { linux: { security_context: { namespace_options: namespaces } } };
      const { container_id: cid } = await call(
        rt.cri.runtime.CreateContainer({
          pod_sandbox_id: pod.id,
          config: { metadata: { name, attempt: 0 }, image: { image }, command, log_path: `${name}.log`, ...linux },
          sandbox_config: pod.config,
        }),
      );
      await call(rt.cri.runtime.StartContainer({ container_id: cid }));
      return cid;
    };
    let cycle = 0;
    const containerCycle = async (pod: Pod): Promise<void> => {
      const cid = await startContainer(pod, `c${cycle++}`, ['sh', '-c', 'echo hello']);
      await call(rt.cri.runtime.StopContainer({ container_id: cid, timeout: 0 }));
      await call(rt.cri.runtime.RemoveContainer({ container_id: cid }));
    };

    /** Every tick from 0 on, each once, in the ticker's CRI log. */
    const checkTicker = async (pod: Pod, label: string): Promise<void> => {
      const text = await fsp.readFile(path.join(pod.logDir, 'ticker.log'), 'utf8').catch(() => '');
      const ticks = text
        .split('\n')
        .map((l) => /^\S+ stdout F tick-(\d+)$/.exec(l)?.[1])
        .filter((t): t is string => t !== undefined)
        .map(Number);
      const bad = ticks.findIndex((t, i) => t !== i);
      if (bad !== -1) violate(`${label}: ticker log of ${pod.id.slice(0, 12)} has tick-${ticks[bad]} at line ${bad} (lost or duplicated)`);
    };

    const checkInvariants = async (label: string): Promise<void> => {
      const listed = (await call(rt.cri.runtime.ListPodSandbox({}))).items;
      if (new Set(listed.map((s) => s.id)).size !== listed.length) violate(`${label}: a sandbox id is listed twice`);
      if (new Set(listed.map((s) => s.metadata!.uid)).size !== listed.length) violate(`${label}: a pod uid is listed twice`);
      for (const s of listed) {
        const pod = pods.get(s.id);
        if (pod === undefined) {
          violate(`${label}: sandbox ${s.id.slice(0, 12)} is listed but the soak never made it`);
          continue;
        }
        await checkTicker(pod, label);
        if (s.state === 'SANDBOX_READY') {
          try {
            if (podNetwork) {
              const st = await call(
                rt.cri.runtime.PodSandboxStatus({
                  pod_sandbox_id: s.id,
                }),
              );
              if ((st.status!.network?.ip ?? '') === '') violate(`${label}: sandbox ${s.id.slice(0, 12)} is READY without a pod IP`);
            }
            await containerCycle(pod);
          } catch (err) {
            violate(`${label}: sandbox ${s.id.slice(0, 12)} is READY but a container cannot start: ${(err as Error).message}`);
          }
        } else {
          try {
            await call(rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: s.id }));
            await call(rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }));
            pods.delete(s.id);
          } catch (err) {
            violate(`${label}: sandbox ${s.id.slice(0, 12)} is NOTREADY but cannot be removed: ${(err as Error).message}`);
          }
        }
      }
      for (const id of [...pods.keys()]) if (!listed.some((s) => s.id === id)) violate(`${label}: sandbox ${id.slice(0, 12)} vanished`);
      const owners = await ownersFromRecords(rt.stateDir);
      for (const o of await auditOrphans(owners, { stateDir: rt.stateDir, netnsDir: podNetwork ? NETNS_DIR : undefined }))
        violate(`${label}: orphan ${o.kind} ${o.path}${o.pid ? ` pid ${o.pid}` : ''}`);
      const ids = new Set(owners.sandboxes.map((s) => s.id));
      for (const dir of await cgroupDirsUnder(rt.cgroupRoot)) {
        const m = /\/kata-ts-([0-9a-f]{64})$/.exec(dir);
        if (m !== null && !ids.has(m[1]!)) violate(`${label}: orphan cgroup ${dir}`);
      }
    };

    const info = async (pod: Pod) => {
      const res = await call(rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id, verbose: true }));
      return JSON.parse(res.info.info ?? '{}') as { pid?: number; virtiofsd?: { pid: number } | null };
    };

    /** What a refused request must leave unchanged: the listed pods and containers, images and VM dirs. */
    const stateSummary = async (): Promise<string> => {
      const sandboxes = (await call(rt.cri.runtime.ListPodSandbox({}))).items;
      const containers = (await call(rt.cri.runtime.ListContainers({}))).containers;
      const images = (await call(rt.cri.image.ListImages({}))).images;
      const vmDirs = await fsp.readdir(path.join(rt.stateDir, 'vm')).catch(() => []);
      return JSON.stringify({
        sandboxes: sandboxes.map((x) => `${x.id}:${x.state}`).sort(),
        containers: containers.map((x) => `${x.id}:${x.state}`).sort(),
        images: images.map((x) => x.id).sort(),
        vmDirs: vmDirs.sort(),
      });
    };

    /**
     * The state disk full to the last page: reads keep answering (an exec included); a new pod, a
     * new container and a pull are refused as RESOURCE_EXHAUSTED and leave nothing behind; the
     * daemon restarts on the full disk and finds every pod and container again. Then the space is
     * given back and the invariants (a container starts in every READY pod) are checked.
     */
    const diskFull = async (pod: Pod): Promise<void> => {
      // The node's disk as a whole: the runtime's state and the kubelet's pod logs both full.
      const ballasts = [path.join(rt.stateDir, 'soak-ballast'), path.join(logDisk, 'soak-ballast')];
      const filledBytes = [await fillDisk(ballasts[0]!), await fillDisk(ballasts[1]!)];
      progress(`  state and log disks filled with ${filledBytes.map((b) => (b / 2 ** 20).toFixed(1)).join(' + ')} MiB of ballast`);
      try {
        const before = await stateSummary();
        const reads: Array<[string, () => Promise<unknown>]> = [
          ['Status', () => rt.cri.runtime.Status({})],
          ['PodSandboxStatus', () => rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id })],
          ['ContainerStatus', () => rt.cri.runtime.ContainerStatus({ container_id: pod.ticker })],
          ['ImageFsInfo', () => rt.cri.image.ImageFsInfo({})],
          ['ExecSync', () => rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['echo', 'x'], timeout: 30 })],
        ];
        for (const [method, send] of reads)
          await call(send()).catch((err: Error) => violate(`disk-full: ${method} failed on a full state disk: ${err.message}`));
        const refused = async (what: string, request: Promise<unknown>): Promise<void> => {
          const err = await request.then(
            () => undefined,
            (e: { code?: number; details?: string; message: string }) => e,
          );
          if (err === undefined) violate(`disk-full: ${what} succeeded on a full state disk`);
          else if (err.code !== status.RESOURCE_EXHAUSTED)
            violate(`disk-full: ${what} failed with "${err.message}", not RESOURCE_EXHAUSTED`);
          else progress(`  ${what} refused: ${err.details ?? err.message}`);
        };
        const name = `soak${podSeq++}`;
        const config = podConfig(rt, name);
        await refused('RunPodSandbox', call(rt.cri.runtime.RunPodSandbox({ config })));
        await refused(
          'CreateContainer',
          call(
            rt.cri.runtime.CreateContainer({
              pod_sandbox_id: pod.id,
              config: { metadata: { name: `full${cycle++}`, attempt: 0 }, image: { image }, command: ['true'], log_path: 'full.log' },
              sandbox_config: pod.config,
            }),
          ),
        );
        await refused('PullImage', call(rt.cri.image.PullImage({ image: { image: onFullDisk } })));
        const afterRefusals = await stateSummary();
        if (afterRefusals !== before) violate(`disk-full: refused requests changed the state: ${before} -> ${afterRefusals}`);
        process.kill(rt.pid(), 'SIGKILL');
        await rt.stop();
        await rt.start().catch((err: Error) => violate(`disk-full: the daemon does not start on a full state disk: ${err.message}`));
        const afterRestart = await stateSummary();
        if (afterRestart !== before) violate(`disk-full: a restart on the full disk changed the state: ${before} -> ${afterRestart}`);
      } finally {
        for (const b of ballasts) await fsp.rm(b, { force: true });
      }
    };

    const injectFault = async (kind: FaultKind, pod: Pod): Promise<void> => {
      result.faults++;
      result.faultKinds[kind]++;
      progress(`fault ${result.faults}: ${kind} (pod ${pod.id.slice(0, 12)}) after ${result.requests} requests`);
      if (kind === 'daemon-kill') {
        process.kill(rt.pid(), 'SIGKILL');
        await rt.stop();
        await rt.start();
      } else if (kind === 'qemu-kill') {
        const { pid } = await info(pod);
        const t0 = performance.now();
        signal(pid, 'SIGKILL');
        for (;;) {
          const st = await call(rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id }));
          if (st.status!.state === 'SANDBOX_NOTREADY') {
            result.notReadyMs.push(performance.now() - t0);
            break;
          }
          if (performance.now() - t0 > 10_000) {
            violate(`qemu-kill: sandbox ${pod.id.slice(0, 12)} still READY 10 s after its QEMU was killed`);
            break;
          }
          await sleep(20);
        }
      } else if (kind === 'agent-kill') {
        // From a container in the guest's root PID namespace (pid NODE): SIGKILL the agent; the
        // guest's init restarts it and the daemon's session reconnects. The ticker's log must stay
        // whole (checked with the invariants) and the pod usable again within a minute.
        const killer = await startContainer(
          pod,
          `agent-killer${cycle++}`,
          [
            'sh',
            '-c',
            'cd /proc; for p in [0-9]*; do if grep -q "agent[.]mjs" $p/cmdline 2>/dev/null; then kill -9 $p; fi; done; sleep 1000',
          ],
          { pid: 'NODE' },
        );
        const t0 = Date.now();
        for (;;) {
          const ok = await call(rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['true'], timeout: 10 }, within(15_000))).then(
            () => true,
            () => false,
          );
          if (ok && Date.now() - t0 > 1_000) break;
          if (Date.now() - t0 > 60_000) {
            violate(`agent-kill: the pod ${pod.id.slice(0, 12)} did not answer ExecSync within 60 s of its agent's SIGKILL`);
            break;
          }
          await sleep(500);
        }
        await call(rt.cri.runtime.StopContainer({ container_id: killer, timeout: 0 })).catch((err: Error) =>
          violate(`agent-kill: the killer container cannot be stopped: ${err.message}`),
        );
        await call(rt.cri.runtime.RemoveContainer({ container_id: killer })).catch((err: Error) =>
          violate(`agent-kill: the killer container cannot be removed: ${err.message}`),
        );
      } else if (kind === 'registry-drop') {
        // A registry that breaks every blob transfer off: the pull fails as UNAVAILABLE (worth a
        // retry), within its deadline, and leaves no partial file in the store.
        const proxy = await startProxy(registry.url, { dropBlobs: { afterBytes: 4096 } });
        const stopRelay = await node?.relayLoopbackPort(portOf(proxy.host));
        try {
          const ref = unpullable.replace(registry.host, proxy.host);
          const err = await call(rt.cri.image.PullImage({ image: { image: ref } }, within(60_000))).then(
            () => undefined,
            (e: { code?: number; message: string }) => e,
          );
          if (err === undefined) violate('registry-drop: a pull through a registry that drops connections succeeded');
          else if (err.code !== status.UNAVAILABLE) violate(`registry-drop: the pull failed with ${err.message}, not UNAVAILABLE`);
          const left = await fsp.readdir(path.join(rt.stateDir, 'images', 'ingest')).catch(() => []);
          if (left.length > 0) violate(`registry-drop: ${left.length} partial files left in the image store`);
        } finally {
          await stopRelay?.();
          await proxy.stop();
        }
      } else if (kind === 'disk-full') {
        await diskFull(pod);
      } else if (kind === 'virtiofsd-kill') {
        const { virtiofsd } = await info(pod);
        signal(virtiofsd?.pid, 'SIGKILL');
        // The daemon notices within its watch period and ends the VM: the sandbox goes NOTREADY.
        await sleep(2_000);
      } else {
        const { pid } = await info(pod);
        signal(pid, 'SIGSTOP');
        try {
          // The daemon must keep answering, within deadlines, while a guest does not.
          const t0 = Date.now();
          await call(rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['true'], timeout: 2 }, within(8_000))).catch(
            () => undefined,
          );
          await call(rt.cri.runtime.Version({}, within(2_000))).catch((err: Error) =>
            violate(`guest-hang: Version did not answer: ${err.message}`),
          );
          if (Date.now() - t0 > 9_000) violate('guest-hang: an rpc outlived its deadline');
          await sleep(Math.max(0, 3_000 - (Date.now() - t0)));
        } finally {
          signal(pid, 'SIGCONT');
        }
        await sleep(1_000);
      }
      await checkInvariants(`after ${kind} #${result.faultKinds[kind]}`);
    };

    const faultEvery = Math.max(5, Math.floor(opts.requests / Math.max(1, opts.faults + 1)));
    let nextFault = faultEvery;
    while (result.requests < opts.requests && opts.signal?.aborted !== true) {
      let pod = [...pods.values()][0];
      if (pod === undefined) pod = await bootPod();
      if (result.faults < opts.faults && result.requests >= nextFault) {
        // Faults hit a READY pod; one that is not is first judged (and removed) by the invariants.
        const st = await call(rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id })).catch(() => undefined);
        if (st?.status?.state !== 'SANDBOX_READY') {
          await checkInvariants('before a fault');
          continue;
        }
        nextFault += faultEvery;
        await injectFault(kinds[result.faults % kinds.length]!, pod);
        continue;
      }
      const r = random();
      try {
        if (r < 0.5) {
          const cheap: Array<() => Promise<unknown>> = [
            () => rt.cri.runtime.Version({}),
            () => rt.cri.runtime.Status({}),
            () => rt.cri.runtime.ListPodSandbox({}),
            () => rt.cri.runtime.ListContainers({}),
            () => rt.cri.image.ListImages({}),
            () => rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id }),
            () => rt.cri.runtime.ContainerStatus({ container_id: pod.ticker }),
            () => rt.cri.image.ImageFsInfo({}),
          ];
          await call(cheap[Math.floor(random() * cheap.length)]!());
        } else if (r < 0.75) {
          await call(rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['echo', 'x'], timeout: 30 }));
        } else if (r < 0.82) {
          // A resize as the kubelet sends one (in-place pod resize): the ticker's CPU and memory
          // limits within the pod's planned headroom. A refusal is logged like any failed request.
          await call(
            rt.cri.runtime.UpdateContainerResources({
              container_id: pod.ticker,
              linux: {
                cpu_period: 100_000,
                cpu_quota: 20_000 + Math.floor(random() * 80_000),
                cpu_shares: 2 + Math.floor(random() * 1022),
                memory_limit_in_bytes: (64 + Math.floor(random() * 192)) * 2 ** 20,
              },
            }),
          );
          result.resizes++;
        } else if (r < 0.97) {
          await containerCycle(pod);
        } else {
          await call(rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: pod.id }));
          await checkTicker(pod, 'pod churn');
          await call(rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: pod.id }));
          pods.delete(pod.id);
        }
      } catch (err) {
        // A request may fail right after a fault (the pod is NOTREADY); the invariants judge the state.
        result.failed++;
        progress(`request failed: ${(err as Error).message.slice(0, 200)}`);
      }
    }
    if (opts.signal?.aborted === true && !signal(rt.pid(), 0)) {
      // A Ctrl-C reaches the daemon too (it is in the terminal's process group) and it stops as
      // for SIGTERM, VMs left running: start it again for the end checks and the clean-up.
      await rt.stop();
      await rt.start();
    }
    await checkInvariants('at the end');
    for (const pod of [...pods.values()]) {
      await call(rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: pod.id }));
      await call(rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: pod.id }));
    }
    return result;
  } finally {
    result.durationMs = Date.now() - started;
    if (process.env.KATA_TS_SOAK_LOG !== undefined) await fsp.copyFile(rt.logFile, process.env.KATA_TS_SOAK_LOG).catch(() => undefined);
    await rt.cleanup();
    await node?.cleanup(everyPod.map(netnsNameFor));
    await registry.stop();
  }
}

function portOf(host: string): number {
  return Number(host.slice(host.lastIndexOf(':') + 1));
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

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      requests: { type: 'string', default: '1000' },
      faults: { type: 'string', default: '40' },
      seed: { type: 'string', default: '1' },
      kinds: { type: 'string', default: FAULT_KINDS.join(',') },
      network: { type: 'string', default: 'cni' },
      json: { type: 'boolean', default: false },
    },
  });
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
