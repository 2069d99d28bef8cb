/**
 * A Localhost seccomp profile: the JSON of a file on the node (Docker's format, which is also
 * the OCI `linux.seccomp` object plus `archMap`, `name`, `includes`/`excludes` and comments),
 * validated by one schema and turned into the OCI object. The caller reads the file; this only
 * parses its text, so it stays pure.
 */
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import { fieldError } from './process.js';
import type { OciSeccomp, OciSeccompSyscall, SeccompAction, SeccompOperator } from './spec-types.js';

const ACTIONS: readonly SeccompAction[] = [
  'SCMP_ACT_KILL',
  'SCMP_ACT_KILL_PROCESS',
  'SCMP_ACT_KILL_THREAD',
  'SCMP_ACT_TRAP',
  'SCMP_ACT_ERRNO',
  'SCMP_ACT_TRACE',
  'SCMP_ACT_ALLOW',
  'SCMP_ACT_LOG',
];
const OPERATORS: readonly SeccompOperator[] = [
  'SCMP_CMP_NE',
  'SCMP_CMP_LT',
  'SCMP_CMP_LE',
  'SCMP_CMP_EQ',
  'SCMP_CMP_GE',
  'SCMP_CMP_GT',
  'SCMP_CMP_MASKED_EQ',
];

interface Filter {
  caps?: string[];
  arches?: string[];
  minKernel?: string;
}

interface ProfileSyscall {
  name?: string;
  names?: string[];
  action: SeccompAction;
  errnoRet?: number;
  args?: { index: number; value: number; valueTwo?: number; op: SeccompOperator }[] | null;
  includes?: Filter;
  excludes?: Filter;
  comment?: string;
}

interface ProfileDocument {
  defaultAction: SeccompAction;
  defaultErrnoRet?: number;
  architectures?: string[];
  archMap?: { architecture: string; subArchitectures?: string[] | null }[] | null;
  flags?: string[];
  syscalls?: ProfileSyscall[] | null;
}

const uint = { type: 'integer', minimum: 0 } as const;
const strings = { type: 'array', items: { type: 'string' } } as const;
const filter = {
  type: 'object',
  additionalProperties: false,
  properties: { caps: strings, arches: strings, minKernel: { type: 'string' } },
} as const;

// SCMP_ACT_NOTIFY is left out on purpose: its listener would have to live in the guest.
const profileSchema = {
  $id: 'https://kata-ts.dev/schemas/seccomp-profile.json',
  type: 'object',
  required: ['defaultAction'],
  additionalProperties: false,
  properties: {
    defaultAction: { enum: ACTIONS },
    defaultErrnoRet: uint,
    architectures: strings,
    archMap: {
      type: ['array', 'null'],
      items: {
        type: 'object',
        required: ['architecture'],
        additionalProperties: false,
        properties: { architecture: { type: 'string' }, subArchitectures: { type: ['array', 'null'], items: { type: 'string' } } },
      },
    },
    flags: strings,
    syscalls: {
      type: ['array', 'null'],
      items: {
        type: 'object',
        required: ['action'],
        additionalProperties: false,
        properties: {
          name: { type: 'string', minLength: 1 },
          names: { type: 'array', items: { type: 'string', minLength: 1 } },
          action: { enum: ACTIONS },
          errnoRet: uint,
          args: {
            type: ['array', 'null'],
            items: {
              type: 'object',
              required: ['index', 'value', 'op'],
              additionalProperties: false,
              properties: { index: { type: 'integer', minimum: 0, maximum: 5 }, value: uint, valueTwo: uint, op: { enum: OPERATORS } },
            },
          },
          includes: filter,
          excludes: filter,
          comment: { type: 'string' },
        },
      },
    },
  },
} as const;

const validateProfile = compileOnce<ProfileDocument>(profileSchema);

/** Architecture names a rule's includes/excludes may use for the x86_64 guest. */
const GUEST_ARCHES = new Set(['amd64', 'x86_64', 'x86', '386', 'x32']);

function applies(rule: ProfileSyscall, held: ReadonlySet<string>): boolean {
  const inc = rule.includes ?? {};
  const exc = rule.excludes ?? {};
  if (inc.caps !== undefined && !inc.caps.every((c) => held.has(c))) return false;
  if (exc.caps?.some((c) => held.has(c))) return false;
  if (inc.arches !== undefined && inc.arches.length > 0 && !inc.arches.some((a) => GUEST_ARCHES.has(a))) return false;
  if (exc.arches?.some((a) => GUEST_ARCHES.has(a))) return false;
  // minKernel is not compared: the guest kernel (6.1) is newer than any a profile asks for.
  return true;
}

/**
 * Parse a Localhost profile for a container holding `capabilities`. Rules whose `includes` /
 * `excludes` exclude this container are dropped, as Docker does; `archMap` becomes the
 * architecture list when `architectures` is absent. Anything malformed is refused naming `field`.
 */
export function parseLocalhostProfile(text: string, field: string, capabilities: readonly string[]): OciSeccomp {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw fieldError('OCI_SECCOMP_PROFILE_INVALID', field, 'names a profile that is not JSON');
  }
  const validate = validateProfile();
  if (!validate(doc)) {
    throw fieldError(
      'OCI_SECCOMP_PROFILE_INVALID',
      field,
      `names a profile that is not valid: ${describeSchemaErrors(validate.errors).join('; ')}`,
    );
  }
  const held = new Set(capabilities);
  const syscalls: OciSeccompSyscall[] = [];
  (doc.syscalls ?? []).forEach((rule, i) => {
    const names = rule.names ?? (rule.name === undefined ? [] : [rule.name]);
    if (names.length === 0) throw fieldError('OCI_SECCOMP_PROFILE_INVALID', field, `names a profile whose /syscalls/${i} names no syscall`);
    if (!applies(rule, held)) return;
    const out: OciSeccompSyscall = { names: [...names], action: rule.action };
    if (rule.errnoRet !== undefined) out.errnoRet = rule.errnoRet;
    if (rule.args != null && rule.args.length > 0) out.args = rule.args.map((a) => ({ ...a }));
    syscalls.push(out);
  });
  const architectures = doc.architectures ?? (doc.archMap ?? []).flatMap((m) => [m.architecture, ...(m.subArchitectures ?? [])]);
  const profile: OciSeccomp = { defaultAction: doc.defaultAction };
  if (doc.defaultErrnoRet !== undefined) profile.defaultErrnoRet = doc.defaultErrnoRet;
  if (architectures.length > 0) profile.architectures = architectures;
  if (doc.flags !== undefined && doc.flags.length > 0) profile.flags = [...doc.flags];
  profile.syscalls = syscalls;
  return profile;
}
