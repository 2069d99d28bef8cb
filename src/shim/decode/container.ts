/**
 * An app container's config.json -> the core's `ContainerSpec` (pure). The config.json is what
 * containerd (or CRI-O) made of the kubelet's ContainerConfig and the image: the final argv,
 * environment, user, capabilities, mounts and cgroup limits. It is turned back into the
 * ContainerConfig that says the same thing and goes through the core's own validator
 * (`decodeContainerSpec`), so that the guest's spec, built again by `buildOciSpec`, runs exactly
 * what containerd would have run:
 *
 * - argv: `command` = process.args, `args` = [] (buildOciSpec then uses the command as it is,
 *   without an image Entrypoint or Cmd); env, working dir and tty as given;
 * - user: uid, gid and additional gids as `run_as_user`, `run_as_group`, `supplemental_groups`
 *   with the `Strict` policy (containerd already merged the image's /etc/group memberships in);
 * - capabilities: drop ALL, then add the bounding set (the ceiling every exec'd program is held
 *   to); a privileged container (`isPrivilegedSpec`: containerd's allow-all device rule, or
 *   WithPrivileged's marks where privileged_without_host_devices left the rule out) is `privileged`;
 * - seccomp: the filter as given (written to a file by the caller, a Localhost profile), or
 *   without that file any filter -> RuntimeDefault; none -> Unconfined;
 *   masked and readonly paths, no_new_privs, a read-only root as given; AppArmor and SELinux
 *   labels are the host's and dropped;
 * - namespaces: left out -> NODE, with a path -> POD, without -> CONTAINER;
 * - mounts: every bind mount except the pod files the manager keeps per sandbox (`hosts`,
 *   `hostname`, `resolv.conf`, `shm` under a directory named by the sandbox id: the guest makes
 *   its own); the kernel filesystems (proc, sysfs, tmpfs, devpts, mqueue, cgroup) are dropped, as
 *   buildOciSpec adds its own; any other mount type is refused;
 * - devices (not privileged): each `linux.devices` entry with the access its allow rule grants;
 * - `linux.resources` and process.oomScoreAdj -> LinuxContainerResources.
 */
import path from 'node:path';
import { invalid } from '../../common/errors.js';
import type { ContainerConfig__Output } from '../../generated/runtime/v1/ContainerConfig.js';
import type { Device__Output } from '../../generated/runtime/v1/Device.js';
import type { IDMapping__Output } from '../../generated/runtime/v1/IDMapping.js';
import type { KeyValue__Output } from '../../generated/runtime/v1/KeyValue.js';
import type { LinuxContainerResources__Output } from '../../generated/runtime/v1/LinuxContainerResources.js';
import type { LinuxContainerSecurityContext__Output } from '../../generated/runtime/v1/LinuxContainerSecurityContext.js';
import type { Mount__Output } from '../../generated/runtime/v1/Mount.js';
import type { NamespaceOption__Output } from '../../generated/runtime/v1/NamespaceOption.js';
import type { OciLinuxDevice } from '../../oci/spec-types.js';
import { type ContainerSpec, decodeContainerSpec } from '../../runtime/spec/container.js';
import { containerNameProblems, refuseNames } from '../../runtime/spec/names.js';
import {
  annotationField,
  bundleRoleOf,
  CONTAINERD_ANNOTATIONS,
  CRIO_ANNOTATIONS,
  crioBoolean,
  crioLabels,
  crioMetadata,
  KUBELET_LABELS,
  renameProblems,
  requireAnnotation,
} from './annotations.js';
import { hasNamespace, joinMode, namespaceOptions } from './namespaces.js';
import './reasons.js';
import { type OciIdMapping, type OciRuntimeProcess, type OciRuntimeSpec, parseOciRuntimeSpec } from './spec.js';

export interface TaskContainerDecodeOptions {
  /**
   * A file holding the spec's `linux.seccomp` filter as JSON (the caller wrote it): the container
   * gets exactly the filter containerd or CRI-O computed (its RuntimeDefault, or a Localhost
   * profile of the node), as a Localhost profile. Without it: any filter -> RuntimeDefault (the
   * guest's own profile).
   */
  seccompProfilePath?: string;
  /** Whether the task has a stdin (containerd's Create names a stdin FIFO). Default: CRI-O's `Stdin` annotation, else false. */
  stdin?: boolean;
  /**
   * The host node of a device the spec lists. containerd writes only the container path, with
   * the host node's type, major and minor; a caller that can look the numbers up (sysfs'
   * /sys/dev/{char,block}/<major>:<minor>) passes the host path here. Default: the container
   * path (device plugins give both the same path, as VFIO's /dev/vfio/<group> always is).
   */
  hostDevicePath?: (device: OciLinuxDevice) => string | undefined;
}

/** The kernel filesystems containerd's default spec mounts; the guest's spec has its own. */
const KERNEL_FILESYSTEMS = new Set(['proc', 'sysfs', 'tmpfs', 'devpts', 'mqueue', 'cgroup', 'cgroup2']);

/**
 * The pod files a manager keeps per sandbox and binds into each container: container path ->
 * the file's name in the sandbox's directory (containerd: `<root>/sandboxes/<id>/{hosts,hostname,
 * resolv.conf}` and `<state>/sandboxes/<id>/shm`; CRI-O: `.../<id>/userdata/...`).
 */
const SANDBOX_FILES: Readonly<Record<string, string>> = {
  '/etc/hosts': 'hosts',
  '/etc/hostname': 'hostname',
  '/etc/resolv.conf': 'resolv.conf',
  '/dev/shm': 'shm',
};

/** A path's segments, without empty and `.` ones (`/dev/shm/` and `/dev//shm` are `/dev/shm`). */
function segments(p: string): string[] {
  return path.posix
    .normalize(p)
    .split('/')
    .filter((s) => s !== '' && s !== '.');
}

/** Whether a bind mount is one of the sandbox's own files, which the guest replaces with its own. */
export function isSandboxFile(destination: string, source: string, sandboxId: string): boolean {
  const name = SANDBOX_FILES[`/${segments(destination).join('/')}`];
  if (name === undefined) return false;
  const parts = segments(source);
  return parts.at(-1) === name && parts.slice(0, -1).includes(sandboxId);
}

function isBind(type: string, options: readonly string[]): boolean {
  return type === 'bind' || options.includes('bind') || options.includes('rbind');
}

function propagationOf(options: readonly string[]): Mount__Output['propagation'] {
  // The last propagation option wins, as mount(8) applies them in order.
  for (const o of [...options].reverse()) {
    if (o === 'rshared' || o === 'shared') return 'PROPAGATION_BIDIRECTIONAL';
    if (o === 'rslave' || o === 'slave') return 'PROPAGATION_HOST_TO_CONTAINER';
    if (o === 'rprivate' || o === 'private') return 'PROPAGATION_PRIVATE';
  }
  return 'PROPAGATION_PRIVATE';
}

function idMappings(list: readonly OciIdMapping[] | undefined): IDMapping__Output[] {
  return (list ?? []).map((m) => ({ host_id: m.hostID, container_id: m.containerID, length: m.size }));
}

/** The container's CRI mounts: the config.json's bind mounts but the sandbox's own files. */
export function criMountsOf(spec: OciRuntimeSpec, sandboxId: string): Mount__Output[] {
  return (spec.mounts ?? []).flatMap((m, i): Mount__Output[] => {
    const type = m.type ?? '';
    const options = m.options ?? [];
    if (!isBind(type, options)) {
      if (KERNEL_FILESYSTEMS.has(type)) return [];
      throw invalid(
        'SHIM_MOUNT_UNSUPPORTED',
        `mounts[${i}] mounts a ${JSON.stringify(type)} filesystem at ${JSON.stringify(m.destination)}; only bind mounts and the kernel filesystems the guest makes itself are understood`,
        { details: { field: `mounts[${i}].type` } },
      );
    }
    const source = m.source ?? '';
    if (source === '') throw invalid('SHIM_SPEC_INVALID', `mounts[${i}].source must name the host path of a bind mount`);
    if (isSandboxFile(m.destination, source, sandboxId)) return [];
    const lastAccess = lastAccessOption(options);
    const recursiveReadOnly = options.includes('rro');
    return [
      {
        container_path: m.destination,
        host_path: source,
        readonly: lastAccess === 'ro' || recursiveReadOnly,
        // Relabelling is the host's business, done (or not) before the spec was written.
        selinux_relabel: false,
        propagation: propagationOf(options),
        uidMappings: idMappings(m.uidMappings),
        gidMappings: idMappings(m.gidMappings),
        recursive_read_only: recursiveReadOnly,
        image: null,
        image_sub_path: '',
      },
    ];
  });
}

/**
 * Whether the manager made this spec for a privileged container. containerd's WithPrivileged (and
 * CRI-O's privileged spec) grant every capability, mask and protect no path, and leave sysfs and
 * the cgroup filesystem writable; containerd adds its allow-all device rule only without
 * `privileged_without_host_devices`, which `kata-ts install` writes (the host's devices never go
 * into a VM), so the rule alone misses the privileged containers of such a node. Any one of these
 * marks missing (sysfs read-only, a masked path, no CAP_SYS_ADMIN) is a container that is not.
 */
export function isPrivilegedSpec(spec: OciRuntimeSpec, process: OciRuntimeProcess | undefined = spec.process): boolean {
  if (allowsAllDevices(spec)) return true;
  const mounts = spec.mounts ?? [];
  const sysfs = mounts.filter((m) => m.type === 'sysfs');
  const writable = (m: (typeof mounts)[number]): boolean => {
    const access = lastAccessOption(m.options ?? []);
    return access !== 'ro' && access !== 'rro';
  };
  return (
    sysfs.length > 0 &&
    sysfs.every(writable) &&
    mounts.filter((m) => m.type === 'cgroup' || m.type === 'cgroup2').every(writable) &&
    (spec.linux?.maskedPaths ?? []).length === 0 &&
    (spec.linux?.readonlyPaths ?? []).length === 0 &&
    (process?.capabilities?.bounding ?? []).includes('CAP_SYS_ADMIN')
  );
}

/** The last of ro, rw and rro in mount options (mount(8) applies them in order); undefined: none. */
function lastAccessOption(options: readonly string[]): string | undefined {
  return [...options].reverse().find((o) => o === 'ro' || o === 'rw' || o === 'rro');
}

/** containerd's WithAllDevicesAllowed (privileged containers only): one rule allowing every device. */
export function allowsAllDevices(spec: OciRuntimeSpec): boolean {
  return (spec.linux?.resources?.devices ?? []).some(
    (r) =>
      r.allow &&
      (r.type === undefined || r.type === 'a') &&
      (r.major === undefined || r.major === -1) &&
      (r.minor === undefined || r.minor === -1) &&
      (r.access === undefined || r.access === 'rwm'),
  );
}

/** Each device node of the spec with the access the device cgroup grants it. */
export function criDevicesOf(spec: OciRuntimeSpec, hostDevicePath: TaskContainerDecodeOptions['hostDevicePath']): Device__Output[] {
  const rules = spec.linux?.resources?.devices ?? [];
  return (spec.linux?.devices ?? []).map((d, i) => {
    const rule = [...rules].reverse().find((r) => r.type === d.type && r.major === d.major && r.minor === d.minor);
    if (rule === undefined || !rule.allow) {
      throw invalid(
        'SHIM_SPEC_INVALID',
        `linux.devices[${i}] (${d.path}) has no rule allowing it in linux.resources.devices, so the container could not use it`,
        { details: { field: `linux.devices[${i}]` } },
      );
    }
    return { container_path: d.path, host_path: hostDevicePath?.(d) ?? d.path, permissions: rule.access ?? 'rwm' };
  });
}

/** `linux.resources` and the OOM score as the CRI's LinuxContainerResources (int64 as decimal strings, "0" = unset). */
export function criResourcesOf(spec: OciRuntimeSpec): LinuxContainerResources__Output | null {
  const r = spec.linux?.resources;
  const oom = spec.process?.oomScoreAdj;
  if (r === undefined && oom === undefined) return null;
  const int = (n: number | undefined): string => (n === undefined ? '0' : String(n));
  return {
    cpu_period: int(r?.cpu?.period),
    cpu_quota: int(r?.cpu?.quota),
    cpu_shares: int(r?.cpu?.shares),
    memory_limit_in_bytes: int(r?.memory?.limit),
    oom_score_adj: int(oom),
    cpuset_cpus: r?.cpu?.cpus ?? '',
    cpuset_mems: r?.cpu?.mems ?? '',
    hugepage_limits: (r?.hugepageLimits ?? []).map((h) => ({ page_size: h.pageSize, limit: String(h.limit) })),
    unified: { ...(r?.unified ?? {}) },
    memory_swap_limit_in_bytes: int(r?.memory?.swap),
  };
}

/** process.env (`KEY=VALUE`) as CRI key/value pairs, in order. */
export function envsOf(env: readonly string[] | undefined, field = 'process.env'): KeyValue__Output[] {
  return (env ?? []).map((entry, i) => {
    const eq = entry.indexOf('=');
    if (eq <= 0) {
      throw invalid('SHIM_ENV_INVALID', `${field}[${i}] is not KEY=VALUE`, { details: { field: `${field}[${i}]` } });
    }
    return { key: entry.slice(0, eq), value: entry.slice(eq + 1) };
  });
}

const withoutCapPrefix = (name: string): string => (name.toUpperCase().startsWith('CAP_') ? name.slice(4) : name);

function securityContextOf(
  spec: OciRuntimeSpec,
  process: OciRuntimeProcess,
  seccompProfilePath: string | undefined,
  modes: NamespaceModes | undefined,
): LinuxContainerSecurityContext__Output {
  const privileged = isPrivilegedSpec(spec, process);
  const caps = process.capabilities;
  const unconfined = { profile_type: 'Unconfined' as const, localhost_ref: '' };
  return {
    // A privileged container gets every capability and no seccomp filter from buildOciSpec.
    capabilities: privileged
      ? null
      : {
          add_capabilities: (caps?.bounding ?? []).map(withoutCapPrefix),
          drop_capabilities: ['ALL'],
          add_ambient_capabilities: (caps?.ambient ?? []).map(withoutCapPrefix),
        },
    privileged,
    namespace_options: {
      ...namespaceOptions(modes ?? { network: joinMode(spec, 'network'), pid: joinMode(spec, 'pid'), ipc: joinMode(spec, 'ipc') }),
      userns_options: hasNamespace(spec, 'user') ? { mode: 'POD', uids: [], gids: [] } : null,
    },
    selinux_options: null,
    run_as_user: { value: String(process.user.uid) },
    run_as_username: '',
    readonly_rootfs: spec.root?.readonly === true,
    supplemental_groups: (process.user.additionalGids ?? []).map(String),
    apparmor_profile: '',
    seccomp_profile_path: '',
    no_new_privs: process.noNewPrivileges === true,
    run_as_group: { value: String(process.user.gid) },
    masked_paths: [...(spec.linux?.maskedPaths ?? [])],
    readonly_paths: [...(spec.linux?.readonlyPaths ?? [])],
    seccomp:
      privileged || spec.linux?.seccomp === undefined
        ? unconfined
        : seccompProfilePath === undefined
          ? { profile_type: 'RuntimeDefault', localhost_ref: '' }
          : { profile_type: 'Localhost', localhost_ref: seccompProfilePath },
    apparmor: null,
    supplemental_groups_policy: 'Strict',
  };
}

/** The container's CRI name, attempt and image, and where each came from. */
function identityOf(annotations: Readonly<Record<string, string>>, crio: boolean) {
  if (!crio) {
    return {
      name: requireAnnotation(annotations, CONTAINERD_ANNOTATIONS.containerName, 'containerd'),
      attempt: 0,
      image: requireAnnotation(annotations, CONTAINERD_ANNOTATIONS.imageName, 'containerd'),
      nameField: annotationField(CONTAINERD_ANNOTATIONS.containerName),
    };
  }
  const m = crioMetadata(annotations);
  const fromLabel = annotations[KUBELET_LABELS.containerName];
  const name = m.name !== undefined && m.name !== '' ? m.name : fromLabel;
  if (name === undefined || name === '') {
    throw invalid(
      'SHIM_ANNOTATION_MISSING',
      `${annotationField(CRIO_ANNOTATIONS.metadata)} has no name, and ${annotationField(KUBELET_LABELS.containerName)} is missing`,
      { details: { annotation: CRIO_ANNOTATIONS.metadata } },
    );
  }
  const image = annotations[CRIO_ANNOTATIONS.image] || annotations[CRIO_ANNOTATIONS.imageName];
  if (image === undefined || image === '') requireAnnotation(annotations, CRIO_ANNOTATIONS.image, 'CRI-O');
  return {
    name,
    attempt: m.attempt ?? 0,
    image: image as string,
    nameField:
      m.name !== undefined && m.name !== ''
        ? `${annotationField(CRIO_ANNOTATIONS.metadata)}.name`
        : annotationField(KUBELET_LABELS.containerName),
  };
}

/**
 * An app container's config.json (untrusted JSON) of the pod `sandboxId` -> its `ContainerSpec`,
 * or INVALID_ARGUMENT naming the annotation or field at fault.
 */
export function decodeTaskContainerSpec(oci: unknown, sandboxId: string, options: TaskContainerDecodeOptions = {}): ContainerSpec {
  const spec = parseOciRuntimeSpec(oci);
  const annotations = spec.annotations ?? {};
  const role = bundleRoleOf(annotations);
  const typeKey = role.kind === 'containerd' ? CONTAINERD_ANNOTATIONS.containerType : CRIO_ANNOTATIONS.containerType;
  if (role.role !== 'container') {
    throw invalid('SHIM_CONTAINER_TYPE_MISMATCH', `${annotationField(typeKey)} is "sandbox", but the pod's sandbox runs already`, {
      details: { annotation: typeKey },
    });
  }
  if (role.sandboxId !== sandboxId) {
    const idKey = role.kind === 'containerd' ? CONTAINERD_ANNOTATIONS.sandboxId : CRIO_ANNOTATIONS.sandboxId;
    throw invalid(
      'SHIM_SANDBOX_MISMATCH',
      `${annotationField(idKey)} names sandbox ${role.sandboxId}, but this shim runs sandbox ${sandboxId}`,
      {
        details: { annotation: idKey },
      },
    );
  }
  const crio = role.kind === 'cri-o';
  return assembleContainerSpec(spec, sandboxId, identityOf(annotations, crio), crio, options);
}

/** Who a container is to the core: its CRI name and attempt, its image's name, and where the name came from (for refusals). */
export interface ContainerIdentity {
  name: string;
  attempt: number;
  image: string;
  nameField: string;
}

/**
 * The namespace modes a caller decides instead of the spec's (a container that is a pod of its own
 * shares the guest's pod network and IPC whatever its spec lists; see src/shim/solo.ts).
 */
export interface NamespaceModes {
  network: NamespaceOption__Output['network'];
  pid: NamespaceOption__Output['pid'];
  ipc: NamespaceOption__Output['ipc'];
}

/**
 * A checked config.json of a container with a known identity -> its `ContainerSpec` (pure): the
 * ContainerConfig that says what the spec says, through the core's validator. `namespaces`
 * replaces the modes read from `linux.namespaces`.
 */
export function assembleContainerSpec(
  spec: OciRuntimeSpec,
  sandboxId: string,
  id: ContainerIdentity,
  crio: boolean,
  options: TaskContainerDecodeOptions & { namespaces?: NamespaceModes },
): ContainerSpec {
  const annotations = spec.annotations ?? {};
  const process = spec.process;
  if (process === undefined) throw invalid('SHIM_SPEC_INVALID', "process is missing; an app container's config.json must say what to run");
  const argv = process.args ?? [];
  if (argv.length === 0) throw invalid('SHIM_SPEC_INVALID', 'process.args must not be empty', { details: { field: 'process.args' } });
  const security = securityContextOf(spec, process, options.seccompProfilePath, options.namespaces);

  const config: ContainerConfig__Output = {
    metadata: { name: id.name, attempt: id.attempt },
    image: { image: id.image, annotations: {}, user_specified_image: '', runtime_handler: '', image_ref: '' },
    command: [...argv],
    args: [],
    working_dir: process.cwd,
    envs: envsOf(process.env),
    mounts: criMountsOf(spec, sandboxId),
    devices: security.privileged ? [] : criDevicesOf(spec, options.hostDevicePath),
    labels: crio ? crioLabels(annotations) : {},
    annotations: { ...annotations },
    // containerd (and CRI-O) write the CRI log from the task's FIFOs themselves.
    log_path: '',
    stdin: options.stdin ?? (crio ? crioBoolean(annotations, CRIO_ANNOTATIONS.stdin, false) : false),
    stdin_once: crio ? crioBoolean(annotations, CRIO_ANNOTATIONS.stdinOnce, false) : false,
    tty: process.terminal === true,
    linux: { resources: criResourcesOf(spec), security_context: security },
    windows: null,
    CDI_devices: [],
    // StopContainer reaches a shim as Kill with the signal containerd chose.
    stop_signal: 'RUNTIME_DEFAULT',
    kubernetes_resources: null,
  };
  refuseNames(
    renameProblems(containerNameProblems(config), {
      'config.metadata.name': id.nameField,
      'config.metadata.attempt': `${annotationField(CRIO_ANNOTATIONS.metadata)}.attempt`,
      'config.labels': annotationField(CRIO_ANNOTATIONS.labels),
      'config.annotations': 'annotations',
    }),
  );
  return decodeContainerSpec(config);
}

/**
 * The Task API's Update: new limits as an OCI LinuxResources (JSON), checked with the same schema
 * as a config.json's, as the CRI's LinuxContainerResources.
 */
export function decodeLinuxResources(value: unknown): LinuxContainerResources__Output {
  const spec = parseOciRuntimeSpec({ ociVersion: '1.0.2', linux: { resources: value } });
  return criResourcesOf(spec) ?? criResourcesOf({ ...spec, linux: { resources: {} } })!;
}
