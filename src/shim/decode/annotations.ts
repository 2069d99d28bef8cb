/**
 * The annotations containerd's CRI plugin and CRI-O write into the OCI specs they hand a shim,
 * and how to read them: which manager wrote a spec, whether it is the pod's sandbox (pause)
 * container or an app container, and the identities both put there. Pure.
 *
 * containerd 1.6-2.x (pkg/cri/annotations, internal/cri/annotations in 2.x): every spec carries
 * `io.kubernetes.cri.container-type` (`sandbox` | `container`), `-sandbox-id`, `-sandbox-name`,
 * `-sandbox-namespace`, `-sandbox-uid`; the sandbox's also `-sandbox-log-directory` and, when the
 * kubelet sent `linux.resources`, `-sandbox-cpu-period/-quota/-shares` and `-sandbox-memory`; an app
 * container's `-container-name` and `-image-name`. Pod annotations reach the spec only where the
 * runtime's `pod_annotations` patterns let them through (`io.kubernetes.cri.pod-annotations` is a
 * declared name containerd 1.6 never writes).
 *
 * CRI-O (internal/annotations, pkg/annotations): `io.kubernetes.cri-o.ContainerType`,
 * `.SandboxID`, `.Metadata` (the CRI metadata as JSON: name, uid, namespace, attempt), `.KubeName`,
 * `.Namespace`, `.Labels` (JSON), `.LogPath`, `.Image`, `.ImageName`, `.PrivilegedRuntime`,
 * `.Stdin`, `.StdinOnce`, `.ResolvPath`; the pod's labels and annotations are also copied in as
 * annotations of their own (the kubelet's `io.kubernetes.pod.uid`, ...).
 */
import { invalid } from '../../common/errors.js';
import type { NameProblem } from '../../runtime/spec/names.js';
import './reasons.js';

export const CONTAINERD_ANNOTATIONS = {
  containerType: 'io.kubernetes.cri.container-type',
  sandboxId: 'io.kubernetes.cri.sandbox-id',
  sandboxName: 'io.kubernetes.cri.sandbox-name',
  sandboxNamespace: 'io.kubernetes.cri.sandbox-namespace',
  sandboxUid: 'io.kubernetes.cri.sandbox-uid',
  sandboxLogDirectory: 'io.kubernetes.cri.sandbox-log-directory',
  containerName: 'io.kubernetes.cri.container-name',
  imageName: 'io.kubernetes.cri.image-name',
} as const;

export const CRIO_ANNOTATIONS = {
  containerType: 'io.kubernetes.cri-o.ContainerType',
  sandboxId: 'io.kubernetes.cri-o.SandboxID',
  metadata: 'io.kubernetes.cri-o.Metadata',
  kubeName: 'io.kubernetes.cri-o.KubeName',
  namespace: 'io.kubernetes.cri-o.Namespace',
  labels: 'io.kubernetes.cri-o.Labels',
  logPath: 'io.kubernetes.cri-o.LogPath',
  image: 'io.kubernetes.cri-o.Image',
  imageName: 'io.kubernetes.cri-o.ImageName',
  privileged: 'io.kubernetes.cri-o.PrivilegedRuntime',
  stdin: 'io.kubernetes.cri-o.Stdin',
  stdinOnce: 'io.kubernetes.cri-o.StdinOnce',
  resolvPath: 'io.kubernetes.cri-o.ResolvPath',
} as const;

/** The kubelet's labels, which CRI-O copies into the spec as annotations. */
export const KUBELET_LABELS = {
  podName: 'io.kubernetes.pod.name',
  podNamespace: 'io.kubernetes.pod.namespace',
  podUid: 'io.kubernetes.pod.uid',
  containerName: 'io.kubernetes.container.name',
} as const;

/** Which container manager wrote a spec (its annotations' dialect). */
export type ManagerKind = 'containerd' | 'cri-o';

/** What a bundle's spec is: the pod's sandbox or one of its app containers, and of which pod. */
export interface BundleRole {
  role: 'sandbox' | 'container';
  /** The pod's sandbox id (the sandbox container's own id for the sandbox). */
  sandboxId: string;
  kind: ManagerKind;
}

/** How a refusal names an annotation: `annotations["io.kubernetes.cri.sandbox-name"]`. */
export function annotationField(key: string): string {
  return `annotations[${JSON.stringify(key)}]`;
}

/** A present, non-empty annotation, or a refusal naming it. */
export function requireAnnotation(annotations: Readonly<Record<string, string>>, key: string, writer: string): string {
  const value = annotations[key];
  if (value === undefined) {
    throw invalid('SHIM_ANNOTATION_MISSING', `${annotationField(key)} is missing; ${writer} writes it into every such config.json`, {
      details: { annotation: key },
    });
  }
  if (value === '') throw invalid('SHIM_ANNOTATION_INVALID', `${annotationField(key)} must not be empty`, { details: { annotation: key } });
  return value;
}

/** An annotation holding JSON (CRI-O's), parsed; undefined when absent. */
export function jsonAnnotation(annotations: Readonly<Record<string, string>>, key: string): unknown {
  const text = annotations[key];
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch (cause) {
    throw invalid('SHIM_ANNOTATION_INVALID', `${annotationField(key)} is not JSON`, { cause, details: { annotation: key } });
  }
}

/** CRI-O's Labels annotation: a JSON object of strings (`null` for none); {} when absent. */
export function crioLabels(annotations: Readonly<Record<string, string>>): Record<string, string> {
  const doc = jsonAnnotation(annotations, CRIO_ANNOTATIONS.labels);
  if (doc === undefined || doc === null) return {};
  if (typeof doc !== 'object' || Array.isArray(doc) || !Object.values(doc).every((v) => typeof v === 'string')) {
    throw invalid('SHIM_ANNOTATION_INVALID', `${annotationField(CRIO_ANNOTATIONS.labels)} must be a JSON object of strings`, {
      details: { annotation: CRIO_ANNOTATIONS.labels },
    });
  }
  return { ...(doc as Record<string, string>) };
}

/** CRI-O's Metadata annotation (Go's json of the CRI metadata: omitempty fields); {} when absent. */
export function crioMetadata(annotations: Readonly<Record<string, string>>): {
  name?: string;
  uid?: string;
  namespace?: string;
  attempt?: number;
} {
  const doc = jsonAnnotation(annotations, CRIO_ANNOTATIONS.metadata);
  if (doc === undefined || doc === null) return {};
  const field = annotationField(CRIO_ANNOTATIONS.metadata);
  if (typeof doc !== 'object' || Array.isArray(doc)) {
    throw invalid('SHIM_ANNOTATION_INVALID', `${field} must be a JSON object (the CRI metadata)`, {
      details: { annotation: CRIO_ANNOTATIONS.metadata },
    });
  }
  const m = doc as Record<string, unknown>;
  const out: { name?: string; uid?: string; namespace?: string; attempt?: number } = {};
  for (const key of ['name', 'uid', 'namespace'] as const) {
    const v = m[key];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'string') {
      throw invalid('SHIM_ANNOTATION_INVALID', `${field} has a "${key}" that is not a string`, {
        details: { annotation: CRIO_ANNOTATIONS.metadata },
      });
    }
    out[key] = v;
  }
  const attempt = m.attempt;
  if (attempt !== undefined && attempt !== null) {
    if (typeof attempt !== 'number' || !Number.isInteger(attempt) || attempt < 0 || attempt > 0xffff_ffff) {
      throw invalid('SHIM_ANNOTATION_INVALID', `${field} has an "attempt" that is not an integer from 0 to 4294967295`, {
        details: { annotation: CRIO_ANNOTATIONS.metadata },
      });
    }
    out.attempt = attempt;
  }
  return out;
}

/** A CRI-O boolean annotation ("true" / "false", Go's strconv.FormatBool); `fallback` when absent. */
export function crioBoolean(annotations: Readonly<Record<string, string>>, key: string, fallback: boolean): boolean {
  const value = annotations[key];
  if (value === undefined) return fallback;
  if (value === 'true') return true;
  if (value === 'false') return false;
  throw invalid('SHIM_ANNOTATION_INVALID', `${annotationField(key)} must be "true" or "false", got ${JSON.stringify(value)}`, {
    details: { annotation: key },
  });
}

/**
 * Who wrote the spec and what it is. containerd's annotation wins where both are present (CRI-O
 * never writes it); a spec with neither did not come from a Kubernetes container manager.
 */
export function bundleRoleOf(annotations: Readonly<Record<string, string>>): BundleRole {
  let kind: ManagerKind;
  let typeKey: string;
  let idKey: string;
  if (annotations[CONTAINERD_ANNOTATIONS.containerType] !== undefined) {
    kind = 'containerd';
    typeKey = CONTAINERD_ANNOTATIONS.containerType;
    idKey = CONTAINERD_ANNOTATIONS.sandboxId;
  } else if (annotations[CRIO_ANNOTATIONS.containerType] !== undefined) {
    kind = 'cri-o';
    typeKey = CRIO_ANNOTATIONS.containerType;
    idKey = CRIO_ANNOTATIONS.sandboxId;
  } else {
    throw invalid(
      'SHIM_ANNOTATION_MISSING',
      `${annotationField(CONTAINERD_ANNOTATIONS.containerType)} is missing (and so is CRI-O's ${annotationField(CRIO_ANNOTATIONS.containerType)}); kata-ts runs pods that containerd's CRI or CRI-O create`,
      { details: { annotation: CONTAINERD_ANNOTATIONS.containerType } },
    );
  }
  const type = annotations[typeKey];
  if (type !== 'sandbox' && type !== 'container') {
    throw invalid('SHIM_ANNOTATION_INVALID', `${annotationField(typeKey)} must be "sandbox" or "container", got ${JSON.stringify(type)}`, {
      details: { annotation: typeKey },
    });
  }
  return { role: type, sandboxId: requireAnnotation(annotations, idKey, kind), kind };
}

/**
 * Name problems with each field named as the config.json has it (the annotation the value came
 * from), not as the CRI request would: the rules are the core's (`sandboxNameProblems`, `containerNameProblems`).
 */
export function renameProblems(problems: readonly NameProblem[], fields: Readonly<Record<string, string>>): NameProblem[] {
  return problems.map((p) => {
    const field = fields[p.field];
    if (field === undefined) return p;
    const message = p.message.startsWith(p.field) ? `${field}${p.message.slice(p.field.length)}` : p.message;
    return { ...p, field, message };
  });
}
