/**
 * JSON Schema (ajv) for a CDI spec file, per cncf-tags/container-device-interface SPEC.md
 * (spec versions 0.3.0 - 1.0.x). Unknown keys are rejected like everywhere in kata-ts, so every
 * key the spec defines up to 1.0 is listed, including the ones kata-ts does not use.
 */

/** `vendor.com/class`: a DNS-subdomain-like vendor and a class name. */
export const CDI_KIND_PATTERN = '^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$';
/** Letters, digits, `_`, `-`, `.`, `:`; alphanumeric at both ends. */
export const CDI_DEVICE_NAME_PATTERN = '^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$';

const stringArray = { type: 'array', items: { type: 'string' } } as const;
const annotations = { type: 'object', additionalProperties: { type: 'string' } } as const;
const uint32 = { type: 'integer', minimum: 0, maximum: 4294967295 } as const;

const deviceNode = {
  type: 'object',
  additionalProperties: false,
  required: ['path'],
  properties: {
    path: { type: 'string', pattern: '^/' },
    hostPath: { type: 'string', pattern: '^/' },
    type: { enum: ['b', 'c', 'u', 'p'] },
    major: { type: 'integer' },
    minor: { type: 'integer' },
    fileMode: { type: 'integer', minimum: 0 },
    permissions: { type: 'string', pattern: '^[rwm]*$' },
    uid: uint32,
    gid: uint32,
  },
} as const;

const containerEdits = {
  type: 'object',
  additionalProperties: false,
  properties: {
    env: stringArray,
    deviceNodes: { type: 'array', items: deviceNode },
    mounts: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['hostPath', 'containerPath'],
        properties: { hostPath: { type: 'string' }, containerPath: { type: 'string' }, type: { type: 'string' }, options: stringArray },
      },
    },
    hooks: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['hookName', 'path'],
        properties: {
          hookName: { type: 'string' },
          path: { type: 'string' },
          args: stringArray,
          env: stringArray,
          timeout: { type: 'integer', minimum: 1 },
        },
      },
    },
    netDevices: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['hostInterfaceName', 'name'],
        properties: { hostInterfaceName: { type: 'string' }, name: { type: 'string' } },
      },
    },
    intelRdt: {
      type: 'object',
      additionalProperties: false,
      properties: {
        closID: { type: 'string' },
        l3CacheSchema: { type: 'string' },
        memBwSchema: { type: 'string' },
        schemata: stringArray,
        enableCMT: { type: 'boolean' },
        enableMBM: { type: 'boolean' },
      },
    },
    additionalGids: { type: 'array', items: uint32 },
  },
} as const;

export const cdiSpecSchema = {
  $id: 'https://kata-ts.dev/schemas/cdi-spec.json',
  type: 'object',
  additionalProperties: false,
  required: ['cdiVersion', 'kind', 'devices'],
  properties: {
    cdiVersion: { type: 'string', pattern: '^(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)$' },
    kind: { type: 'string', pattern: CDI_KIND_PATTERN, maxLength: 317 },
    annotations,
    devices: {
      type: 'array',
      minItems: 1,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['name'],
        properties: {
          name: { type: 'string', pattern: CDI_DEVICE_NAME_PATTERN },
          annotations,
          containerEdits,
        },
      },
    },
    containerEdits,
  },
} as const;

export interface CdiDeviceNode {
  path: string;
  hostPath?: string;
  type?: string;
  major?: number;
  minor?: number;
  permissions?: string;
}

export interface CdiContainerEdits {
  env?: string[];
  deviceNodes?: CdiDeviceNode[];
  [other: string]: unknown;
}

export interface CdiSpecDocument {
  cdiVersion: string;
  kind: string;
  annotations?: Record<string, string>;
  devices: Array<{ name: string; annotations?: Record<string, string>; containerEdits?: CdiContainerEdits }>;
  containerEdits?: CdiContainerEdits;
}
