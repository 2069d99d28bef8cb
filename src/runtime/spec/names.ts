/**
 * The names a pod or container request carries (metadata, hostname, label and annotation keys and
 * values), checked against Kubernetes' own rules before anything is planned: a name is only ever
 * stored, logged, listed and handed to the guest, so a NUL byte or a 300 KB string has nowhere to
 * go but into records, log lines and the guest agent. Pure: each function returns every problem;
 * `refuseNames` turns them into the one INVALID_ARGUMENT the decoders throw.
 *
 * Where a rule is looser than Kubernetes' it says why: the kubelet is not the only client (static
 * pods, critest, crictl), and a name the kubelet itself builds (the pod name copied into a label
 * value, a container's preStop handler as an annotation) must never be refused.
 */
import { invalid, type Reason } from '../../common/errors.js';

/** One thing wrong with a request's names: the code, the field, one sentence naming both. */
export interface NameProblem {
  reason: Reason;
  field: string;
  message: string;
}

/**
 * Object names (the pod's, and Kubernetes' limit for any object name: a DNS-1123 subdomain). The
 * kubelet sends DNS-1123 subdomains; critest (cri-tools v1.32, pkg/framework and pkg/validate)
 * sends mixed-case ones ("create-PodSandbox-for-container-<uuid>"), so a pod name is a DNS-1123
 * subdomain in either case (OBJECT_NAME). Nothing else: the name is spliced into CNI_ARGS
 * (`K8S_POD_NAME=<name>;...`, where a ";" or "=" would add or override a key), into the
 * kubelet-style log directory and into the guest, so no separator, space or path character passes.
 */
export const MAX_POD_NAME_BYTES = 253;
/**
 * Kubernetes container names are DNS-1123 labels (63 bytes), but critest, which this runtime
 * passes, names containers like "container-with-RunAsGroup-without-RunAsUser-test-<uuid>" (86
 * mixed-case bytes): the pod name's bound and grammar (OBJECT_NAME) apply instead.
 */
export const MAX_CONTAINER_NAME_BYTES = 253;
/** A namespace is a DNS-1123 label in Kubernetes, and the kubelet and critest send nothing else. */
export const MAX_NAMESPACE_BYTES = 63;
/**
 * Kubernetes does not bound a uid; the kubelet sends UUIDs (36 bytes), static pods a hex hash (32),
 * critest "cri-test-uid<uuid>" (48). 128 leaves room for other clients while keeping the pod's
 * identity, which every log line and ALREADY_EXISTS sentence repeats, short. Its grammar is UID.
 */
export const MAX_UID_BYTES = 128;
/** Linux's HOST_NAME_MAX: sethostname(2) refuses more (the kubelet sends at most 64, an FQDN). */
export const MAX_HOSTNAME_BYTES = 64;
/** The name part of a qualified name (a label or annotation key), as Kubernetes bounds it. */
export const MAX_KEY_NAME_BYTES = 63;
/** The optional prefix of a qualified name: a DNS-1123 subdomain. */
export const MAX_KEY_PREFIX_BYTES = 253;
/**
 * Kubernetes holds label values to 63 bytes, but the kubelet itself copies the pod name (up to 253)
 * into `io.kubernetes.pod.name`, and critest its 86-byte container names into
 * `io.kubernetes.container.name`: the object-name bound applies instead.
 */
export const MAX_LABEL_VALUE_BYTES = 253;
/**
 * Kubernetes' TotalAnnotationSizeLimitB (256 KiB, keys and values) on what the API server accepted,
 * plus room for the kubelet's own `kubernetes.io/config.*` keys, which it adds afterwards.
 */
export const MAX_POD_ANNOTATIONS_BYTES = 256 * 1024 + 4 * 1024;
/**
 * A container's annotations are the kubelet's, not the API's: its preStop handler and ports as
 * JSON, which only the pod object's size bounds (etcd stores at most 1.5 MiB by default), plus
 * what device plugins add. 2 MiB covers that and still refuses an annotation flood.
 */
export const MAX_CONTAINER_ANNOTATIONS_BYTES = 2 * 1024 * 1024;

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
/**
 * A DNS-1123 subdomain in either case (Kubernetes' object name, widened to upper case because
 * critest sends it): dot-separated labels of letters, digits and inner hyphens.
 */
const OBJECT_NAME = /^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$/;
/**
 * A pod uid. The API server makes UUIDs, the kubelet hashes static pods to hex, critest sends
 * "cri-test-uid<uuid>" and crictl users write what they like into pod.json: letters, digits,
 * "-", "_" and "." (containerd and CRI-O check nothing), never starting with a "." (no "."/".."
 * path segment in the kubelet's `<namespace>_<name>_<uid>` log directory) and never a ";", "=",
 * "/", space or control character, which would split CNI_ARGS or a path.
 */
const UID = /^[A-Za-z0-9][-A-Za-z0-9_.]*$/;
/** A host name label: RFC 1123, any case (Linux and the guest accept either). */
const HOST_LABEL = /^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$/;
/** A qualified name's prefix label: the API lowercases annotation keys before checking, so both cases pass. */
const PREFIX_LABEL = HOST_LABEL;
const KEY_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
/** Unicode control characters (C0, DEL, C1): never in a name, whatever the client. */
const CONTROL = /\p{Cc}/u;
/** What a quoted name shows escaped: controls, format characters (bidi overrides), line separators. */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;
/** How much of an offending key a sentence quotes. */
const QUOTE_CHARS = 64;

const bytes = (s: string): number => Buffer.byteLength(s);

/** `s` quoted for a sentence: short, and with nothing in it that could bend a terminal or a log line. */
function quote(s: string): string {
  const cut = s.length > QUOTE_CHARS ? `${s.slice(0, QUOTE_CHARS)}...` : s;
  const shown = cut.replace(UNPRINTABLE, (c) => `\\u{${c.codePointAt(0)?.toString(16).padStart(4, '0')}}`);
  return `"${shown.replaceAll('"', '\\"')}"`;
}

/** "U+0000" for the first control character of `s`, or undefined when it has none. */
function controlIn(s: string): string | undefined {
  const m = CONTROL.exec(s);
  return m === null ? undefined : `U+${m[0].codePointAt(0)?.toString(16).toUpperCase().padStart(4, '0')}`;
}

/**
 * Non-empty, bounded, no control character, and of `grammar` (said as `grammarText`): the rule
 * for names the kubelet is not the only sender of.
 */
function grammarName(value: string, field: string, maxBytes: number, reason: Reason, grammar: RegExp, grammarText: string): NameProblem[] {
  if (value === '') return [{ reason, field, message: `${field} must not be empty` }];
  if (bytes(value) > maxBytes)
    return [{ reason, field, message: `${field} is ${bytes(value)} bytes long; at most ${maxBytes} are allowed` }];
  const control = controlIn(value);
  if (control !== undefined) return [{ reason, field, message: `${field} holds a control character (${control})` }];
  if (!grammar.test(value)) return [{ reason, field, message: `${field} ${quote(value)} is not ${grammarText}` }];
  return [];
}

const OBJECT_NAME_TEXT = 'a DNS-1123 subdomain (dot-separated letters, digits and inner hyphens)';
const UID_TEXT = 'a uid (letters, digits, "-", "_" and ".", starting with a letter or digit)';

function hostnameProblems(hostname: string, field: string): NameProblem[] {
  if (hostname === '') return [];
  const reason: Reason = 'SANDBOX_HOSTNAME_INVALID';
  if (bytes(hostname) > MAX_HOSTNAME_BYTES)
    return [{ reason, field, message: `${field} is ${bytes(hostname)} bytes long; at most ${MAX_HOSTNAME_BYTES} are allowed` }];
  if (!hostname.split('.').every((l) => l.length <= 63 && HOST_LABEL.test(l)))
    return [
      {
        reason,
        field,
        message: `${field} ${quote(hostname)} is not a host name (dot-separated labels of at most 63 letters, digits and inner hyphens)`,
      },
    ];
  return [];
}

/**
 * Why `key` is not a Kubernetes qualified name (`[prefix/]name`: the prefix a DNS-1123 subdomain
 * of at most 253 bytes, the name at most 63 of letters, digits, `-`, `_`, `.`, alphanumeric at
 * both ends), or undefined when it is one.
 */
export function qualifiedNameFault(key: string): string | undefined {
  const parts = key.split('/');
  if (parts.length > 2) return 'holds more than one "/"';
  const name = parts.at(-1) ?? '';
  if (parts.length === 2) {
    const prefix = parts[0] ?? '';
    if (prefix === '') return 'has an empty prefix before "/"';
    if (bytes(prefix) > MAX_KEY_PREFIX_BYTES) return `has a prefix of ${bytes(prefix)} bytes; at most ${MAX_KEY_PREFIX_BYTES} are allowed`;
    if (!prefix.split('.').every((l) => PREFIX_LABEL.test(l))) return 'has a prefix that is not a DNS subdomain';
  }
  if (name === '') return 'has an empty name';
  if (bytes(name) > MAX_KEY_NAME_BYTES) return `has a name of ${bytes(name)} bytes; at most ${MAX_KEY_NAME_BYTES} are allowed`;
  if (!KEY_NAME.test(name)) return 'has a name that is not letters, digits, "-", "_" and "." between alphanumerics';
  return undefined;
}

function labelProblems(labels: Record<string, string>, field: string): NameProblem[] {
  const out: NameProblem[] = [];
  for (const [key, value] of Object.entries(labels)) {
    const fault = qualifiedNameFault(key);
    if (fault !== undefined) out.push({ reason: 'LABEL_KEY_INVALID', field, message: `${field} key ${quote(key)} ${fault}` });
    else if (bytes(value) > MAX_LABEL_VALUE_BYTES)
      out.push({
        reason: 'LABEL_VALUE_INVALID',
        field,
        message: `${field} value of ${quote(key)} is ${bytes(value)} bytes long; at most ${MAX_LABEL_VALUE_BYTES} are allowed`,
      });
    else {
      const control = controlIn(value);
      if (control !== undefined)
        out.push({
          reason: 'LABEL_VALUE_INVALID',
          field,
          message: `${field} value of ${quote(key)} holds a control character (${control})`,
        });
    }
  }
  return out;
}

/** Annotation values are free-form (JSON, scripts, newlines), but a NUL ends a C string early wherever one is passed on. */
function annotationProblems(annotations: Record<string, string>, field: string, maxTotalBytes: number): NameProblem[] {
  const out: NameProblem[] = [];
  let totalBytes = 0;
  for (const [key, value] of Object.entries(annotations)) {
    totalBytes += bytes(key) + bytes(value);
    const fault = qualifiedNameFault(key);
    if (fault !== undefined) out.push({ reason: 'ANNOTATION_KEY_INVALID', field, message: `${field} key ${quote(key)} ${fault}` });
    else if (value.includes('\0'))
      out.push({ reason: 'ANNOTATION_VALUE_INVALID', field, message: `${field} value of ${quote(key)} holds a NUL byte` });
  }
  if (totalBytes > maxTotalBytes)
    out.push({
      reason: 'ANNOTATIONS_TOO_LARGE',
      field,
      message: `${field} take ${totalBytes} bytes (keys and values); at most ${maxTotalBytes} are allowed`,
    });
  return out;
}

/** What a pod request names: its CRI PodSandboxConfig has these fields, and so may another face's. */
export interface SandboxNames {
  metadata: { name: string; namespace: string; uid: string; attempt: number } | null;
  hostname: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

/** What a container request names. */
export interface ContainerNames {
  metadata: { name: string; attempt: number } | null;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

/** attempt is a uint32 on the wire; a face that does not type it must not pass anything else. */
function attemptProblems(attempt: number, field: string, reason: Reason): NameProblem[] {
  return Number.isInteger(attempt) && attempt >= 0 && attempt <= 0xffff_ffff
    ? []
    : [{ reason, field, message: `${field} must be an integer from 0 to 4294967295` }];
}

/** Every problem with a pod request's names; `prefix` is how the request names the config. */
export function sandboxNameProblems(config: SandboxNames, prefix = 'config'): NameProblem[] {
  const m = config.metadata;
  const reason: Reason = 'SANDBOX_METADATA_INVALID';
  const out: NameProblem[] =
    m === null
      ? [{ reason: 'SANDBOX_METADATA_MISSING', field: `${prefix}.metadata`, message: `${prefix}.metadata is required` }]
      : [
          ...grammarName(m.name, `${prefix}.metadata.name`, MAX_POD_NAME_BYTES, reason, OBJECT_NAME, OBJECT_NAME_TEXT),
          ...namespaceProblems(m.namespace, `${prefix}.metadata.namespace`),
          ...grammarName(m.uid, `${prefix}.metadata.uid`, MAX_UID_BYTES, reason, UID, UID_TEXT),
          ...attemptProblems(m.attempt, `${prefix}.metadata.attempt`, reason),
        ];
  return [
    ...out,
    ...hostnameProblems(config.hostname, `${prefix}.hostname`),
    ...labelProblems(config.labels, `${prefix}.labels`),
    ...annotationProblems(config.annotations, `${prefix}.annotations`, MAX_POD_ANNOTATIONS_BYTES),
  ];
}

function namespaceProblems(namespace: string, field: string): NameProblem[] {
  const reason: Reason = 'SANDBOX_METADATA_INVALID';
  if (namespace === '') return [{ reason, field, message: `${field} must not be empty` }];
  if (bytes(namespace) > MAX_NAMESPACE_BYTES)
    return [{ reason, field, message: `${field} is ${bytes(namespace)} bytes long; at most ${MAX_NAMESPACE_BYTES} are allowed` }];
  if (!DNS_LABEL.test(namespace))
    return [
      {
        reason,
        field,
        message: `${field} ${quote(namespace)} is not a DNS-1123 label (lower-case letters, digits and inner hyphens)`,
      },
    ];
  return [];
}

/** Every problem with a container request's names. */
export function containerNameProblems(config: ContainerNames, prefix = 'config'): NameProblem[] {
  const m = config.metadata;
  const reason: Reason = 'CONTAINER_METADATA_INVALID';
  const out: NameProblem[] =
    m === null
      ? [{ reason, field: `${prefix}.metadata`, message: `${prefix}.metadata is required` }]
      : [
          ...grammarName(m.name, `${prefix}.metadata.name`, MAX_CONTAINER_NAME_BYTES, reason, OBJECT_NAME, OBJECT_NAME_TEXT),
          ...attemptProblems(m.attempt, `${prefix}.metadata.attempt`, reason),
        ];
  return [
    ...out,
    ...labelProblems(config.labels, `${prefix}.labels`),
    ...annotationProblems(config.annotations, `${prefix}.annotations`, MAX_CONTAINER_ANNOTATIONS_BYTES),
  ];
}

/**
 * Throw INVALID_ARGUMENT for the first problem (its reason, its sentence, how many more there
 * are), as the decoders report; nothing when there is none.
 */
export function refuseNames(problems: readonly NameProblem[]): void {
  const [first] = problems;
  if (first === undefined) return;
  const more = problems.length - 1;
  const tail = more === 0 ? '' : ` (and ${more} more problem${more === 1 ? '' : 's'} with this request's names)`;
  throw invalid(first.reason, `${first.message}${tail}`, { details: { problems: problems.length } });
}
