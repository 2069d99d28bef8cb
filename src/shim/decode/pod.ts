/**
 * The sandbox (pause) container's config.json -> the core's `SandboxSpec`, plus the facts of the
 * pod's placement the spec does not hold (pure). The spec is assembled as the PodSandboxConfig
 * the kubelet sent containerd (or CRI-O), so far as the config.json still says it, and then goes
 * through the core's own validator (`decodeSandboxSpec`): every rule about names, log paths and
 * host namespaces is the core's; this file only says where each value comes from and names the
 * annotation or field a refusal is about.
 */
import path from 'node:path';
import { invalid } from '../../common/errors.js';
import type { DNSConfig__Output } from '../../generated/runtime/v1/DNSConfig.js';
import type { LinuxContainerResources__Output } from '../../generated/runtime/v1/LinuxContainerResources.js';
import type { LinuxSandboxSecurityContext__Output } from '../../generated/runtime/v1/LinuxSandboxSecurityContext.js';
import type { PodSandboxConfig__Output } from '../../generated/runtime/v1/PodSandboxConfig.js';
import { checkLogDirectory } from '../../runtime/spec/log-path.js';
import { refuseNames, sandboxNameProblems } from '../../runtime/spec/names.js';
import { decodeSandboxSpec, type SandboxSpec } from '../../runtime/spec/sandbox.js';
import { CGROUP_NUMBER_MIN, parseCgroupNumber } from '../../sizing/linux-resources.js';
import { CONTAINERD_ANNOTATIONS as SIZING_ANNOTATIONS } from '../../sizing/sources.js';
import {
  annotationField,
  bundleRoleOf,
  CONTAINERD_ANNOTATIONS,
  CRIO_ANNOTATIONS,
  crioBoolean,
  crioLabels,
  crioMetadata,
  KUBELET_LABELS,
  type ManagerKind,
  renameProblems,
  requireAnnotation,
} from './annotations.js';
import { hasNamespace, namespaceOf, namespaceOptions } from './namespaces.js';
import './reasons.js';
import { type OciRuntimeSpec, parseOciRuntimeSpec } from './spec.js';

export interface PodDecodeOptions {
  /**
   * The text of the pod's resolv.conf (the file `resolvConfPath` names: containerd wrote it from
   * the kubelet's dns_config, or copied the host's), parsed into `dns_config`. Absent: dns_config
   * null, and containers keep their image's own resolv.conf.
   */
  resolvConf?: string;
  /**
   * Whether the pod is privileged, when the caller knows. containerd's pause config does not say
   * (containerd itself refuses a privileged container in a pod that is not); CRI-O's
   * `PrivilegedRuntime` annotation does. Default: that annotation, else false.
   */
  privileged?: boolean;
  /**
   * The task's bundle directory. CRI-O writes the pod's resolv.conf into the pause container's
   * run directory, which is also its bundle (`<RunDir>/resolv.conf`, internal/lib/sandbox/infra.go),
   * and names it in the ResolvPath annotation, which the shim reads as root: an annotation naming
   * any other file is refused. Absent (decoders' unit tests): not checked.
   */
  bundle?: string;
}

/** Where the pod's cgroup is, as `linux.cgroupsPath` says. */
export interface CgroupPlacement {
  /** `slice:prefix:name` is systemd's form (runc's), anything else a cgroupfs path. */
  driver: 'systemd' | 'cgroupfs';
  /** The cgroup_parent the kubelet sent: the slice (systemd; '' for the manager's default) or the directory above the sandbox's own (cgroupfs). */
  parent: string;
  /** `linux.cgroupsPath` as written. */
  cgroupsPath: string;
}

export interface DecodedPod {
  spec: SandboxSpec;
  /** Which manager wrote the config.json. */
  kind: ManagerKind;
  /** The sandbox's id as its annotations name it. */
  sandboxId: string;
  /** null: no `linux.cgroupsPath` (containerd without cgroups, or none given). */
  cgroup: CgroupPlacement | null;
  /** The network namespace containerd made and ran CNI in; null: a namespace of its own with no network. */
  netnsPath: string | null;
  /** The host file mounted at the pause container's /etc/resolv.conf (read it for `options.resolvConf`), or null. */
  resolvConfPath: string | null;
}

/** The pod's identity and where each part came from, for refusals. */
interface Identity {
  name: string;
  namespace: string;
  uid: string;
  attempt: number;
  fields: { name: string; namespace: string; uid: string; attempt: string };
}

function containerdIdentity(annotations: Readonly<Record<string, string>>): Identity {
  const A = CONTAINERD_ANNOTATIONS;
  return {
    name: requireAnnotation(annotations, A.sandboxName, 'containerd'),
    namespace: requireAnnotation(annotations, A.sandboxNamespace, 'containerd'),
    uid: requireAnnotation(annotations, A.sandboxUid, 'containerd'),
    // containerd does not write the attempt; a re-created sandbox is a new pause container anyway.
    attempt: 0,
    fields: {
      name: annotationField(A.sandboxName),
      namespace: annotationField(A.sandboxNamespace),
      uid: annotationField(A.sandboxUid),
      attempt: 'attempt',
    },
  };
}

/** CRI-O: the Metadata JSON, else KubeName / Namespace / the kubelet's uid label. */
function crioIdentity(annotations: Readonly<Record<string, string>>): Identity {
  const m = crioMetadata(annotations);
  const metadataField = annotationField(CRIO_ANNOTATIONS.metadata);
  const pick = (fromMetadata: string | undefined, fallbacks: readonly string[], what: string): { value: string; field: string } => {
    if (fromMetadata !== undefined && fromMetadata !== '') return { value: fromMetadata, field: `${metadataField}.${what}` };
    for (const key of fallbacks) {
      const v = annotations[key];
      if (v !== undefined && v !== '') return { value: v, field: annotationField(key) };
    }
    throw invalid(
      'SHIM_ANNOTATION_MISSING',
      `${metadataField} has no ${what}, and neither has ${fallbacks.map(annotationField).join(' nor ')}`,
      { details: { annotation: CRIO_ANNOTATIONS.metadata } },
    );
  };
  const name = pick(m.name, [CRIO_ANNOTATIONS.kubeName, KUBELET_LABELS.podName], 'name');
  const namespace = pick(m.namespace, [CRIO_ANNOTATIONS.namespace, KUBELET_LABELS.podNamespace], 'namespace');
  const uid = pick(m.uid, [KUBELET_LABELS.podUid], 'uid');
  return {
    name: name.value,
    namespace: namespace.value,
    uid: uid.value,
    attempt: m.attempt ?? 0,
    fields: { name: name.field, namespace: namespace.field, uid: uid.field, attempt: `${metadataField}.attempt` },
  };
}

/** `slice:prefix:name` (systemd, as runc takes it) or a path (cgroupfs); refused when neither. */
export function cgroupPlacementOf(cgroupsPath: string | undefined): CgroupPlacement | null {
  if (cgroupsPath === undefined || cgroupsPath === '') return null;
  const systemd = /^([^:/]*):([^:/]*):([^:/]+)$/.exec(cgroupsPath);
  if (systemd !== null) return { driver: 'systemd', parent: systemd[1]!, cgroupsPath };
  const components = cgroupsPath.split('/').filter((c) => c !== '');
  if (cgroupsPath.includes(':') || cgroupsPath.includes('\0') || components.length === 0) {
    throw invalid(
      'SHIM_CGROUPS_PATH_INVALID',
      `linux.cgroupsPath ${JSON.stringify(cgroupsPath)} is neither "slice:prefix:name" (systemd) nor a cgroup path ending in the sandbox's own directory (cgroupfs)`,
      { details: { cgroupsPath } },
    );
  }
  const parent = path.posix.dirname(cgroupsPath);
  return { driver: 'cgroupfs', parent: parent === '.' ? '' : parent, cgroupsPath };
}

/**
 * resolv.conf text -> the CRI's DNSConfig: every `nameserver`, the last `search` line's domains
 * (as the resolver reads it), every `options` word; comments and other lines are skipped.
 */
export function parseResolvConf(text: string): DNSConfig__Output {
  const out: DNSConfig__Output = { servers: [], searches: [], options: [] };
  for (const raw of text.split('\n')) {
    const line = raw.replace(/[#;].*$/, '').trim();
    const [keyword, ...words] = line.split(/\s+/);
    if (keyword === 'nameserver' && words[0] !== undefined) out.servers.push(words[0]);
    else if (keyword === 'search' || keyword === 'domain') out.searches = words;
    else if (keyword === 'options') out.options.push(...words);
  }
  return out;
}

/**
 * The pod's `linux.resources` from containerd's sandbox annotations (written from the kubelet's
 * LinuxPodSandboxConfig.resources with strconv.FormatInt, all four or none), checked by the
 * sizing planner's own integer rules; null when containerd wrote none (or the spec is CRI-O's,
 * whose PodLinuxResources annotation the planner reads itself).
 */
function podResources(annotations: Readonly<Record<string, string>>): LinuxContainerResources__Output | null {
  const A = SIZING_ANNOTATIONS;
  if (![A.cpuPeriod, A.cpuQuota, A.cpuShares, A.memory].some((k) => k in annotations)) return null;
  const read = (key: string, min: bigint): string => {
    const value = annotations[key];
    if (value === '') throw invalid('SHIM_ANNOTATION_INVALID', `${annotationField(key)} must be an integer, got ""`);
    return parseCgroupNumber(value, annotationField(key), min).toString();
  };
  return {
    cpu_period: read(A.cpuPeriod, CGROUP_NUMBER_MIN.cpu_period),
    cpu_quota: read(A.cpuQuota, CGROUP_NUMBER_MIN.cpu_quota),
    cpu_shares: read(A.cpuShares, CGROUP_NUMBER_MIN.cpu_shares),
    memory_limit_in_bytes: read(A.memory, CGROUP_NUMBER_MIN.memory_limit_in_bytes),
    oom_score_adj: '0',
    cpuset_cpus: '',
    cpuset_mems: '',
    hugepage_limits: [],
    unified: {},
    memory_swap_limit_in_bytes: '0',
  };
}

function bindSource(oci: OciRuntimeSpec, destination: string): string | null {
  const m = oci.mounts?.find((x) => path.posix.normalize(x.destination) === destination && x.source !== undefined && x.source !== '');
  return m?.source ?? null;
}

/**
 * CRI-O's ResolvPath annotation: none when absent or '' (a pod without dns_config), else exactly
 * `<bundle>/resolv.conf` (see PodDecodeOptions.bundle), or INVALID_ARGUMENT naming the annotation.
 */
function crioResolvPath(annotations: Readonly<Record<string, string>>, bundle: string | undefined): string | undefined {
  const value = annotations[CRIO_ANNOTATIONS.resolvPath];
  if (value === undefined || value === '') return undefined;
  // /var/run is /run on every distribution CRI-O runs on (a link): either spelling names the same bundle.
  const canonical = (p: string) => path.posix.normalize(p).replace(/^\/var\/run\//, '/run/');
  if (bundle !== undefined && (value.includes('\0') || canonical(value) !== canonical(path.posix.join(bundle, 'resolv.conf'))))
    throw invalid(
      'SHIM_ANNOTATION_INVALID',
      `${annotationField(CRIO_ANNOTATIONS.resolvPath)} must name resolv.conf in the sandbox's bundle (${path.posix.join(bundle, 'resolv.conf')}), not ${JSON.stringify(value.slice(0, 256))}`,
      { details: { annotation: CRIO_ANNOTATIONS.resolvPath } },
    );
  return value;
}

/**
 * The sandbox container's config.json (untrusted JSON) -> the pod's `SandboxSpec` and placement
 * facts, or INVALID_ARGUMENT naming the annotation or field at fault.
 */
export function decodePodSpec(oci: unknown, options: PodDecodeOptions = {}): DecodedPod {
  const spec = parseOciRuntimeSpec(oci);
  const annotations = spec.annotations ?? {};
  const role = bundleRoleOf(annotations);
  if (role.role !== 'sandbox') {
    const key = role.kind === 'containerd' ? CONTAINERD_ANNOTATIONS.containerType : CRIO_ANNOTATIONS.containerType;
    throw invalid(
      'SHIM_CONTAINER_TYPE_MISMATCH',
      `${annotationField(key)} is "container", but a pod starts from its sandbox's config.json`,
      {
        details: { annotation: key },
      },
    );
  }
  const crio = role.kind === 'cri-o';
  const id = crio ? crioIdentity(annotations) : containerdIdentity(annotations);
  const logDirectory = crio
    ? annotations[CRIO_ANNOTATIONS.logPath] === undefined
      ? ''
      : path.posix.dirname(annotations[CRIO_ANNOTATIONS.logPath]!)
    : (annotations[CONTAINERD_ANNOTATIONS.sandboxLogDirectory] ?? '');
  const logField = annotationField(crio ? CRIO_ANNOTATIONS.logPath : CONTAINERD_ANNOTATIONS.sandboxLogDirectory);
  const labels = crio ? crioLabels(annotations) : {};
  const privileged = options.privileged ?? (crio ? crioBoolean(annotations, CRIO_ANNOTATIONS.privileged, false) : false);
  const cgroup = cgroupPlacementOf(spec.linux?.cgroupsPath);
  const network = namespaceOf(spec, 'network');

  const security: LinuxSandboxSecurityContext__Output = {
    namespace_options: {
      ...namespaceOptions({
        network: hasNamespace(spec, 'network') ? 'POD' : 'NODE',
        ipc: hasNamespace(spec, 'ipc') ? 'POD' : 'NODE',
        // The pause container gets a PID namespace of its own whether the pod shares one or not;
        // each container's config.json says which (the core reads only network and ipc here).
        pid: hasNamespace(spec, 'pid') ? 'CONTAINER' : 'NODE',
      }),
      userns_options: hasNamespace(spec, 'user') ? { mode: 'POD', uids: [], gids: [] } : null,
    },
    selinux_options: null,
    run_as_user: null,
    readonly_rootfs: false,
    supplemental_groups: [],
    privileged,
    seccomp_profile_path: '',
    run_as_group: null,
    seccomp: null,
    apparmor: null,
    supplemental_groups_policy: 'Merge',
  };
  const config: PodSandboxConfig__Output = {
    metadata: { name: id.name, uid: id.uid, namespace: id.namespace, attempt: id.attempt },
    hostname: spec.hostname ?? '',
    log_directory: logDirectory,
    dns_config: options.resolvConf === undefined ? null : parseResolvConf(options.resolvConf),
    port_mappings: [],
    labels,
    annotations: { ...annotations },
    linux: {
      cgroup_parent: cgroup?.parent ?? '',
      security_context: security,
      sysctls: { ...(spec.linux?.sysctl ?? {}) },
      overhead: null,
      resources: crio ? null : podResources(annotations),
    },
    windows: null,
    pod_resources: null,
  };

  refuseNames(
    renameProblems(sandboxNameProblems(config), {
      'config.metadata.name': id.fields.name,
      'config.metadata.namespace': id.fields.namespace,
      'config.metadata.uid': id.fields.uid,
      'config.metadata.attempt': id.fields.attempt,
      'config.hostname': 'hostname',
      'config.labels': annotationField(CRIO_ANNOTATIONS.labels),
      'config.annotations': 'annotations',
    }),
  );
  checkLogDirectory(logDirectory, logField);
  return {
    spec: decodeSandboxSpec(config),
    kind: role.kind,
    sandboxId: role.sandboxId,
    cgroup,
    netnsPath: network?.path === undefined || network.path === '' ? null : network.path,
    resolvConfPath: (crio ? crioResolvPath(annotations, options.bundle) : undefined) ?? bindSource(spec, '/etc/resolv.conf'),
  };
}
