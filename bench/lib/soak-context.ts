/**
 * What every phase of the soak (bench/soak.ts) shares: the daemon, registry and network node it
 * runs against, the pods it made, the running counts, and the few CRI steps every phase uses.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { RegistryHandle } from '../../test/helpers/images-registry.js';
import type { NetworkNode } from '../../test/helpers/network-node.js';
import { podConfig } from '../../test/helpers/runtime-daemon.js';
import type { BenchDaemon } from './daemon.js';

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

export interface Pod {
  id: string;
  config: Record<string, unknown>;
  logDir: string;
  ticker: string | undefined;
}

/** The images the soak pushes to its registry (references as pushed). */
export interface SoakImages {
  /** What every container runs. */
  image: string;
  /** Pulled only through a proxy that drops every blob transfer midway (the registry-drop fault). */
  unpullable: string;
  /** Pulled only while the state disk is full (the disk-full fault): refused every time. */
  onFullDisk: string;
}

/** One soak run in progress. */
export interface Soak {
  readonly opts: SoakOptions;
  readonly progress: (line: string) => void;
  /** The seeded PRNG choosing the loop's requests. */
  readonly random: () => number;
  readonly startedAtMs: number;
  readonly registry: RegistryHandle;
  readonly node: NetworkNode | undefined;
  readonly podNetwork: boolean;
  readonly rt: BenchDaemon;
  /** The pods' log directories (the kubelet's /var/log/pods), a small tmpfs of their own. */
  readonly logDisk: string;
  readonly result: SoakResult;
  /** The pods alive now, by sandbox id. */
  readonly pods: Map<string, Pod>;
  /** Every sandbox the soak made, for the node's clean-up of any namespace left behind. */
  readonly everyPod: string[];
  /** Set once the images are pushed (during setup). */
  images: SoakImages;
  /** Counters that make pod and container names unique within the run. */
  seq: { pod: number; container: number };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Counts a CRI request the soak sends (every request goes through here) and passes it on. */
export function call<T>(soak: Soak, request: Promise<T>): Promise<T> {
  soak.result.requests++;
  return request;
}

/** A deadline `timeoutMs` from now, for a request that must not take the soak's default. */
export function within(timeoutMs: number): { deadline: number } {
  return { deadline: Date.now() + timeoutMs };
}

/** Record a broken invariant (the run goes on; the CLI exits 1 at the end). */
export function violate(soak: Soak, what: string): void {
  soak.result.violations.push(what);
  soak.progress(`VIOLATION ${what}`);
}

/** Create and start a container in `pod`; `namespaces` puts it in the guest's root PID namespace. */
export async function startContainer(soak: Soak, pod: Pod, name: string, command: string[], namespaces?: { pid: 'NODE' }): Promise<string> {
  const linux = namespaces === undefined ? {} : { linux: { security_context: { namespace_options: namespaces } } };
  const { container_id: cid } = await call(
    soak,
    soak.rt.cri.runtime.CreateContainer({
      pod_sandbox_id: pod.id,
      config: { metadata: { name, attempt: 0 }, image: { image: soak.images.image }, command, log_path: `${name}.log`, ...linux },
      sandbox_config: pod.config,
    }),
  );
  await call(soak, soak.rt.cri.runtime.StartContainer({ container_id: cid }));
  return cid;
}

/** A new pod with its ticker container (the one whose log must stay whole across faults). */
export async function bootPod(soak: Soak): Promise<Pod> {
  const name = `soak${soak.seq.pod++}`;
  const logDir = path.join(soak.logDisk, name);
  await fsp.mkdir(logDir, { recursive: true });
  const config = { ...podConfig(soak.rt, name), log_directory: logDir };
  soak.result.boots++;
  const { pod_sandbox_id: id } = await call(soak, soak.rt.cri.runtime.RunPodSandbox({ config }));
  const pod: Pod = { id, config, logDir, ticker: undefined };
  soak.pods.set(id, pod);
  soak.everyPod.push(id);
  pod.ticker = await startContainer(soak, pod, 'ticker', ['sh', '-c', 'i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.2; done']);
  soak.progress(`pod ${name} ${id.slice(0, 12)} ready with its ticker`);
  return pod;
}

/** A short-lived container through its whole life: create, start, stop, remove. */
export async function containerCycle(soak: Soak, pod: Pod): Promise<void> {
  const cid = await startContainer(soak, pod, `c${soak.seq.container++}`, ['sh', '-c', 'echo hello']);
  await call(soak, soak.rt.cri.runtime.StopContainer({ container_id: cid, timeout: 0 }));
  await call(soak, soak.rt.cri.runtime.RemoveContainer({ container_id: cid }));
}

/** The pids of a pod's QEMU and virtiofsd, from verbose PodSandboxStatus. */
export async function podProcesses(soak: Soak, pod: Pod): Promise<{ pid?: number; virtiofsd?: { pid: number } | null }> {
  const res = await call(soak, soak.rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id, verbose: true }));
  return JSON.parse(res.info.info ?? '{}') as { pid?: number; virtiofsd?: { pid: number } | null };
}

/** Send a signal to a process the soak's daemon started; false when it is already gone. */
export function signal(pid: number | undefined, sig: NodeJS.Signals | 0): boolean {
  if (pid === undefined) return false;
  try {
    process.kill(pid, sig);
    return true;
  } catch {
    return false;
  }
}

/** The port of a `host:port`. */
export function portOf(host: string): number {
  return Number(host.slice(host.lastIndexOf(':') + 1));
}
