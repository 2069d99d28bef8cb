/**
 * Where the shim keeps things, all under `shim.stateRoot` (default `/run/kata-ts/shim`):
 *
 *     <stateRoot>/s/<sha256 hex>                 the pod's ttrpc socket (one per pod, every container of
 *                                                the pod is served on it)
 *     <stateRoot>/<namespace>/<sandboxId:16>/    the pod's state dir: the core's stateDir for that pod
 *                                                (records, `vm/` work dirs), `daemon.lock`, `shim.json`,
 *                                                `shim.log` when containerd gave no log FIFO
 *
 * The socket's name is the sha256 of containerd's address, the namespace and the sandbox id joined
 * as a path, as containerd's own shims name theirs: the same pod behind the same containerd always
 * gets the same socket (so a `start` repeated by containerd finds the running one), and the path
 * has a fixed length whatever the ids. sun_path holds 108 bytes with its NUL; containerd refuses
 * socket paths over 106, and so do we, for every socket under a pod's state dir as well.
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import type { CgroupDriverName } from '../config/types.js';
import { CONTAINER_RECORD_KIND } from '../runtime/container/record.js';
import { sandboxVmPaths, sandboxWorkDir } from '../runtime/sandbox/paths.js';
import './reasons.js';

/** The longest unix socket path accepted (containerd's limit: sun_path's 108 bytes less room for the NUL). */
export const MAX_SOCKET_PATH_BYTES = 106;
/** The directory under the state root that holds the pods' sockets. */
export const SOCKET_DIR = 's';
/** The pod's description for `kata-ts ps` and for `delete`, in its state dir. */
export const SHIM_INFO_FILE = 'shim.json';
/** The shim's log when containerd gave it no `<bundle>/log` FIFO, in the pod's state dir. */
export const SHIM_LOG_FILE = 'shim.log';
/** How many characters of the sandbox id name its state dir (the core keys VM work dirs the same way). */
export const POD_DIR_ID_CHARS = 16;

/** containerd's rule for namespaces and object ids (namespaces.Validate, identifiers.Validate). */
const IDENTIFIER = /^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$/;
const IDENTIFIER_MAX_CHARS = 76;

function identifierProblem(value: string): string | null {
  if (value === '') return 'it is empty';
  if (value.length > IDENTIFIER_MAX_CHARS) return `it is longer than ${IDENTIFIER_MAX_CHARS} characters`;
  if (!IDENTIFIER.test(value)) return 'it must be letters and digits, separated by single ".", "_" or "-"';
  return null;
}

/** Throws INVALID_ARGUMENT unless `namespace` is a containerd namespace name (it names a directory here). */
export function validateNamespace(namespace: string): void {
  const problem = identifierProblem(namespace);
  if (problem !== null) throw invalid('SHIM_NAMESPACE_INVALID', `namespace "${namespace}" is not valid: ${problem}.`);
}

/** Throws INVALID_ARGUMENT unless `id` is a containerd object id (it names files and directories here). */
export function validateId(id: string, what = '-id'): void {
  const problem = identifierProblem(id);
  if (problem !== null) throw invalid('SHIM_ID_INVALID', `${what} "${id}" is not valid: ${problem}.`);
}

function checkSocketLength(socketPath: string, setting: string): void {
  const bytes = Buffer.byteLength(socketPath);
  if (bytes > MAX_SOCKET_PATH_BYTES) {
    throw invalid(
      'SHIM_SOCKET_PATH_TOO_LONG',
      `socket path ${socketPath} is ${bytes} bytes, more than the ${MAX_SOCKET_PATH_BYTES} a unix socket allows; shorten ${setting}.`,
      { details: { socketPath, bytes } },
    );
  }
}

/**
 * The pod's socket: `<stateRoot>/s/<sha256 hex of "<containerdAddress>/<namespace>/<sandboxId>">`
 * (joined and cleaned as a path, as containerd does). Throws when it would not fit in sun_path.
 */
export function shimSocketPath(stateRoot: string, containerdAddress: string, namespace: string, sandboxId: string): string {
  const digest = createHash('sha256')
    .update(path.posix.join(containerdAddress, namespace, sandboxId))
    .digest('hex');
  const socketPath = path.join(stateRoot, SOCKET_DIR, digest);
  checkSocketLength(socketPath, 'shim.stateRoot');
  return socketPath;
}

/** The address containerd dials and reads from `<bundle>/address`: `unix://<path>`. */
export function socketAddress(socketPath: string): string {
  return `unix://${socketPath}`;
}

/** The socket path of a `unix://` address (an address without the scheme is taken as a path). */
export function socketPathOf(address: string): string {
  return address.startsWith('unix://') ? address.slice('unix://'.length) : address;
}

/**
 * The pod's state dir, `<stateRoot>/<namespace>/<sandboxId:16>`: the stateDir the pod's core runs
 * on. Throws when a socket the core puts under it (the VM's agent, QMP, virtiofsd sockets) would
 * not fit in sun_path.
 */
export function podStateDir(stateRoot: string, namespace: string, sandboxId: string): string {
  validateNamespace(namespace);
  validateId(sandboxId);
  const dir = path.join(stateRoot, namespace, sandboxId.slice(0, POD_DIR_ID_CHARS));
  // The confined layout's sockets (in the VMM dir) are the longer ones.
  const sockets = Object.values(sandboxVmPaths(sandboxWorkDir(dir, sandboxId), true)).filter((p) => p.endsWith('.sock'));
  for (const socketPath of sockets) checkSocketLength(socketPath, 'shim.stateRoot or the namespace');
  return dir;
}

/** What a pod's `shim.json` says: who serves the pod, for `kata-ts ps` and for `delete`. */
export interface ShimInfo {
  /** The per-pod `serve` process. */
  pid: number;
  sandboxId: string;
  namespace: string;
  /** The sandbox's bundle (containerd's `<root>/<namespace>/<id>`). */
  bundle: string;
  /** The ttrpc socket's path (its address is `unix://` + this). */
  socket: string;
  /** The cgroup driver the pod's VMM was placed with (from the sandbox's `linux.cgroupsPath`). */
  cgroupDriver: CgroupDriverName;
  /** ISO 8601. */
  startedAt: string;
  /** The kata-ts release whose code the shim runs (`id` null: a checkout); absent in older files. */
  release?: { id: string | null; dir: string };
  /**
   * Node mode only (docs/shim.md "Shim modes"): `pid` is then the node shim server's, `socket`
   * the pod's relay's, and the pod's ttrpc server listens on `upstream` instead. Absent: a
   * per-pod `serve`.
   */
  node?: NodeShimInfo;
}

/** Where a pod hosted by the node shim server is served, in its `shim.json`. */
export interface NodeShimInfo {
  /** containerd's address: with the state root, it names the node server that hosts the pod. */
  containerdAddress: string;
  /** The pod's ttrpc server's socket, which the relay forwards to (`<stateDir>/upstream.sock`). */
  upstream: string;
  /** Where the relay wrote its pid (`<stateDir>/relay.pid`). */
  relayPidFile: string;
}

function isNodeShimInfo(v: unknown): boolean {
  if (typeof v !== 'object' || v === null) return false;
  const o = v as Record<string, unknown>;
  return typeof o.containerdAddress === 'string' && typeof o.upstream === 'string' && typeof o.relayPidFile === 'string';
}

function isShimRelease(v: unknown): boolean {
  if (typeof v !== 'object' || v === null) return false;
  const o = v as Record<string, unknown>;
  return (o.id === null || typeof o.id === 'string') && typeof o.dir === 'string';
}

function isShimInfo(v: unknown): v is ShimInfo {
  if (typeof v !== 'object' || v === null) return false;
  const o = v as Record<string, unknown>;
  return (
    Number.isInteger(o.pid) &&
    typeof o.sandboxId === 'string' &&
    typeof o.namespace === 'string' &&
    typeof o.bundle === 'string' &&
    typeof o.socket === 'string' &&
    (o.cgroupDriver === 'systemd' || o.cgroupDriver === 'cgroupfs') &&
    typeof o.startedAt === 'string' &&
    (o.release === undefined || isShimRelease(o.release)) &&
    (o.node === undefined || isNodeShimInfo(o.node))
  );
}

/** Write the pod's `shim.json` atomically. */
export async function writeShimInfo(stateDir: string, info: ShimInfo): Promise<void> {
  await writeFileAtomic(path.join(stateDir, SHIM_INFO_FILE), `${JSON.stringify(info, null, 2)}\n`);
}

/** The pod's `shim.json`; undefined when there is none. Throws INVALID_ARGUMENT for one that is not ours. */
export async function readShimInfo(stateDir: string): Promise<ShimInfo | undefined> {
  const file = path.join(stateDir, SHIM_INFO_FILE);
  let text: string;
  try {
    text = await fsp.readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw invalid('SHIM_INFO_INVALID', `${file} is not JSON.`, { cause: err });
  }
  if (!isShimInfo(parsed)) throw invalid('SHIM_INFO_INVALID', `${file} is not a shim description.`);
  return parsed;
}

/** A pod found on disk: its sandbox id and state dir. */
export interface PodLocation {
  sandboxId: string;
  stateDir: string;
}

/**
 * Find the pod a task id belongs to without its bundle (`delete` after the bundle went): the pod
 * whose sandbox it is (its state dir's `shim.json` names it), else the pod holding a container
 * record of that id. Undefined when no pod of the namespace knows the id.
 */
export async function locatePod(stateRoot: string, namespace: string, id: string): Promise<PodLocation | undefined> {
  validateNamespace(namespace);
  validateId(id);
  const own = path.join(stateRoot, namespace, id.slice(0, POD_DIR_ID_CHARS));
  const info = await readShimInfo(own).catch(() => undefined);
  if (info?.sandboxId === id) return { sandboxId: id, stateDir: own };
  let names: string[];
  try {
    names = await fsp.readdir(path.join(stateRoot, namespace));
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
  for (const name of names.sort()) {
    const stateDir = path.join(stateRoot, namespace, name);
    if (!(await hasContainerRecord(stateDir, id))) continue;
    const podInfo = await readShimInfo(stateDir).catch(() => undefined);
    if (podInfo !== undefined) return { sandboxId: podInfo.sandboxId, stateDir };
  }
  return undefined;
}

/** True when the pod's state holds a record of container `id` (written by the core's store). */
export async function hasContainerRecord(stateDir: string, id: string): Promise<boolean> {
  try {
    await fsp.access(path.join(stateDir, CONTAINER_RECORD_KIND.dir, `${id}.json`));
    return true;
  } catch {
    return false;
  }
}

/** The pod's Prometheus metrics socket, in its state dir (kata-monitor's `shim-monitor.sock` for Kata's shims). */
export const METRICS_SOCKET_FILE = 'metrics.sock';

/**
 * `<stateDir>/metrics.sock`: where the pod's shim serves `GET /metrics` over HTTP. Throws when it
 * would not fit in sun_path (podStateDir's checks of the VM's longer sockets cover it in practice).
 */
export function metricsSocketPath(stateDir: string): string {
  const socketPath = path.join(stateDir, METRICS_SOCKET_FILE);
  checkSocketLength(socketPath, 'shim.stateRoot or the namespace');
  return socketPath;
}

/** The pod's upstream socket in node mode: where its ttrpc server listens, behind the relay. */
export const UPSTREAM_SOCKET_FILE = 'upstream.sock';
/** The relay's pid file in node mode, in the pod's state dir. */
export const RELAY_PID_FILE = 'relay.pid';
/** Beside the upstream socket: written when the pod is shut down for good, so its relay exits. */
export const UPSTREAM_GONE_SUFFIX = '.gone';

/** `<stateDir>/upstream.sock`; throws when it would not fit in sun_path. */
export function upstreamSocketPath(stateDir: string): string {
  const socketPath = path.join(stateDir, UPSTREAM_SOCKET_FILE);
  checkSocketLength(socketPath, 'shim.stateRoot or the namespace');
  return socketPath;
}

/**
 * The lock file the relays' revive commands take (flock) in the node server's dir, so that one
 * revived server starts at a time; the server removes it when it ends.
 */
export const NODE_REVIVE_LOCK_FILE = 'revive.lock';

/** Where the node shim server of (state root, containerd address) keeps its lock, control socket and log. */
export interface NodeServerPaths {
  /** `<stateRoot>/node/<sha256(containerd address), 16 hex>/`, holding `daemon.lock`. */
  dir: string;
  /** The control socket (JSON lines: attach, detach). */
  control: string;
  /** The node server's own log (each pod's lines go to that pod's shim log). */
  log: string;
}

/** The node shim server's paths for containerd at `containerdAddress`; throws when the socket would not fit. */
export function nodeServerPaths(stateRoot: string, containerdAddress: string): NodeServerPaths {
  const key = createHash('sha256').update(containerdAddress).digest('hex').slice(0, 16);
  const dir = path.join(stateRoot, 'node', key);
  const control = path.join(dir, 'ctl.sock');
  checkSocketLength(control, 'shim.stateRoot');
  return { dir, control, log: path.join(dir, 'node.log') };
}
