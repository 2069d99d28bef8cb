import { CALLER_ID_MAX_LENGTH, CALLER_ID_PATTERN } from '../../common/ids.js';
import type { GuestDevice } from '../../generated/agent/agent.js';
import type { OverlayRootfsRecord } from '../../images/rootfs.js';
import type { OciSpec } from '../../oci/index.js';
import type { AdmissionDemand } from '../admission/index.js';
import type { PodSecretMount } from '../sandbox/pod-secrets.js';
import { CONTAINER_SPEC_SCHEMA, type ContainerSpec } from '../spec/container.js';
import { containerMetadata, stringMap } from '../spec/schema.js';
import { containerSpecFromV1 } from '../spec/v1.js';
import type { RecordKind } from '../store.js';

export type ContainerState = 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED';

/**
 * What CreateContainer prepared for the guest: the OCI spec the agent runs, the devices the agent
 * maps into it, the guest's view of the root filesystem, and the host bind mounts under the
 * sandbox's shared directory (undone deepest first at RemoveContainer).
 */
export interface ContainerGuestPlan {
  /**
   * config.json as buildOciSpec made it. The store checks only that it is an object: this is the
   * record's own writer's output, read back, not input from outside.
   */
  ociSpec: OciSpec;
  /** The container's devices as CreateContainerRequest.devices carries them (planGuestDevices). */
  guestDevices: GuestDevice[];
  /** The signal StopContainer sends first (a name such as SIGTERM). */
  stopSignal: string;
  /** The root filesystem as the guest sees it. */
  rootfsGuestPath: string;
  /** `<shared>/containers/<id>` on the host. */
  hostDir: string;
  /** Host mount points of the bind mounts made under hostDir, in the order they were made. */
  bindMounts: string[];
  /**
   * The broker resources the agent places in the container as read-only files (the pod's
   * `io.kata-ts.secrets` annotation, under this container's name): names and paths only.
   * Absent: none.
   */
  secrets?: PodSecretMount[];
}

/** A PCIe device hot-plugged into the sandbox's VM for this container. */
export interface AttachedDevice {
  qemuId: string;
  portId: string;
  driver: string;
  bdf: string | null;
}

/** Where a container's stdio goes (recorded: the output resumes to the same place after a restart). */
export type ContainerStdio =
  /** The CRI log file the spec names (the CRI server). */
  | { kind: 'cri-log' }
  /**
   * FIFOs the caller made (containerd's shim API): raw bytes, stdout and stderr apart (one
   * stream with a terminal); '' for a stream the container does not have.
   */
  | { kind: 'fifo'; stdin: string; stdout: string; stderr: string; terminal: boolean };

/**
 * Who owns a container's root filesystem: `runtime`, kata-ts's own copy of the image
 * (`stateDir/rootfs/<id>`, removed with the container); `caller`, a directory the face's caller
 * prepared and keeps (containerd's snapshot at `<bundle>/rootfs`): shared into the guest as it
 * is, never copied, never removed here.
 */
export type RootfsOwner = 'runtime' | 'caller';

export interface ContainerRecord {
  id: string;
  sandboxId: string;
  state: ContainerState;
  createdAtNs: string;
  /** '0' until the container starts. */
  startedAtNs: string;
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
  /**
   * The container's root filesystem on the host: the mount point of its overlay, its own copy of
   * the image, or the caller's (rootfsOwner).
   */
  rootfs: string;
  rootfsOwner: RootfsOwner;
  /**
   * A runtime-owned overlay root filesystem: its directory (upper, work, links, mount point) and
   * the layer directories it stacks, top first, to mount it again after a restart and to keep
   * those layers from garbage collection. null for a copy or a caller's root filesystem.
   */
  rootfsOverlay: OverlayRootfsRecord | null;
  stdio: ContainerStdio;
  /** The container's process in the guest (the agent's pid for it), 0 until it started or when not known. */
  pid: number;
  /** The container's validated configuration, as resized since (echoed in status; mounts, resources, devices). */
  spec: ContainerSpec;
  /** What the container counts against the VM's budget (sandboxes sized without pod_resources). */
  demand: AdmissionDemand;
  devices: AttachedDevice[];
  /** null only for records migrated from format 2 (created before containers ran in the guest). */
  guest: ContainerGuestPlan | null;
}

/**
 * Format 6 (this one) adds `rootfsOverlay`: a container's root filesystem may be an overlay of
 * its image's layers instead of a copy. Format 5 added what a second face passes at create: `rootfsOwner` (a caller's root
 * filesystem is never removed), `stdio` (the CRI log or the caller's FIFOs), the guest `pid`, and
 * ids as containerd spells them (CALLER_ID_PATTERN; kata-ts's own are 64 hex digits, which it
 * allows). Format 4 added `guest.guestDevices`: the devices travel in the agent API's
 * CreateContainerRequest.devices instead of an annotation inside the stored spec. Format 3 added
 * `startedAtNs`, the RUNNING state and `guest` (the OCI spec and the shared-directory mounts).
 * Format 2 stored the typed `spec`; format 1 stored the decoded ContainerConfig as `config`. Older
 * records are migrated on load (see migrateContainerRecord).
 */
export const CONTAINER_RECORD_VERSION = 6;

/** The annotation format 3 put the device requests in (agent API 1). */
const LEGACY_DEVICES_ANNOTATION = 'io.kata-ts.guest-devices';

const LEGACY_DEVICE_KINDS: Record<string, GuestDevice['kind']> = {
  'vfio-group': 'GUEST_DEVICE_KIND_VFIO_GROUP',
  'vfio-container': 'GUEST_DEVICE_KIND_VFIO_CONTAINER',
  'guest-node': 'GUEST_DEVICE_KIND_GUEST_NODE',
};

/** Format 3's guest plan -> format 4's: the annotation's requests become `guestDevices` (pure). */
function migrateGuestPlan(guest: Record<string, unknown>): Record<string, unknown> {
  const spec = guest.ociSpec as { annotations?: Record<string, string> } & Record<string, unknown>;
  const { [LEGACY_DEVICES_ANNOTATION]: text, ...annotations } = spec.annotations ?? {};
  if (text === undefined) return { ...guest, guestDevices: [] };
  const legacy = JSON.parse(text) as Array<{
    containerPath: string;
    access: string;
    source: { kind: string; pciPaths?: string[]; guestPath?: string };
  }>;
  const guestDevices = legacy.map((d): GuestDevice => {
    const kind = LEGACY_DEVICE_KINDS[d.source.kind];
    if (kind === undefined) throw new Error(`unknown device source kind ${d.source.kind}`);
    return {
      containerPath: d.containerPath,
      access: d.access,
      kind,
      pciPaths: d.source.pciPaths ?? [],
      guestPath: d.source.guestPath ?? '',
    };
  });
  // The builder leaves `annotations` out when there are none: so does the migration.
  const { annotations: _old, ...rest } = spec;
  const ociSpec = Object.keys(annotations).length === 0 ? rest : { ...rest, annotations };
  return { ...guest, ociSpec, guestDevices };
}

/**
 * Format 1 to 5 -> current. 1 -> 2: `config` becomes `spec`. 2 -> 3: never started
 * (`startedAtNs` '0') and nothing prepared in the guest (`guest` null): such a container can be
 * stopped and removed, not started. 3 -> 4: the spec's device annotation becomes
 * `guest.guestDevices`. 4 -> 5: every older container has kata-ts's own snapshot
 * (`rootfsOwner` runtime) and its CRI log (`stdio` cri-log); its guest pid was not kept (0).
 * 5 -> 6: every older root filesystem is a copy or the caller's (`rootfsOverlay` null).
 * Pure; throws when it cannot.
 */
export function migrateContainerRecord(fromVersion: number, record: unknown): unknown {
  if (!Number.isInteger(fromVersion) || fromVersion < 1 || fromVersion >= CONTAINER_RECORD_VERSION)
    throw new Error(`no migration from container record format ${fromVersion}`);
  if (typeof record !== 'object' || record === null) throw new Error('the record is not an object');
  let current = record as Record<string, unknown>;
  if (fromVersion === 1) {
    const { config, ...rest } = current as { config?: unknown } & Record<string, unknown>;
    if (typeof config !== 'object' || config === null) throw new Error('config is missing');
    current = { ...rest, spec: containerSpecFromV1(config as Record<string, unknown>) };
  }
  if (fromVersion <= 2) current = { ...current, startedAtNs: '0', guest: null };
  else if (fromVersion === 3) {
    const { guest } = current;
    if (typeof guest === 'object' && guest !== null) current = { ...current, guest: migrateGuestPlan(guest as Record<string, unknown>) };
  }
  if (fromVersion <= 4) current = { ...current, rootfsOwner: 'runtime', stdio: { kind: 'cri-log' }, pid: 0 };
  return { ...current, rootfsOverlay: null };
}

/** A container or sandbox id: containerd's identifiers (kata-ts's own 64 hex digits are some). */
const idSchema = { type: 'string', maxLength: CALLER_ID_MAX_LENGTH, pattern: CALLER_ID_PATTERN } as const;

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
      'startedAtNs',
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
      'rootfsOwner',
      'rootfsOverlay',
      'stdio',
      'pid',
      'spec',
      'demand',
      'devices',
      'guest',
    ],
    properties: {
      id: idSchema,
      sandboxId: idSchema,
      state: { enum: ['CONTAINER_CREATED', 'CONTAINER_RUNNING', 'CONTAINER_EXITED'] },
      createdAtNs: { type: 'string', pattern: '^[0-9]+$' },
      startedAtNs: { type: 'string', pattern: '^[0-9]+$' },
      finishedAtNs: { type: 'string', pattern: '^[0-9]+$' },
      exitCode: { type: 'integer' },
      reason: { type: 'string' },
      message: { type: 'string' },
      metadata: containerMetadata,
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
      rootfsOwner: { enum: ['runtime', 'caller'] },
      rootfsOverlay: {
        anyOf: [
          { type: 'null' },
          {
            type: 'object',
            additionalProperties: false,
            required: ['dir', 'lowerDirs'],
            properties: {
              dir: { type: 'string', minLength: 1 },
              lowerDirs: { type: 'array', minItems: 1, items: { type: 'string', minLength: 1 } },
            },
          },
        ],
      },
      stdio: {
        anyOf: [
          { type: 'object', additionalProperties: false, required: ['kind'], properties: { kind: { const: 'cri-log' } } },
          {
            type: 'object',
            additionalProperties: false,
            required: ['kind', 'stdin', 'stdout', 'stderr', 'terminal'],
            properties: {
              kind: { const: 'fifo' },
              stdin: { type: 'string' },
              stdout: { type: 'string' },
              stderr: { type: 'string' },
              terminal: { type: 'boolean' },
            },
          },
        ],
      },
      pid: { type: 'integer', minimum: 0 },
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
      guest: {
        anyOf: [
          { type: 'null' },
          {
            type: 'object',
            additionalProperties: false,
            required: ['ociSpec', 'guestDevices', 'stopSignal', 'rootfsGuestPath', 'hostDir', 'bindMounts'],
            properties: {
              ociSpec: { type: 'object' },
              guestDevices: {
                type: 'array',
                items: {
                  type: 'object',
                  additionalProperties: false,
                  required: ['containerPath', 'access', 'kind', 'pciPaths', 'guestPath'],
                  properties: {
                    containerPath: { type: 'string', minLength: 1 },
                    access: { type: 'string', pattern: '^[rwm]{1,3}$' },
                    kind: { enum: ['GUEST_DEVICE_KIND_VFIO_GROUP', 'GUEST_DEVICE_KIND_VFIO_CONTAINER', 'GUEST_DEVICE_KIND_GUEST_NODE'] },
                    pciPaths: { type: 'array', items: { type: 'string', minLength: 1 } },
                    guestPath: { type: 'string' },
                  },
                },
              },
              stopSignal: { type: 'string', minLength: 1 },
              rootfsGuestPath: { type: 'string', minLength: 1 },
              hostDir: { type: 'string', minLength: 1 },
              bindMounts: { type: 'array', items: { type: 'string', minLength: 1 } },
              secrets: {
                type: 'array',
                items: {
                  type: 'object',
                  additionalProperties: false,
                  required: ['resource', 'path'],
                  properties: { resource: { type: 'string', minLength: 1 }, path: { type: 'string', pattern: '^/' } },
                },
              },
            },
          },
        ],
      },
    },
  },
};
