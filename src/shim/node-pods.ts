/**
 * The pods on this node as their state on disk tells them, for `kata-ts ps` and `kata-ts metrics
 * --shims`: read-only (nothing is locked, moved, migrated on disk or removed), from roots given
 * as parameters, and never failing for one pod: a pod whose shim died, whose `shim.json` is not
 * written yet or whose record does not parse is listed with what is wrong.
 *
 * Behind containerd every pod has its own state dir `<stateRoot>/<namespace>/<sandboxId:16>/`
 * (paths.ts) holding `shim.json` (who serves it), the core's sandbox and container records and
 * `metrics.sock`; the standalone daemon keeps every pod's records in its one `stateDir`, and its
 * pre-booted VMs' records under `<stateDir>/pool/` (docs/pool.md).
 */
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { errnoCode, errorMessage } from '../common/errors.js';
import { readCmdline } from '../common/procfs.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import { CONTAINER_RECORD_KIND } from '../runtime/container/record.js';
import { POOLED_VM_RECORD_KIND, type PooledVmRecord } from '../runtime/pool/record.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../runtime/sandbox/record.js';
import type { RecordKind } from '../runtime/store.js';
import { livingRelayPid } from './node-relay.js';
import { METRICS_SOCKET_FILE, readShimInfo, type ShimInfo, SOCKET_DIR } from './paths.js';
import { type ProcessUsage, readProcessUsage } from './proc-usage.js';

/** What was found of one pod, as read (the view is made from it by podView, purely). */
export interface PodState {
  /** `shim` (a containerd shim's pod) or `standalone` (the daemon's). */
  source: 'shim' | 'standalone';
  namespace: string;
  stateDir: string;
  /** The pod's `shim.json`; undefined when absent (starting, or removed half-way). */
  shim: ShimInfo | undefined;
  /**
   * What answers containerd for the pod still runs: its `serve` (the pid's command line is this
   * pod's), or in node mode its relay (the pid in its pid file is a relay listening on the pod's
   * socket; the node server behind it may be down for a moment while the relay revives it).
   */
  shimAlive: boolean;
  /** Node mode: the pod's relay's pid while it runs. */
  relayPid: number | undefined;
  record: SandboxRecord | undefined;
  vm: ProcessUsage | undefined;
  virtiofsd: ProcessUsage | undefined;
  /** Container records of the pod. */
  containers: number;
  /** The metrics socket, when its file exists. */
  metricsSocket: string | undefined;
  /** What could not be read, one sentence each. */
  problems: string[];
}

/** Roots the readers take (tests: fake ones). */
export interface NodeRoots {
  procRoot?: string;
}

const validateSandbox = compileOnce<SandboxRecord>(SANDBOX_RECORD_KIND.schema);
const validatePooledVm = compileOnce<PooledVmRecord>(POOLED_VM_RECORD_KIND.schema);

async function readText(file: string): Promise<string | undefined> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

async function listDir(dir: string): Promise<string[]> {
  try {
    return (await fsp.readdir(dir)).sort();
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return [];
    throw err;
  }
}

/**
 * A sandbox record file as the store would load it (envelope, older formats migrated in memory,
 * the schema), without touching the file: a record or why not.
 */
export async function readSandboxRecordFile(file: string): Promise<{ record: SandboxRecord } | { problem: string } | undefined> {
  const text = await readText(file);
  if (text === undefined) return undefined;
  return decodeRecord<SandboxRecord>(text, SANDBOX_RECORD_KIND, () => validateSandbox(), file);
}

function decodeRecord<T>(
  text: string,
  kind: RecordKind,
  validator: () => ((v: unknown) => boolean) & { errors?: unknown },
  file: string,
): { record: T } | { problem: string } {
  let envelope: { kind?: unknown; version?: unknown; record?: unknown };
  try {
    envelope = JSON.parse(text) as typeof envelope;
  } catch {
    return { problem: `${file} is not JSON (being written?)` };
  }
  if (typeof envelope !== 'object' || envelope === null || envelope.kind !== kind.kind)
    return { problem: `${file} is not a ${kind.kind} record` };
  let record = envelope.record;
  if (envelope.version !== kind.version) {
    if (typeof envelope.version !== 'number' || envelope.version > kind.version || kind.migrate === undefined) {
      return { problem: `${file} has format ${String(envelope.version)}; this kata-ts reads ${kind.version}` };
    }
    try {
      record = kind.migrate(envelope.version, record);
    } catch (err) {
      return { problem: `${file} (format ${envelope.version}) could not be migrated: ${errorMessage(err)}` };
    }
  }
  const validate = validator();
  if (!validate(record)) {
    return { problem: `${file} is not a valid ${kind.kind} record: ${describeSchemaErrors(validate.errors as never).join('; ')}` };
  }
  return { record: record as T };
}

/** True when `pid` runs this pod's shim `serve` (its command line names the action and the sandbox id). */
function isServeOf(pid: number, sandboxId: string, procRoot: string): boolean {
  const args = readCmdline(pid, procRoot);
  return args.includes('serve') && args.includes(sandboxId);
}

/** Whether the pod's shim answers containerd: `serve`'s pid in `pod` mode, the relay in node mode. */
async function shimLiveness(shim: ShimInfo, procRoot: string): Promise<{ shimAlive: boolean; relayPid: number | undefined }> {
  if (shim.node === undefined) return { shimAlive: isServeOf(shim.pid, shim.sandboxId, procRoot), relayPid: undefined };
  const relayPid = await livingRelayPid(shim.node.relayPidFile, shim.socket, procRoot);
  return { shimAlive: relayPid !== undefined, relayPid };
}

async function processUsage(
  ref: { pid: number; startTimeTicks: number } | null | undefined,
  procRoot: string,
): Promise<ProcessUsage | undefined> {
  return ref == null ? undefined : readProcessUsage(ref, procRoot);
}

async function exists(file: string): Promise<boolean> {
  return fsp.lstat(file).then(
    () => true,
    () => false,
  );
}

/** One pod dir of the shim's state root. */
export async function readShimPod(namespace: string, stateDir: string, roots: NodeRoots = {}): Promise<PodState> {
  const procRoot = roots.procRoot ?? '/proc';
  const problems: string[] = [];
  let shim: ShimInfo | undefined;
  try {
    shim = await readShimInfo(stateDir);
    if (shim === undefined) problems.push('no shim.json (the shim is starting, or was stopped half-way)');
  } catch (err) {
    problems.push(errorMessage(err));
  }
  const sandboxDir = path.join(stateDir, SANDBOX_RECORD_KIND.dir);
  const names = shim !== undefined ? [`${shim.sandboxId}.json`] : (await listDir(sandboxDir)).filter((n) => n.endsWith('.json'));
  let record: SandboxRecord | undefined;
  for (const name of names) {
    const read = await readSandboxRecordFile(path.join(sandboxDir, name));
    if (read === undefined) problems.push('no sandbox record (the sandbox is not created yet, or already removed)');
    else if ('problem' in read) problems.push(read.problem);
    else record = read.record;
  }
  const containers = (await listDir(path.join(stateDir, CONTAINER_RECORD_KIND.dir))).filter((n) => n.endsWith('.json')).length;
  const metricsSocket = path.join(stateDir, METRICS_SOCKET_FILE);
  return {
    source: 'shim',
    namespace,
    stateDir,
    shim,
    ...(shim === undefined ? { shimAlive: false, relayPid: undefined } : await shimLiveness(shim, procRoot)),
    record,
    vm: await processUsage(record?.vmm, procRoot),
    virtiofsd: await processUsage(record?.virtiofsd, procRoot),
    containers,
    metricsSocket: (await exists(metricsSocket)) ? metricsSocket : undefined,
    problems,
  };
}

/** The pod dirs under a shim state root: `<namespace>/<dir>` (the sockets' `s/` and files skipped). */
export async function shimPodDirs(stateRoot: string): Promise<Array<{ namespace: string; stateDir: string }>> {
  const out: Array<{ namespace: string; stateDir: string }> = [];
  for (const namespace of await listDir(stateRoot)) {
    if (namespace === SOCKET_DIR) continue;
    const nsDir = path.join(stateRoot, namespace);
    if (
      !(await fsp.stat(nsDir).then(
        (s) => s.isDirectory(),
        () => false,
      ))
    )
      continue;
    for (const name of await listDir(nsDir)) {
      const stateDir = path.join(nsDir, name);
      if (
        await fsp.stat(stateDir).then(
          (s) => s.isDirectory(),
          () => false,
        )
      )
        out.push({ namespace, stateDir });
    }
  }
  return out;
}

/** Every pod under the shim state root. */
export async function readShimPods(stateRoot: string, roots: NodeRoots = {}): Promise<PodState[]> {
  const out: PodState[] = [];
  for (const { namespace, stateDir } of await shimPodDirs(stateRoot)) {
    try {
      out.push(await readShimPod(namespace, stateDir, roots));
    } catch (err) {
      // Removed while being read, or unreadable: listed as such, the listing goes on.
      out.push(emptyPod('shim', namespace, stateDir, errorMessage(err)));
    }
  }
  return out;
}

function emptyPod(source: PodState['source'], namespace: string, stateDir: string, problem: string): PodState {
  return {
    source,
    namespace,
    stateDir,
    shim: undefined,
    shimAlive: false,
    relayPid: undefined,
    record: undefined,
    vm: undefined,
    virtiofsd: undefined,
    containers: 0,
    metricsSocket: undefined,
    problems: [problem],
  };
}

/** The standalone daemon's pods: every sandbox record in its `stateDir` (namespace: the pod's Kubernetes namespace). */
export async function readStandalonePods(stateDir: string, roots: NodeRoots = {}): Promise<PodState[]> {
  const procRoot = roots.procRoot ?? '/proc';
  const sandboxDir = path.join(stateDir, SANDBOX_RECORD_KIND.dir);
  const containerDir = path.join(stateDir, CONTAINER_RECORD_KIND.dir);
  const perSandbox = new Map<string, number>();
  for (const name of (await listDir(containerDir)).filter((n) => n.endsWith('.json'))) {
    const text = await readText(path.join(containerDir, name)).catch(() => undefined);
    try {
      const id = (JSON.parse(text ?? '') as { record?: { sandboxId?: unknown } }).record?.sandboxId;
      if (typeof id === 'string') perSandbox.set(id, (perSandbox.get(id) ?? 0) + 1);
    } catch {
      // being written: not counted
    }
  }
  const out: PodState[] = [];
  for (const name of (await listDir(sandboxDir)).filter((n) => n.endsWith('.json'))) {
    const read = await readSandboxRecordFile(path.join(sandboxDir, name)).catch((err: unknown) => ({ problem: errorMessage(err) }));
    if (read === undefined) continue;
    if ('problem' in read) {
      out.push(emptyPod('standalone', '', stateDir, read.problem));
      continue;
    }
    const record = read.record;
    out.push({
      source: 'standalone',
      namespace: record.metadata.namespace,
      stateDir,
      shim: undefined,
      shimAlive: false,
      relayPid: undefined,
      record,
      vm: await processUsage(record.vmm, procRoot),
      virtiofsd: await processUsage(record.virtiofsd, procRoot),
      containers: perSandbox.get(record.id) ?? 0,
      metricsSocket: undefined,
      problems: [],
    });
  }
  return out;
}

/** What was found of one pooled VM of the standalone daemon (its view is made by pooledVmView, purely). */
export interface PooledVmState {
  file: string;
  stateDir: string;
  record: PooledVmRecord | undefined;
  vm: ProcessUsage | undefined;
  problems: string[];
}

/**
 * The standalone daemon's pooled VMs: every record under `<stateDir>/pool/`, with whether its
 * QEMU still runs (pid and start time). One record that does not parse is listed as such.
 */
export async function readPooledVms(stateDir: string, roots: NodeRoots = {}): Promise<PooledVmState[]> {
  const procRoot = roots.procRoot ?? '/proc';
  const dir = path.join(stateDir, POOLED_VM_RECORD_KIND.dir);
  const out: PooledVmState[] = [];
  for (const name of (await listDir(dir)).filter((n) => n.endsWith('.json'))) {
    const file = path.join(dir, name);
    const state: PooledVmState = { file, stateDir, record: undefined, vm: undefined, problems: [] };
    try {
      const text = await readText(file);
      // Claimed or discarded between the listing and the read: no longer a pooled VM.
      if (text === undefined) continue;
      const read = decodeRecord<PooledVmRecord>(text, POOLED_VM_RECORD_KIND, () => validatePooledVm(), file);
      if ('problem' in read) state.problems.push(read.problem);
      else {
        state.record = read.record;
        state.vm = await processUsage(read.record.vmm, procRoot);
      }
    } catch (err) {
      state.problems.push(errorMessage(err));
    }
    out.push(state);
  }
  return out;
}

/** GET /metrics over HTTP on a unix socket: the body, or an error (refused, timed out, not 200). */
export function scrapeMetricsSocket(socketPath: string, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get({ socketPath, path: '/metrics', agent: false, headers: { accept: 'text/plain' } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        if (res.statusCode === 200) resolve(body);
        else reject(new Error(`${socketPath} answered ${res.statusCode}: ${body.trim()}`));
      });
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`${socketPath} did not answer in ${timeoutMs} ms`)));
    req.on('error', reject);
  });
}
