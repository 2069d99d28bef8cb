/**
 * What the shim reads of a bundle before it decodes anything: the OCI `config.json`'s annotations
 * (which say whether the task is a pod's sandbox or a container of a pod, and which pod) and its
 * `linux.cgroupsPath` (which cgroup driver the pod is placed with), and the `address` file
 * containerd (and CRI-O) read the shim's address from. The full decoding of the spec is
 * src/shim/decode/'s.
 */
import { existsSync, constants as fsConstants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import './reasons.js';

/** containerd's CRI plugin: `sandbox` or `container`, and the pod's sandbox id. */
export const CRI_CONTAINER_TYPE = 'io.kubernetes.cri.container-type';
export const CRI_SANDBOX_ID = 'io.kubernetes.cri.sandbox-id';
/** CRI-O's names for the same two facts. */
export const CRIO_CONTAINER_TYPE = 'io.kubernetes.cri-o.ContainerType';
export const CRIO_SANDBOX_ID = 'io.kubernetes.cri-o.SandboxID';
export const CONTAINER_TYPE_SANDBOX = 'sandbox';
/** Where containerd 2.x's shim sandboxer keeps its bundles: `<state>/<this>/<namespace>/<id>`. */
export const SANDBOX_CONTROLLER_DIR = 'io.containerd.sandbox.controller.v1.shim';

/** The parts of a bundle's config.json the shim's process model needs. */
export interface BundleConfig {
  annotations: Record<string, string>;
  /** `linux.cgroupsPath`; null when the spec has none. */
  cgroupsPath: string | null;
}

/** What a task is to the shim: a pod's sandbox (served by a new per-pod process) or a container of a pod. */
export interface TaskRole {
  role: 'sandbox' | 'container';
  /** The pod's sandbox id (the task's own id for a sandbox). */
  sandboxId: string;
}

function stringMap(v: unknown): Record<string, string> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return {};
  const out: Record<string, string> = {};
  for (const [k, value] of Object.entries(v)) if (typeof value === 'string') out[k] = value;
  return out;
}

/** Read `<bundle>/config.json`. Throws INVALID_ARGUMENT when it is missing or not an OCI spec object. */
/**
 * `<bundle>/config.json` parsed as a JSON object (its shape beyond that is the readers' to
 * judge); INVALID_ARGUMENT naming the bundle when the path is not absolute or the file is missing,
 * unreadable or not a JSON object.
 */
export async function readBundleJson(bundle: string): Promise<object> {
  if (!path.isAbsolute(bundle)) throw invalid('SHIM_BUNDLE_INVALID', `bundle must be an absolute path, got "${bundle}".`);
  const file = path.join(bundle, 'config.json');
  let text: string;
  try {
    text = await fsp.readFile(file, 'utf8');
  } catch (err) {
    const why = errnoCode(err) === 'ENOENT' ? 'does not exist' : 'cannot be read';
    throw invalid('SHIM_BUNDLE_INVALID', `bundle ${bundle}: config.json ${why}.`, { cause: err });
  }
  let spec: unknown;
  try {
    spec = JSON.parse(text);
  } catch (err) {
    throw invalid('SHIM_BUNDLE_INVALID', `bundle ${bundle}: config.json is not JSON.`, { cause: err });
  }
  if (typeof spec !== 'object' || spec === null || Array.isArray(spec)) {
    throw invalid('SHIM_BUNDLE_INVALID', `bundle ${bundle}: config.json is not an object.`);
  }
  return spec;
}

export async function readBundleConfig(bundle: string): Promise<BundleConfig> {
  // containerd 2.x's shim sandboxer (`sandboxer = "shim"`) starts the shim in a bundle of its
  // own with no config.json: the pod comes later, through the Sandbox API's CreateSandbox.
  if (path.basename(path.dirname(path.dirname(bundle))) === SANDBOX_CONTROLLER_DIR && !existsSync(path.join(bundle, 'config.json'))) {
    return { annotations: {}, cgroupsPath: null };
  }
  const spec = await readBundleJson(bundle);
  const o = spec as { annotations?: unknown; linux?: { cgroupsPath?: unknown } };
  const cgroupsPath = typeof o.linux?.cgroupsPath === 'string' && o.linux.cgroupsPath !== '' ? o.linux.cgroupsPath : null;
  return { annotations: stringMap(o.annotations), cgroupsPath };
}

/**
 * Sandbox or container, from the annotations containerd's CRI plugin or CRI-O put on every spec
 * (pure). A task that carries neither (`ctr run`, a standalone task) is a pod of its own. A
 * container that names no sandbox is refused: there is no pod to run it in.
 */
export function taskRole(id: string, annotations: Readonly<Record<string, string>>): TaskRole {
  const type = annotations[CRI_CONTAINER_TYPE] ?? annotations[CRIO_CONTAINER_TYPE];
  const sandboxId = annotations[CRI_SANDBOX_ID] ?? annotations[CRIO_SANDBOX_ID];
  if (type === CONTAINER_TYPE_SANDBOX || (type === undefined && (sandboxId === undefined || sandboxId === id))) {
    return { role: 'sandbox', sandboxId: id };
  }
  if (sandboxId === undefined || sandboxId === '') {
    const key = annotations[CRI_CONTAINER_TYPE] !== undefined ? CRI_SANDBOX_ID : CRIO_SANDBOX_ID;
    throw invalid('SHIM_BUNDLE_INVALID', `container ${id} is of type "${type}" but its annotation ${key} names no sandbox.`);
  }
  return { role: 'container', sandboxId };
}

/** Write `<bundle>/address` (the plain `unix://` address) atomically, as containerd's shims do. */
export async function writeAddressFile(bundle: string, address: string): Promise<void> {
  await writeFileAtomic(path.join(bundle, 'address'), address, 0o644);
}

/** More than any resolv.conf (glibc reads 3 nameservers, 6 search domains and a line of options). */
export const MAX_RESOLV_CONF_BYTES = 64 * 1024;

/**
 * The pod's resolv.conf, read as root from the path its manager named (CRI-O's ResolvPath, held
 * to the bundle by the decoder, or the file containerd binds at the pause container's
 * /etc/resolv.conf): never through a symbolic link in its last component, only a regular file
 * (a FIFO would block the read), at most MAX_RESOLV_CONF_BYTES. Undefined when it cannot be read
 * so: the pod keeps its image's resolv.conf, as before.
 */
export async function readResolvConf(file: string): Promise<string | undefined> {
  const flags = fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK;
  const handle = await fsp.open(file, flags).catch(() => undefined);
  if (handle === undefined) return undefined;
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.size > MAX_RESOLV_CONF_BYTES) return undefined;
    const buf = Buffer.alloc(MAX_RESOLV_CONF_BYTES + 1);
    const { bytesRead } = await handle.read(buf, 0, buf.length, 0);
    return bytesRead > MAX_RESOLV_CONF_BYTES ? undefined : buf.subarray(0, bytesRead).toString('utf8');
  } finally {
    await handle.close();
  }
}
