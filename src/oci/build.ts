/**
 * `buildOciSpec`: a container's CRI config + its image config + its pod -> the OCI runtime spec
 * (config.json) the OCI runtime in the guest executes, and the files the guest must place for it.
 * Pure: it reads nothing, asks nothing, and equal inputs give equal (deep-equal, key-ordered)
 * output, which is what the goldens in fixtures/oci hold. Errors are KataError `invalid` with a
 * stable reason and the offending field at the start of the message.
 */
import { resolveCapabilities } from './capabilities.js';
import { etcFiles, etcMounts, type OciContainerFile, resolveHostname } from './etc-files.js';
import type { OciSpecInput } from './input.js';
import { criMounts, shmMount, standardMounts } from './mounts.js';
import { resolveNamespaces, resolveSysctls } from './namespaces.js';
import { fieldError, mergeEnv, resolveArgs, resolveCwd, resolveStopSignal } from './process.js';
import { resolveDevices, resolveOomScoreAdj, resolveResources } from './resources.js';
import { checkMacRequests, resolveSeccomp } from './security.js';
import { OCI_VERSION, type OciLinux, type OciProcess, type OciSpec } from './spec-types.js';
import { resolveUser } from './user.js';

/** /proc and /sys entries hidden from unprivileged containers (containerd's default list). */
export const DEFAULT_MASKED_PATHS: readonly string[] = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
];

/** /proc entries made read-only for unprivileged containers (containerd's default list). */
export const DEFAULT_READONLY_PATHS: readonly string[] = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

export interface OciSpecPlan {
  /** config.json. */
  spec: OciSpec;
  /** Files to write into the guest before the container starts (the pod's etc files). */
  files: OciContainerFile[];
  /** The signal StopContainer sends first: the request's, else the image's, else SIGTERM. */
  stopSignal: string;
}

function pathList(given: readonly string[] | null | undefined, defaults: readonly string[], field: string): string[] {
  const list = given ?? defaults;
  list.forEach((p, i) => {
    if (!p.startsWith('/')) throw fieldError('OCI_PATH_INVALID', `${field}[${i}]`, `is "${p}", not an absolute path`);
  });
  return [...list];
}

/** Build the OCI runtime spec of one container, or throw a KataError naming the field. */
export function buildOciSpec(input: OciSpecInput): OciSpecPlan {
  const { container, sandbox, guest } = input;
  const image = input.image ?? null;
  const security = container.linux?.security_context ?? null;
  const privileged = security?.privileged === true;
  if (privileged && sandbox.linux?.security_context?.privileged !== true) {
    throw fieldError(
      'OCI_PRIVILEGED_POD_REQUIRED',
      'container.linux.security_context.privileged',
      'is set in a pod that is not privileged',
    );
  }
  checkMacRequests(security);

  const args = resolveArgs(container, image);
  const cwd = resolveCwd(container, image);
  const { user, home } = resolveUser(security, image, input.imagePasswd, input.imageGroup);
  const hostname = resolveHostname(sandbox);
  const env = mergeEnv(container, image, { ...(hostname === undefined ? {} : { hostname }), home });
  const capabilities = resolveCapabilities(security);
  const seccomp = resolveSeccomp(security, capabilities.bounding, input.seccompLocalhostProfile);
  const namespaces = resolveNamespaces(container, sandbox, guest);
  const sysctl = resolveSysctls(sandbox);
  const resourcesIn = container.linux?.resources ?? null;
  const oomScoreAdj = resolveOomScoreAdj(resourcesIn);
  const devicePlan = resolveDevices(container, guest, privileged);

  const readonlyRoot = security?.readonly_rootfs === true;
  const cri = criMounts(container, guest, privileged);
  const files = etcFiles(sandbox, guest, hostname, cri.destinations);
  const mounts = [
    ...standardMounts(privileged),
    ...(cri.destinations.has('/dev/shm') ? [] : [shmMount(guest)]),
    ...etcMounts(files, readonlyRoot),
    ...cri.mounts,
  ];

  const process: OciProcess = {
    terminal: container.tty === true,
    user,
    args,
    env,
    cwd,
    capabilities,
    noNewPrivileges: security?.no_new_privs === true,
  };
  if (oomScoreAdj !== undefined) process.oomScoreAdj = oomScoreAdj;

  const linux: OciLinux = {
    namespaces,
    resources: { devices: devicePlan.rules, ...resolveResources(resourcesIn) },
    cgroupsPath: guest.cgroupsPath,
  };
  const spec: OciSpec = {
    ociVersion: OCI_VERSION,
    process,
    root: { path: guest.rootfsPath, readonly: readonlyRoot },
    mounts,
    linux,
  };
  if (hostname !== undefined) spec.hostname = hostname;
  const annotationKeys = Object.keys(container.annotations ?? {}).sort();
  if (annotationKeys.length > 0) spec.annotations = Object.fromEntries(annotationKeys.map((k) => [k, container.annotations![k]!]));
  if (devicePlan.devices.length > 0) linux.devices = devicePlan.devices;
  if (sysctl !== undefined) linux.sysctl = sysctl;
  if (seccomp !== undefined) linux.seccomp = seccomp;
  if (cri.rootfsPropagation !== undefined) linux.rootfsPropagation = cri.rootfsPropagation;
  if (!privileged) {
    const masked = pathList(security?.masked_paths, DEFAULT_MASKED_PATHS, 'container.linux.security_context.masked_paths');
    const readonly = pathList(security?.readonly_paths, DEFAULT_READONLY_PATHS, 'container.linux.security_context.readonly_paths');
    if (masked.length > 0) linux.maskedPaths = masked;
    if (readonly.length > 0) linux.readonlyPaths = readonly;
  }
  return { spec, files, stopSignal: resolveStopSignal(container, image) };
}
