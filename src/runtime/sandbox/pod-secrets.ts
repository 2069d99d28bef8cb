/**
 * The pod annotations that ask for broker resources as files in a container
 * (`io.kata-ts.secrets`, docs/attestation.md), decoded once at RunPodSandbox
 * into typed values the sandbox record carries; CreateContainer looks its container up by name
 * and hands the list to the agent (CreateContainerRequest.secrets). Pure: no file, no network.
 *
 * What the host checks is only what it can judge without the secret: the names, the paths, the
 * counts, and that the pod can attest at all (a TEE binds its launch, its initdata names a
 * broker). The guest checks the list again (guest/agent/secret-volumes.ts): to a confidential
 * guest the host is not trusted either.
 */
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { formatResourcePath, parseResourceUri } from '../../attest/resource-path.js';
import { invalid } from '../../common/errors.js';
import type { Initdata, InitdataTeeKind } from '../../measure/initdata.js';
import '../reasons.js';

/**
 * The annotation: one key for the whole pod, its value a JSON object from container name to that
 * container's list. One key, not one per container: behind containerd a pod annotation reaches
 * the runtime only when the runtime's `pod_annotations` patterns match it, Go's path matching
 * where `io.kata-ts.*` matches no key with a `/` in it; and a key with the container name in its
 * name part would leave a 63-character container name no room.
 */
export const POD_SECRETS_ANNOTATION = 'io.kata-ts.secrets';
/** At most this many resources per container. */
export const POD_SECRETS_MAX_PER_CONTAINER = 16;
/** At most this many containers named in the annotation. */
export const POD_SECRETS_MAX_CONTAINERS = 64;
/** At most this many characters in the annotation's value (Kubernetes allows 256 KiB for all of them). */
export const POD_SECRETS_ANNOTATION_MAX_CHARS = 64 * 1024;
/** The longest container path accepted (PATH_MAX is 4096; a mount target far shorter suffices). */
export const POD_SECRET_PATH_MAX_CHARS = 1024;
/** A container name as Kubernetes spells it (an RFC 1123 label). */
const CONTAINER_NAME = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
/** Container paths under which a file cannot be mounted sensibly (the runtime mounts its own file systems there). */
const RESERVED_ROOTS = ['/proc', '/sys', '/dev'];

/** One resource a container needs, and where its file goes. */
export interface PodSecretMount {
  /** The broker's name for it: `<repository>/<type>/<tag>`. */
  resource: string;
  /** An absolute, normalised path in the container. */
  path: string;
}

/** Per container name, the resources it needs, in the annotation's order. */
export type PodSecrets = Record<string, PodSecretMount[]>;

function refuse(annotation: string, what: string): never {
  throw invalid('POD_SECRETS_ANNOTATION_INVALID', `annotation ${annotation}: ${what}`, {
    details: { field: `annotations["${annotation}"]` },
  });
}

/** Why `p` is not an acceptable container path, or null. */
function containerPathProblem(p: string): string | null {
  if (p.length === 0) return 'is empty';
  if (p.length > POD_SECRET_PATH_MAX_CHARS) return `is ${p.length} characters, over ${POD_SECRET_PATH_MAX_CHARS}`;
  if (p.includes('\0')) return 'contains a NUL byte';
  if (!p.startsWith('/')) return 'is relative: it must start with /';
  if (p === '/') return 'is the root directory: a file needs a name';
  if (p.split('/').some((seg) => seg === '..')) return "traverses with '..'";
  if (path.posix.normalize(p) !== p || p.endsWith('/')) return `is not normalised (write ${path.posix.normalize(p).replace(/\/$/, '')})`;
  const reserved = RESERVED_ROOTS.find((r) => p === r || p.startsWith(`${r}/`));
  if (reserved !== undefined) return `is under ${reserved}, which the container runtime mounts itself`;
  return null;
}

/** One container's list (already parsed JSON) -> its mounts; `at` names it in messages. */
function parseContainerList(annotation: string, at: string, list: unknown): PodSecretMount[] {
  if (!Array.isArray(list)) refuse(annotation, `${at} must be a JSON array of {"resource", "path"} objects`);
  if (list.length === 0) refuse(annotation, `${at} is an empty list; leave the container out instead`);
  if (list.length > POD_SECRETS_MAX_PER_CONTAINER)
    refuse(annotation, `${at} names ${list.length} resources, more than the ${POD_SECRETS_MAX_PER_CONTAINER} allowed per container`);
  const mounts: PodSecretMount[] = [];
  list.forEach((item: unknown, n) => {
    const i = `${at}[${n}]`;
    if (typeof item !== 'object' || item === null || Array.isArray(item)) refuse(annotation, `${i} is not an object`);
    const entry = item as Record<string, unknown>;
    const extra = Object.keys(entry).filter((k) => k !== 'resource' && k !== 'path');
    if (extra.length > 0) refuse(annotation, `${i} has unknown field "${extra[0]}" (only "resource" and "path")`);
    if (typeof entry.resource !== 'string') refuse(annotation, `${i}.resource must be a string (kbs:///<repository>/<type>/<tag>)`);
    if (typeof entry.path !== 'string') refuse(annotation, `${i}.path must be a string (an absolute path in the container)`);
    let uri: ReturnType<typeof parseResourceUri>;
    try {
      uri = parseResourceUri(entry.resource, `${i}.resource`);
    } catch (err) {
      refuse(annotation, (err as Error).message);
    }
    if (uri.authority !== null)
      refuse(
        annotation,
        `${i}.resource ${JSON.stringify(entry.resource)} names a host: the broker is the one the initdata names, so write kbs:///${formatResourcePath(uri.path)}`,
      );
    const problem = containerPathProblem(entry.path);
    if (problem !== null) refuse(annotation, `${i}.path ${JSON.stringify(entry.path)} ${problem}`);
    mounts.push({ resource: formatResourcePath(uri.path), path: entry.path });
  });
  // Two files at one path, or a file where another needs a directory: neither can be mounted.
  for (const [i, a] of mounts.entries()) {
    for (const [j, b] of mounts.entries()) {
      if (j <= i) continue;
      if (a.path === b.path) refuse(annotation, `${at}[${j}].path ${JSON.stringify(b.path)} is also ${at}[${i}].path`);
      const [outer, inner, oi, ii] = a.path.length < b.path.length ? [a, b, i, j] : [b, a, j, i];
      if (inner.path.startsWith(`${outer.path}/`))
        refuse(
          annotation,
          `${at}[${ii}].path ${JSON.stringify(inner.path)} is under ${at}[${oi}].path ${JSON.stringify(outer.path)}, which is a file`,
        );
    }
  }
  return mounts;
}

/** The annotation's value -> per container its mounts; throws POD_SECRETS_ANNOTATION_INVALID naming the annotation. */
export function parsePodSecretsAnnotation(value: string, annotation = POD_SECRETS_ANNOTATION): PodSecrets {
  if (value.length > POD_SECRETS_ANNOTATION_MAX_CHARS)
    refuse(annotation, `value is ${value.length} characters, more than the ${POD_SECRETS_ANNOTATION_MAX_CHARS} allowed`);
  let doc: unknown;
  try {
    doc = JSON.parse(value);
  } catch (err) {
    refuse(annotation, `value is not JSON (${(err as Error).message})`);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
    refuse(annotation, 'value must be a JSON object from container name to its list of {"resource", "path"}');
  const names = Object.keys(doc);
  if (names.length === 0) refuse(annotation, 'names no container; drop the annotation instead');
  if (names.length > POD_SECRETS_MAX_CONTAINERS)
    refuse(annotation, `names ${names.length} containers, more than the ${POD_SECRETS_MAX_CONTAINERS} allowed`);
  const out: PodSecrets = {};
  for (const name of names) {
    if (!CONTAINER_NAME.test(name))
      refuse(annotation, `${JSON.stringify(name)} is not a container name (lower-case letters, digits and '-', at most 63 characters)`);
    out[name] = parseContainerList(annotation, JSON.stringify(name), (doc as Record<string, unknown>)[name]);
  }
  return out;
}

/** The pod's secret annotation decoded (pure; {} without it). Every problem names the annotation. */
export function podSecretsFromAnnotations(annotations: Readonly<Record<string, string>> | undefined): PodSecrets {
  const value = annotations?.[POD_SECRETS_ANNOTATION];
  return value === undefined ? {} : parsePodSecretsAnnotation(value);
}

/**
 * The broker the initdata names, as the guest's attester reads it: `aa.toml`'s
 * `[token_configs.kbs] url`, or `cdh.toml`'s `[kbc] url`; null when it names none.
 */
export function initdataBrokerUrl(initdata: Initdata): string | null {
  const read = (file: string, table: string[]): string | null => {
    const text = initdata.data[file];
    if (text === undefined) return null;
    let node: unknown;
    try {
      node = parseToml(text);
    } catch {
      return null;
    }
    for (const key of [...table, 'url']) {
      if (typeof node !== 'object' || node === null) return null;
      node = (node as Record<string, unknown>)[key];
    }
    return typeof node === 'string' && node !== '' ? node : null;
  };
  return read('aa.toml', ['token_configs', 'kbs']) ?? read('cdh.toml', ['kbc']);
}

/**
 * A pod's secrets, judged against what the pod can attest with: refused on a handler without a
 * TEE (nothing would measure the guest that asks the broker) and without an initdata that names
 * a broker (the guest would have no one to ask). Names the annotation.
 */
export function checkPodSecretsAttestable(secrets: PodSecrets, tee: InitdataTeeKind, handler: string, initdata: Initdata | null): void {
  if (Object.keys(secrets).length === 0) return;
  const annotation = POD_SECRETS_ANNOTATION;
  const details = { field: `annotations["${annotation}"]`, handler };
  if (tee === 'none')
    throw invalid(
      'POD_SECRETS_NO_TEE',
      `annotation ${annotation}: handler "${handler}" has no TEE (tee.kind none), so no broker could tell this pod from any other; use a handler with tee.kind vtpm, snp, tdx or auto`,
      { details },
    );
  if (initdata === null || initdataBrokerUrl(initdata) === null)
    throw invalid(
      'POD_SECRETS_NO_BROKER',
      `annotation ${annotation}: the pod's initdata ${initdata === null ? 'is missing' : `(annotation ${initdata.annotation}) names no broker`}; give one whose aa.toml has [token_configs.kbs] url (or cdh.toml [kbc] url)`,
      { details },
    );
}

/** The mounts of the container named `name` ([] when the pod asks none for it). */
export function podSecretsFor(secrets: PodSecrets | null | undefined, name: string): PodSecretMount[] {
  return secrets?.[name] ?? [];
}
