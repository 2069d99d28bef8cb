/**
 * The subset of the OCI runtime spec (runtime-spec 1.0.2, config.md and config-linux.md) that
 * kata-ts writes as a container's config.json and reads back from its records. Field names are
 * the spec's own, so the object serialises to config.json unchanged; optional fields are left out
 * rather than set to null. A field is optional (`?`) exactly where the spec says OPTIONAL for
 * Linux, so a reader copes with any valid config.json (also one kata-ts did not write, as the
 * shim face will be handed), not only with what buildOciSpec happens to always set.
 */

/**
 * 1.0.2 is the first runtime-spec with every field written here (`unified`, `errnoRet`, seccomp
 * `flags`). crun 1.8.1 refuses an ociVersion that does not contain "1.0", so not 1.1 or later.
 */
export const OCI_VERSION = '1.0.2';

export interface OciSpec {
  ociVersion: string;
  /** Optional in the spec until `start`: every spec kata-ts runs has one. */
  process?: OciProcess;
  /** Required on Linux. */
  root: { path: string; readonly?: boolean };
  hostname?: string;
  mounts?: OciMount[];
  annotations?: Record<string, string>;
  linux?: OciLinux;
}

export interface OciProcess {
  terminal?: boolean;
  /** The terminal's size when the process starts (with `terminal` only). */
  consoleSize?: { height: number; width: number };
  /** Required on Linux. */
  user: OciUser;
  args: string[];
  env?: string[];
  cwd: string;
  capabilities?: OciCapabilities;
  noNewPrivileges?: boolean;
  oomScoreAdj?: number;
}

export interface OciUser {
  uid: number;
  gid: number;
  additionalGids?: number[];
}

export interface OciCapabilities {
  bounding?: string[];
  effective?: string[];
  permitted?: string[];
  inheritable?: string[];
  ambient?: string[];
}

export interface OciMount {
  destination: string;
  type?: string;
  source?: string;
  options?: string[];
}

export type OciNamespaceType = 'pid' | 'network' | 'mount' | 'ipc' | 'uts' | 'user' | 'cgroup';

export interface OciNamespace {
  type: OciNamespaceType;
  /** Join this namespace (a /proc/<pid>/ns/<type> path in the guest); absent = a new one. */
  path?: string;
}

/** A device node to create in the container (config-linux.md "Devices"; major and minor may be left out only for a FIFO, which kata-ts never makes). */
export interface OciLinuxDevice {
  path: string;
  type: 'c' | 'b' | 'u' | 'p';
  major: number;
  minor: number;
  fileMode?: number;
  uid?: number;
  gid?: number;
}

/** A device cgroup rule (config-linux.md "Device allowlist"). */
export interface OciDeviceRule {
  allow: boolean;
  type?: 'a' | 'c' | 'b';
  major?: number;
  minor?: number;
  access?: string;
}

export interface OciResources {
  devices?: OciDeviceRule[];
  cpu?: { shares?: number; quota?: number; period?: number; cpus?: string; mems?: string };
  memory?: { limit?: number; swap?: number };
  hugepageLimits?: { pageSize: string; limit: number }[];
  unified?: Record<string, string>;
}

export interface OciSeccompArg {
  index: number;
  value: number;
  valueTwo?: number;
  op: SeccompOperator;
}

export type SeccompOperator =
  | 'SCMP_CMP_NE'
  | 'SCMP_CMP_LT'
  | 'SCMP_CMP_LE'
  | 'SCMP_CMP_EQ'
  | 'SCMP_CMP_GE'
  | 'SCMP_CMP_GT'
  | 'SCMP_CMP_MASKED_EQ';

export type SeccompAction =
  | 'SCMP_ACT_KILL'
  | 'SCMP_ACT_KILL_PROCESS'
  | 'SCMP_ACT_KILL_THREAD'
  | 'SCMP_ACT_TRAP'
  | 'SCMP_ACT_ERRNO'
  | 'SCMP_ACT_TRACE'
  | 'SCMP_ACT_ALLOW'
  | 'SCMP_ACT_LOG'
  | 'SCMP_ACT_NOTIFY';

export interface OciSeccompSyscall {
  names: string[];
  action: SeccompAction;
  errnoRet?: number;
  args?: OciSeccompArg[];
}

export interface OciSeccomp {
  defaultAction: SeccompAction;
  defaultErrnoRet?: number;
  architectures?: string[];
  flags?: string[];
  syscalls?: OciSeccompSyscall[];
}

export interface OciLinux {
  namespaces?: OciNamespace[];
  devices?: OciLinuxDevice[];
  resources?: OciResources;
  cgroupsPath?: string;
  sysctl?: Record<string, string>;
  seccomp?: OciSeccomp;
  rootfsPropagation?: 'private' | 'shared' | 'slave' | 'unbindable';
  maskedPaths?: string[];
  readonlyPaths?: string[];
}
