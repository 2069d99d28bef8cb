/**
 * The OCI runtime spec (config.json) containerd and CRI-O write into a bundle, as the shim reads
 * it: the types of src/oci/spec-types.ts (the same runtime-spec fields kata-ts writes for the
 * guest), widened by the few fields only a received spec carries, and one ajv schema that checks
 * an untrusted document against them before anything reads it. Unknown keys are accepted
 * everywhere (hooks, rlimits, `linux.intelRdt`, ... are part of the spec and none of ours to
 * judge); a known key of the wrong shape is INVALID_ARGUMENT `SHIM_SPEC_INVALID` naming it.
 */
import { invalid } from '../../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../../common/schema.js';
import type { OciLinux, OciMount, OciProcess } from '../../oci/spec-types.js';
import './reasons.js';

/** A user namespace id mapping of a mount (runtime-spec 1.1 id-mapped mounts). */
export interface OciIdMapping {
  containerID: number;
  hostID: number;
  size: number;
}

export type OciRuntimeMount = OciMount & { uidMappings?: OciIdMapping[]; gidMappings?: OciIdMapping[] };

/** A process as a received spec has it: what kata-ts writes, plus the host's MAC labels. */
export type OciRuntimeProcess = OciProcess & { apparmorProfile?: string; selinuxLabel?: string };

/** `linux` as received: the seccomp filter is read for its presence only, so it is any object. */
export type OciRuntimeLinux = Omit<OciLinux, 'seccomp' | 'rootfsPropagation'> & {
  seccomp?: Record<string, unknown>;
  /** containerd writes the `r` forms (`rslave`, `rshared`) too. */
  rootfsPropagation?: string;
  mountLabel?: string;
};

/** A bundle's config.json, after `parseOciRuntimeSpec`. */
export interface OciRuntimeSpec {
  ociVersion: string;
  process?: OciRuntimeProcess;
  root?: { path: string; readonly?: boolean };
  hostname?: string;
  mounts?: OciRuntimeMount[];
  annotations?: Record<string, string>;
  linux?: OciRuntimeLinux;
}

/** JSON cannot carry a larger integer exactly (JSON.parse rounds it): such a number is refused. */
const SAFE_INT = { type: 'integer', minimum: -Number.MAX_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER } as const;
const UINT32 = { type: 'integer', minimum: 0, maximum: 0xffff_ffff } as const;
const STRING = { type: 'string' } as const;
const BOOLEAN = { type: 'boolean' } as const;
const STRING_LIST = { type: 'array', items: STRING } as const;
const STRING_MAP = { type: 'object', additionalProperties: STRING } as const;

const ID_MAPPINGS = {
  type: 'array',
  items: {
    type: 'object',
    required: ['containerID', 'hostID', 'size'],
    properties: { containerID: UINT32, hostID: UINT32, size: UINT32 },
  },
} as const;

export const OCI_PROCESS_SCHEMA = {
  type: 'object',
  required: ['user', 'cwd'],
  properties: {
    terminal: BOOLEAN,
    consoleSize: {
      type: 'object',
      required: ['height', 'width'],
      properties: { height: UINT32, width: UINT32 },
    },
    user: {
      type: 'object',
      required: ['uid', 'gid'],
      properties: { uid: UINT32, gid: UINT32, additionalGids: { type: 'array', items: UINT32 } },
    },
    args: STRING_LIST,
    env: STRING_LIST,
    cwd: STRING,
    capabilities: {
      type: 'object',
      properties: { bounding: STRING_LIST, effective: STRING_LIST, permitted: STRING_LIST, inheritable: STRING_LIST, ambient: STRING_LIST },
    },
    noNewPrivileges: BOOLEAN,
    oomScoreAdj: { type: 'integer', minimum: -1000, maximum: 1000 },
    apparmorProfile: STRING,
    selinuxLabel: STRING,
  },
} as const;

const RESOURCES_SCHEMA = {
  type: 'object',
  properties: {
    devices: {
      type: 'array',
      items: {
        type: 'object',
        required: ['allow'],
        properties: { allow: BOOLEAN, type: { enum: ['a', 'c', 'b'] }, major: SAFE_INT, minor: SAFE_INT, access: STRING },
      },
    },
    cpu: {
      type: 'object',
      properties: { shares: SAFE_INT, quota: SAFE_INT, period: SAFE_INT, cpus: STRING, mems: STRING },
    },
    memory: { type: 'object', properties: { limit: SAFE_INT, swap: SAFE_INT } },
    hugepageLimits: {
      type: 'array',
      items: { type: 'object', required: ['pageSize', 'limit'], properties: { pageSize: STRING, limit: SAFE_INT } },
    },
    unified: STRING_MAP,
  },
} as const;

const LINUX_SCHEMA = {
  type: 'object',
  properties: {
    namespaces: {
      type: 'array',
      items: {
        type: 'object',
        required: ['type'],
        properties: { type: { enum: ['pid', 'network', 'mount', 'ipc', 'uts', 'user', 'cgroup'] }, path: STRING },
      },
    },
    devices: {
      type: 'array',
      items: {
        type: 'object',
        required: ['path', 'type', 'major', 'minor'],
        properties: {
          path: STRING,
          type: { enum: ['c', 'b', 'u', 'p'] },
          major: SAFE_INT,
          minor: SAFE_INT,
          fileMode: UINT32,
          uid: UINT32,
          gid: UINT32,
        },
      },
    },
    resources: RESOURCES_SCHEMA,
    cgroupsPath: STRING,
    sysctl: STRING_MAP,
    seccomp: { type: 'object' },
    rootfsPropagation: STRING,
    maskedPaths: STRING_LIST,
    readonlyPaths: STRING_LIST,
    mountLabel: STRING,
  },
} as const;

export const OCI_RUNTIME_SPEC_SCHEMA = {
  type: 'object',
  required: ['ociVersion'],
  properties: {
    ociVersion: STRING,
    process: OCI_PROCESS_SCHEMA,
    root: { type: 'object', required: ['path'], properties: { path: STRING, readonly: BOOLEAN } },
    hostname: STRING,
    mounts: {
      type: 'array',
      items: {
        type: 'object',
        required: ['destination'],
        properties: {
          destination: STRING,
          type: STRING,
          source: STRING,
          options: STRING_LIST,
          uidMappings: ID_MAPPINGS,
          gidMappings: ID_MAPPINGS,
        },
      },
    },
    annotations: STRING_MAP,
    linux: LINUX_SCHEMA,
  },
} as const;

const specValidator = compileOnce<OciRuntimeSpec>(OCI_RUNTIME_SPEC_SCHEMA);
const processValidator = compileOnce<OciRuntimeProcess>(OCI_PROCESS_SCHEMA);

/** `/linux/namespaces/0/type` -> `linux.namespaces[0].type`, prefixed: how the refusals name a field. */
export function pointerToField(pointer: string, prefix = ''): string {
  let out = prefix;
  for (const part of pointer.split('/').slice(1)) {
    const key = part.replaceAll('~1', '/').replaceAll('~0', '~');
    if (/^\d+$/.test(key)) out += `[${key}]`;
    else if (/^[A-Za-z_$][\w$]*$/.test(key)) out += out === '' ? key : `.${key}`;
    else out += `[${JSON.stringify(key)}]`;
  }
  return out;
}

function refuse(lines: string[], what: string, prefix: string): never {
  // Each line starts with the JSON pointer of the offending key, then what is wrong with it.
  const first = lines[0] ?? '/ is invalid';
  const space = first.indexOf(' ');
  const pointer = space < 0 ? first : first.slice(0, space);
  const rest = space < 0 ? 'is invalid' : first.slice(space + 1);
  const field = pointer === '/' || pointer === '' ? what : pointerToField(pointer, prefix);
  const more = lines.length - 1;
  const tail = more === 0 ? '' : ` (and ${more} more problem${more === 1 ? '' : 's'} with the ${what})`;
  throw invalid('SHIM_SPEC_INVALID', `${field} ${rest}${tail}`, { details: { field, problems: lines.length } });
}

/** Check an untrusted config.json against the schema; the same object, typed. */
export function parseOciRuntimeSpec(value: unknown): OciRuntimeSpec {
  const validate = specValidator();
  if (!validate(value)) refuse(describeSchemaErrors(validate.errors), 'config.json', '');
  return value;
}

/** Check an untrusted OCI process (an Exec request's spec) against the schema; the same object, typed. */
export function parseOciProcess(value: unknown): OciRuntimeProcess {
  const validate = processValidator();
  if (!validate(value)) refuse(describeSchemaErrors(validate.errors), 'process spec', 'spec');
  return value;
}
