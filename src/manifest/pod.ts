import { invalid } from '../common/errors.js';

/**
 * The subset of a Kubernetes Pod (core/v1) that decides a sandbox request, validated field by
 * field. Everything else a manifest may hold is ignored. Errors name the manifest path
 * (`spec.initContainers[1].resources.limits.cpu`).
 */

/** A quantity as written: YAML may give a string, a number or (big integers) a bigint. */
export type QuantityText = string;

export interface ResourceRequirementsManifest {
  requests: Record<string, QuantityText>;
  limits: Record<string, QuantityText>;
}

export interface VolumeMountManifest {
  name: string;
  mountPath: string;
  readOnly: boolean;
  subPath: string;
  mountPropagation: 'None' | 'HostToContainer' | 'Bidirectional';
  recursiveReadOnly: 'Disabled' | 'IfPossible' | 'Enabled';
}

export interface ContainerPortManifest {
  containerPort: number;
  hostPort: number;
  hostIP: string;
  protocol: 'TCP' | 'UDP' | 'SCTP';
}

export interface ContainerManifest {
  name: string;
  /** Only init containers: `Always` makes a sidecar. */
  restartPolicy: string;
  resources: ResourceRequirementsManifest;
  volumeMounts: VolumeMountManifest[];
  ports: ContainerPortManifest[];
  /** Manifest path of this container, for messages. */
  at: string;
}

export interface VolumeManifest {
  name: string;
  /** The volume source key (`emptyDir`, `hostPath`, `image`, ...). */
  kind: string;
  source: Record<string, unknown>;
}

export interface PodManifest {
  name: string;
  namespace: string;
  /** metadata.uid, or '' when the manifest has none. */
  uid: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  runtimeClassName: string;
  hostname: string;
  initContainers: ContainerManifest[];
  containers: ContainerManifest[];
  volumes: VolumeManifest[];
  /** spec.overhead (RuntimeClass podFixed, as admission sets it). */
  overhead: Record<string, QuantityText>;
  /** spec.resources (KEP-2837), null when absent. */
  resources: ResourceRequirementsManifest | null;
  sysctls: Record<string, string>;
}

function fail(path: string, what: string): never {
  throw invalid('MANIFEST_INVALID', `${path} ${what}`, { details: { path } });
}

type Obj = Record<string, unknown>;

function isObject(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function object(v: unknown, path: string, optional = true): Obj {
  if ((v === undefined || v === null) && optional) return {};
  if (!isObject(v)) fail(path, 'must be a mapping');
  return v;
}

function list(v: unknown, path: string): unknown[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) fail(path, 'must be a list');
  return v;
}

function string(v: unknown, path: string, fallback?: string): string {
  if ((v === undefined || v === null) && fallback !== undefined) return fallback;
  if (typeof v !== 'string') fail(path, fallback === undefined ? 'must be a string' : 'must be a string when given');
  return v;
}

function nonEmpty(v: unknown, path: string): string {
  const s = string(v, path);
  if (s === '') fail(path, 'must not be empty');
  return s;
}

function integer(v: unknown, path: string, fallback: number): number {
  if (v === undefined || v === null) return fallback;
  const n = typeof v === 'bigint' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isSafeInteger(n)) fail(path, 'must be an integer');
  return n;
}

function stringMap(v: unknown, path: string): Record<string, string> {
  const o = object(v, path);
  const out: Record<string, string> = {};
  for (const [k, value] of Object.entries(o)) out[k] = string(value, `${path}.${k}`);
  return out;
}

function oneOf<T extends string>(v: unknown, path: string, allowed: readonly T[], fallback: T): T {
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'string' || !(allowed as readonly string[]).includes(v)) fail(path, `must be one of ${allowed.join(', ')}`);
  return v as T;
}

/** A quantity's text: YAML numbers are accepted like JSON numbers in the API (Quantity unmarshals both). */
function quantityMap(v: unknown, path: string): Record<string, QuantityText> {
  const o = object(v, path);
  const out: Record<string, QuantityText> = {};
  for (const [k, value] of Object.entries(o)) {
    if (typeof value === 'string') out[k] = value;
    else if (typeof value === 'bigint' || (typeof value === 'number' && Number.isFinite(value))) out[k] = String(value);
    else fail(`${path}.${k}`, 'must be a quantity (a string such as "500m" or a number)');
  }
  return out;
}

export function requirements(v: unknown, path: string): ResourceRequirementsManifest {
  const o = object(v, path);
  return { requests: quantityMap(o.requests, `${path}.requests`), limits: quantityMap(o.limits, `${path}.limits`) };
}

function volumeMount(v: unknown, path: string): VolumeMountManifest {
  const o = object(v, path, false);
  return {
    name: nonEmpty(o.name, `${path}.name`),
    mountPath: nonEmpty(o.mountPath, `${path}.mountPath`),
    readOnly:
      o.readOnly === undefined || o.readOnly === null
        ? false
        : o.readOnly === true
          ? true
          : o.readOnly === false
            ? false
            : fail(`${path}.readOnly`, 'must be true or false'),
    subPath: string(o.subPath ?? o.subPathExpr, `${path}.subPath`, ''),
    mountPropagation: oneOf(o.mountPropagation, `${path}.mountPropagation`, ['None', 'HostToContainer', 'Bidirectional'], 'None'),
    recursiveReadOnly: oneOf(o.recursiveReadOnly, `${path}.recursiveReadOnly`, ['Disabled', 'IfPossible', 'Enabled'], 'Disabled'),
  };
}

function port(v: unknown, path: string): ContainerPortManifest {
  const o = object(v, path, false);
  return {
    containerPort: integer(o.containerPort, `${path}.containerPort`, 0),
    hostPort: integer(o.hostPort, `${path}.hostPort`, 0),
    hostIP: string(o.hostIP, `${path}.hostIP`, ''),
    protocol: oneOf(o.protocol, `${path}.protocol`, ['TCP', 'UDP', 'SCTP'], 'TCP'),
  };
}

function container(v: unknown, path: string, init: boolean): ContainerManifest {
  const o = object(v, path, false);
  const restartPolicy = string(o.restartPolicy, `${path}.restartPolicy`, '');
  if (init && restartPolicy !== '' && restartPolicy !== 'Always') {
    fail(`${path}.restartPolicy`, `is "${restartPolicy}"; an init container may only say Always (which makes it a sidecar)`);
  }
  return {
    name: nonEmpty(o.name, `${path}.name`),
    restartPolicy,
    resources: requirements(o.resources, `${path}.resources`),
    volumeMounts: list(o.volumeMounts, `${path}.volumeMounts`).map((m, i) => volumeMount(m, `${path}.volumeMounts[${i}]`)),
    ports: list(o.ports, `${path}.ports`).map((p, i) => port(p, `${path}.ports[${i}]`)),
    at: path,
  };
}

function volume(v: unknown, path: string): VolumeManifest {
  const o = object(v, path, false);
  const name = nonEmpty(o.name, `${path}.name`);
  const sources = Object.keys(o).filter((k) => k !== 'name');
  if (sources.length !== 1)
    fail(path, `must have exactly one volume source beside its name, found ${sources.length === 0 ? 'none' : sources.join(', ')}`);
  const kind = sources[0]!;
  return { name, kind, source: object(o[kind], `${path}.${kind}`) };
}

/** True when a parsed document looks like a Kubernetes object rather than a CRI request. */
export function looksLikeKubernetesObject(doc: unknown): boolean {
  return isObject(doc) && ('kind' in doc || 'apiVersion' in doc);
}

/** Validate a parsed Pod manifest and return the model. Throws invalid/MANIFEST_INVALID naming the path. */
export function readPodManifest(doc: unknown): PodManifest {
  const root = object(doc, '(document)', false);
  if (root.kind !== 'Pod') fail('kind', `is ${JSON.stringify(root.kind)}; only a Pod can be planned`);
  if (root.apiVersion !== 'v1') fail('apiVersion', `is ${JSON.stringify(root.apiVersion)}; a Pod is apiVersion v1`);
  const metadata = object(root.metadata, 'metadata', false);
  const spec = object(root.spec, 'spec', false);
  const containers = list(spec.containers, 'spec.containers').map((c, i) => container(c, `spec.containers[${i}]`, false));
  if (containers.length === 0) fail('spec.containers', 'must list at least one container');
  const initContainers = list(spec.initContainers, 'spec.initContainers').map((c, i) => container(c, `spec.initContainers[${i}]`, true));
  const seen = new Map<string, string>();
  for (const c of [...initContainers, ...containers]) {
    const first = seen.get(c.name);
    if (first !== undefined) fail(`${c.at}.name`, `"${c.name}" repeats ${first}.name; container names must be unique in a pod`);
    seen.set(c.name, c.at);
  }
  const volumes = list(spec.volumes, 'spec.volumes').map((v, i) => volume(v, `spec.volumes[${i}]`));
  const volumeNames = new Set(volumes.map((v) => v.name));
  for (const c of [...initContainers, ...containers]) {
    const paths = new Set<string>();
    c.volumeMounts.forEach((m, i) => {
      if (!volumeNames.has(m.name)) fail(`${c.at}.volumeMounts[${i}].name`, `"${m.name}" is not a volume of spec.volumes`);
      if (paths.has(m.mountPath))
        fail(`${c.at}.volumeMounts[${i}].mountPath`, `"${m.mountPath}" is mounted twice in container "${c.name}"`);
      paths.add(m.mountPath);
    });
  }
  const securityContext = object(spec.securityContext, 'spec.securityContext');
  const sysctls: Record<string, string> = {};
  list(securityContext.sysctls, 'spec.securityContext.sysctls').forEach((s, i) => {
    const o = object(s, `spec.securityContext.sysctls[${i}]`, false);
    sysctls[nonEmpty(o.name, `spec.securityContext.sysctls[${i}].name`)] = string(o.value, `spec.securityContext.sysctls[${i}].value`);
  });
  const name = nonEmpty(metadata.name, 'metadata.name');
  return {
    name,
    namespace: string(metadata.namespace, 'metadata.namespace', 'default'),
    uid: string(metadata.uid, 'metadata.uid', ''),
    labels: stringMap(metadata.labels, 'metadata.labels'),
    annotations: stringMap(metadata.annotations, 'metadata.annotations'),
    runtimeClassName: string(spec.runtimeClassName, 'spec.runtimeClassName', ''),
    hostname: string(spec.hostname, 'spec.hostname', name),
    initContainers,
    containers,
    volumes,
    overhead: quantityMap(spec.overhead, 'spec.overhead'),
    resources: spec.resources === undefined || spec.resources === null ? null : requirements(spec.resources, 'spec.resources'),
    sysctls,
  };
}
