import type { AdmissionDemand } from '../admission/index.js';
import { CONTAINER_SPEC_SCHEMA, type ContainerSpec } from '../spec/container.js';
import { containerSpecFromV1 } from '../spec/v1.js';
import type { RecordKind } from '../store.js';

export type ContainerState = 'CONTAINER_CREATED' | 'CONTAINER_EXITED';

/** A PCIe device hot-plugged into the sandbox's VM for this container. */
export interface AttachedDevice {
  qemuId: string;
  portId: string;
  driver: string;
  bdf: string | null;
}

export interface ContainerRecord {
  id: string;
  sandboxId: string;
  state: ContainerState;
  createdAtNs: string;
  /** '0' until the container exits. */
  finishedAtNs: string;
  exitCode: number;
  reason: string;
  message: string;
  metadata: { name: string; attempt: number };
  image: {
    /** As the kubelet asked (ImageSpec.image). */
    requested: string;
    /** The image's config digest (Image.id). */
    id: string;
    /** A repo digest when the image has one, else the id (ContainerStatus.image_ref). */
    ref: string;
  };
  labels: Record<string, string>;
  annotations: Record<string, string>;
  /** Absolute: the sandbox's log_directory joined with the container's log_path ('' when neither). */
  logPath: string;
  /** The container's own copy of the image's root filesystem. */
  rootfs: string;
  /** The container's validated configuration, as resized since (echoed in status; mounts, resources, devices). */
  spec: ContainerSpec;
  /** What the container counts against the VM's budget (sandboxes sized without pod_resources). */
  demand: AdmissionDemand;
  devices: AttachedDevice[];
}

const stringMap = { type: 'object', additionalProperties: { type: 'string' } } as const;

/**
 * Format 2 (this one) stores the typed `spec`; format 1 stored the decoded ContainerConfig as
 * `config`. Records of format 1 are migrated on load (see migrateContainerRecord).
 */
export const CONTAINER_RECORD_VERSION = 2;

/** Format 1 -> current: `config` becomes `spec`. Pure; throws when it cannot. */
export function migrateContainerRecord(fromVersion: number, record: unknown): unknown {
  if (fromVersion !== 1) throw new Error(`no migration from container record format ${fromVersion}`);
  if (typeof record !== 'object' || record === null) throw new Error('the record is not an object');
  const { config, ...rest } = record as { config?: unknown } & Record<string, unknown>;
  if (typeof config !== 'object' || config === null) throw new Error('config is missing');
  return { ...rest, spec: containerSpecFromV1(config as Record<string, unknown>) };
}

export const CONTAINER_RECORD_KIND: RecordKind = {
  kind: 'container',
  dir: 'containers',
  version: CONTAINER_RECORD_VERSION,
  migrate: migrateContainerRecord,
  schema: {
    type: 'object',
    additionalProperties: false,
    required: [
      'id',
      'sandboxId',
      'state',
      'createdAtNs',
      'finishedAtNs',
      'exitCode',
      'reason',
      'message',
      'metadata',
      'image',
      'labels',
      'annotations',
      'logPath',
      'rootfs',
      'spec',
      'demand',
      'devices',
    ],
    properties: {
      id: { type: 'string', pattern: '^[0-9a-f]{64}$' },
      sandboxId: { type: 'string', pattern: '^[0-9a-f]{64}$' },
      state: { enum: ['CONTAINER_CREATED', 'CONTAINER_EXITED'] },
      createdAtNs: { type: 'string', pattern: '^[0-9]+$' },
      finishedAtNs: { type: 'string', pattern: '^[0-9]+$' },
      exitCode: { type: 'integer' },
      reason: { type: 'string' },
      message: { type: 'string' },
      metadata: {
        type: 'object',
        additionalProperties: false,
        required: ['name', 'attempt'],
        properties: { name: { type: 'string', minLength: 1 }, attempt: { type: 'integer', minimum: 0 } },
      },
      image: {
        type: 'object',
        additionalProperties: false,
        required: ['requested', 'id', 'ref'],
        properties: { requested: { type: 'string' }, id: { type: 'string' }, ref: { type: 'string' } },
      },
      labels: stringMap,
      annotations: stringMap,
      logPath: { type: 'string' },
      rootfs: { type: 'string' },
      spec: CONTAINER_SPEC_SCHEMA,
      demand: {
        type: 'object',
        additionalProperties: false,
        required: ['cpuMillicores', 'memoryBytes', 'hugepages'],
        properties: {
          cpuMillicores: { type: 'integer', minimum: 0 },
          memoryBytes: { type: 'integer', minimum: 0 },
          hugepages: { type: 'object', additionalProperties: { type: 'integer', minimum: 0 } },
        },
      },
      devices: {
        type: 'array',
        items: {
          type: 'object',
          additionalProperties: false,
          required: ['qemuId', 'portId', 'driver', 'bdf'],
          properties: {
            qemuId: { type: 'string' },
            portId: { type: 'string' },
            driver: { type: 'string' },
            bdf: { type: ['string', 'null'] },
          },
        },
      },
    },
  },
};
