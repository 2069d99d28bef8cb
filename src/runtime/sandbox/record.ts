import type { CgroupDriverName, PlacementRecord } from '../../cgroups/index.js';
import { CALLER_ID_MAX_LENGTH, CALLER_ID_PATTERN } from '../../common/ids.js';
import { epochNs } from '../../common/time.js';
import type { ReferenceValues } from '../../measure/reference-values.js';
import type { PodNetworkRecord } from '../../network/index.js';
import type { PcieTopology } from '../../pcie/index.js';
import type { VmShape } from '../../sizing/types.js';
import type { SandboxPlan } from '../plan.js';
import { SANDBOX_SPEC_SCHEMA, type SandboxSpec } from '../spec/sandbox.js';
import { sandboxSpecFromV1 } from '../spec/v1.js';
import type { RecordKind } from '../store.js';
import type { PodSecrets } from './pod-secrets.js';

/** CRI sandbox states, spelled as the proto enum. */
export type SandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';

/**
 * `creating`: RunPodSandbox is still running (the record exists so that a crash mid-way can be
 * rolled back at the next start; such sandboxes are invisible to List/Status). `running`: the VM
 * answered ready. `stopped`: StopPodSandbox finished, or the VM ended on its own.
 */
export type SandboxPhase = 'creating' | 'running' | 'stopped';

export interface VmmRecord {
  pid: number;
  /** From /proc/<pid>/stat, so that a reused pid is never mistaken for our QEMU. */
  startTimeTicks: number;
  workDir: string;
  qmpSocket: string;
  readySocket: string;
  consoleLog: string;
  qemuLog: string;
  /** QEMU's end of the agent's virtio-serial port (absent: a VM without an agent, format 2). */
  agentSocket?: string;
  /** virtiofsd's vhost-user socket (absent: a VM without virtio-fs, format 2). */
  virtiofsSocket?: string;
}

/**
 * How the sandbox's QEMU runs (format 6). `identity` null: as root with every capability (the
 * handler opted out, or a sandbox of format 5 and older, migrated with `confinement: null`).
 */
export interface VmmConfinementRecord {
  /** The `-sandbox` value QEMU was started with; null: no seccomp filter. */
  seccomp: string | null;
  /**
   * The uid and gid QEMU runs as, leased from hypervisor.vmmIdentities (`lease`: the lease file)
   * and released at RemovePodSandbox; null: root.
   */
  identity: { uid: number; gid: number; lease: string } | null;
  /** The chroot (`<workDir>/jail`) and QEMU's own dir (`<workDir>/vmm`); null when not jailed. */
  jailDir: string | null;
  vmmDir: string | null;
  /** The handler's reason for what it turned off; null when nothing. */
  optOutReason: string | null;
}

/**
 * A vtpm pod's swtpm (format 8): started before QEMU, identified by pid + start time, as an
 * identity of its own (leased like QEMU's; null when QEMU runs as root), its state in the work
 * dir, and the EK certificate its TPM presents (signed by the node's CA).
 */
export interface SwtpmRecord {
  pid: number;
  startTimeTicks: number;
  ctrlSocketPath: string;
  stateDir: string;
  logFile: string;
  identity: { uid: number; gid: number; lease: string } | null;
  ekCertPem: string;
}

/** The sandbox's virtiofsd (started before QEMU; identified by pid + start time like QEMU). */
export interface VirtiofsdRecord {
  pid: number;
  startTimeTicks: number;
  socketPath: string;
}

/**
 * The pod inside the guest: a pause process holding the pod's PID, IPC and UTS namespaces
 * (containers join `/proc/<pausePid>/ns/{pid,ipc,uts}`; network is the guest's own namespace)
 * and the pod's /dev/shm, a tmpfs in the guest at `shmPath`.
 */
export interface GuestPodRecord {
  pausePid: number;
  shmPath: string;
}

export interface SandboxExitRecord {
  /** ISO time the exit was noticed. */
  at: string;
  code: number | null;
  signal: string | null;
  /** QEMU's SHUTDOWN reason, `stopped` for StopPodSandbox, `gone-while-down` when found dead at start. */
  reason: string;
  logTail: string;
}

export interface SandboxRecord {
  id: string;
  phase: SandboxPhase;
  state: SandboxState;
  /** Nanoseconds since the epoch, as a decimal string (CRI int64). */
  createdAtNs: string;
  metadata: { name: string; uid: string; namespace: string; attempt: number };
  labels: Record<string, string>;
  annotations: Record<string, string>;
  /** The handler as the kubelet named it ("" for the default), echoed in status. */
  runtimeHandler: string;
  /** The configured handler that "" or the name resolved to. */
  handler: string;
  /** The cgroup driver the VMM is (to be) placed with: the one advertised when the sandbox was created. */
  cgroupDriver: CgroupDriverName;
  /** The pod's validated configuration, as resized since: echoed in status, compared at CreateContainer. */
  spec: SandboxSpec;
  plan: SandboxPlan;
  /** The VM's current shape: the plan's at boot, updated by resizes. */
  shape: VmShape;
  /** The PCIe topology as it is now: the plan's at boot, updated after each confirmed hot-plug. */
  topology: PcieTopology;
  vmm: VmmRecord | null;
  /**
   * How QEMU is confined, set before anything is started for it (the identity's lease is taken
   * right after the first record write); null: a sandbox of format 5 or older (QEMU as root), or
   * one whose creation had not got that far.
   */
  confinement: VmmConfinementRecord | null;
  /** Set as soon as virtiofsd runs (before QEMU); null for a sandbox without virtio-fs. */
  virtiofsd: VirtiofsdRecord | null;
  placement: PlacementRecord | null;
  /** What the guest kernel reported when it came up. */
  guest: { vcpus: number; memoryKiB: number } | null;
  /** The pod in the guest (CreatePod's answer); null until the agent made it, or without an agent. */
  guestPod: GuestPodRecord | null;
  /**
   * The pod's network (namespace, CNI attachment, TAP wiring; or a joined namespace's TAP wiring),
   * recorded step by step from before each step is taken; null for a sandbox without networking
   * (network.mode "none" and no joined namespace, or format 3).
   */
  network: PodNetworkRecord | null;
  exit: SandboxExitRecord | null;
  /** Where the VM came from (docs/pool.md); absent: a cold boot recorded before the pool existed (format 6 and older). */
  origin?: SandboxOrigin;
  /** A vtpm pod's swtpm, once it runs; null or absent: none (another TEE, or format 7 and older). */
  tpm?: SwtpmRecord | null;
  /**
   * The launch measurements predicted for this pod before its VM booted, from its planned argv
   * and the files it names (src/measure; the `kata-ts/reference-values/v1` document, the same as
   * `kata-ts plan --measurements`). Null or absent: a pod without a TEE, or recorded before.
   */
  referenceValues?: ReferenceValues | null;
  /**
   * The broker resources the pod's containers need as files, per container name, decoded from
   * its `io.kata-ts.secrets` annotation at RunPodSandbox (src/runtime/sandbox/pod-secrets.ts).
   * Names and paths only, never a resource's bytes. Absent: none asked (or recorded before).
   */
  podSecrets?: PodSecrets;
  /**
   * Set while the pod is paused (src/runtime/sandbox/pause.ts): its containers frozen in the guest
   * (`frozenContainers`, thawed again by resume) and its VM's vCPUs stopped (QMP `stop`) since
   * `atNs`. Recovery keeps such a pod paused instead of taking its stopped VM for a failed one.
   * Null or absent: not paused (or recorded before pause existed).
   */
  paused?: SandboxPausedRecord | null;
}

/** A paused pod's pause (see SandboxRecord.paused). */
export interface SandboxPausedRecord {
  /** Epoch nanoseconds (decimal string) when the VM's vCPUs were stopped. */
  atNs: string;
  /** The containers pause froze in the guest, which resume thaws. */
  frozenContainers: string[];
}

/**
 * A VM taken from the pool (its id, the shape it was booted with, and the virtio-mem it was grown
 * by, which later resizes add to), or booted cold, with the reason the pool could not serve it.
 */
export type SandboxOrigin =
  | {
      kind: 'pool';
      poolVmId: string;
      pooledShape: BootShapeRecord;
      /** Why no template served it (format 9; null or absent: templates are off for the handler). */
      templateMiss?: OriginMiss | null;
    }
  | { kind: 'cold'; poolMiss: OriginMiss | null; templateMiss?: OriginMiss | null }
  | {
      kind: 'template';
      /** The template's directory name (`<shape>-<key>`, docs/templates.md). */
      templateName: string;
      /** The shape the template VM booted with, which the clone was grown from. */
      templateShape: BootShapeRecord;
      /** From the clone's start to its guest reseeded. */
      cloneReadyMs: number;
    };

/** Why a pod's VM did not come from the pool or a template: a reason code and one sentence. */
export interface OriginMiss {
  reason: string;
  message: string;
}

/** The vCPUs and memory a pooled or template VM booted with (before the claim grew it). */
export interface BootShapeRecord {
  vcpus: number;
  memoryMiB: number;
  maxVcpus: number;
  maxMemoryMiB: number;
}

/**
 * virtio-mem a resize must add to its own: what grew a pooled VM's boot RAM to the planned boot
 * RAM, and the device's whole headroom (a cold VM: 0 and maxMemoryMiB - memoryMiB of its plan).
 */
export function virtioMemBasis(record: Pick<SandboxRecord, 'origin' | 'plan' | 'shape'>): { offsetMiB: number; maxMiB: number } {
  const boot = record.plan.sizing.vm.memoryMiB;
  if (record.origin?.kind === 'pool' || record.origin?.kind === 'template') {
    const p = record.origin.kind === 'pool' ? record.origin.pooledShape : record.origin.templateShape;
    return { offsetMiB: boot - p.memoryMiB, maxMiB: p.maxMemoryMiB - p.memoryMiB };
  }
  return { offsetMiB: 0, maxMiB: record.shape.maxMemoryMiB - boot };
}

const stringMap = { type: 'object', additionalProperties: { type: 'string' } } as const;
const BOOT_SHAPE_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: ['vcpus', 'memoryMiB', 'maxVcpus', 'maxMemoryMiB'],
  properties: {
    vcpus: { type: 'integer' },
    memoryMiB: { type: 'integer' },
    maxVcpus: { type: 'integer' },
    maxMemoryMiB: { type: 'integer' },
  },
} as const;
const ORIGIN_MISS_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: ['reason', 'message'],
  properties: { reason: { type: 'string' }, message: { type: 'string' } },
} as const;
const anyObject = { type: 'object' } as const;
const nullable = (schema: object): object => ({ anyOf: [{ type: 'null' }, schema] });

/** A cgroup placement (PlacementRecord) as records persist it: the sandbox's, and a pooled VM's. */
export const PLACEMENT_RECORD_SCHEMA = {
  type: 'object',
  required: ['driver', 'cgroupParent', 'mode', 'paths', 'limits'],
  properties: {
    driver: { enum: ['systemd', 'cgroupfs'] },
    cgroupParent: { type: 'string' },
    mode: { enum: ['v1', 'v2', 'hybrid'] },
    unit: { type: 'string' },
    slice: { type: 'string' },
    paths: { type: 'object', additionalProperties: { type: 'string' } },
    createdParents: { type: 'array', items: { type: 'string' } },
    pidsMax: { type: 'integer', minimum: 1 },
    limits: {
      type: 'object',
      required: ['cpuQuotaMillicores', 'cpuRequestMillicores', 'memoryLimitBytes'],
      properties: {
        cpuQuotaMillicores: { type: 'integer', minimum: 0 },
        cpuRequestMillicores: { type: 'integer', minimum: 0 },
        memoryLimitBytes: { type: 'integer', minimum: 0 },
      },
    },
  },
} as const;

/**
 * Format 9 (this one) adds the `template` origin (a clone of a VM template, docs/templates.md:
 * code of format 8 would take it for a cold boot and resize it from the wrong virtio-mem basis)
 * and `templateMiss` on the others. Format 8 added `tpm` (a vtpm pod's swtpm: code of format 7 would neither stop it nor
 * release its identity). Format 7 added `origin` (from the pool or cold, and why not from the pool; a pooled
 * VM's resizes add to the virtio-mem its claim plugged, which code of format 6 would not know).
 * Format 6 added `confinement` (QEMU's seccomp option, its uid/gid, jail and VMM dir)
 * and `plan.vmm`. Format 5 added `network.kind` (`cni`, or `joined`: a namespace the caller made, whose
 * CNI and namespace are never ours to undo) and ids of a caller's choosing (containerd's
 * identifier rule); format 4 added `network`; format 3 added `virtiofsd` and `guestPod` (and the
 * optional agent and virtio-fs sockets of `vmm`); format 2 stored the typed `spec`; format 1
 * stored the decoded request as `podConfig`. Older records are migrated on load (see
 * migrateSandboxRecord). A format-5 record is left alone by format-4 code (a newer format), which
 * would otherwise take a joined namespace for its own and delete it.
 */
export const SANDBOX_RECORD_VERSION = 9;

/** What a sandbox of format 5 or older was: QEMU as root, no seccomp filter, no jail. */
export const UNCONFINED_BEFORE_FORMAT_6 = { seccomp: null, unprivileged: false, identityRange: null, optOutReason: null } as const;

/**
 * Format 1 to 6 -> current. 1 -> 2: `podConfig` becomes `spec` through the request decoder.
 * 2 -> 3: a sandbox of format 2 had no virtiofsd and no pod in its guest (null both).
 * 3 -> 4: a sandbox of format 3 had no network (null). 4 -> 5: every format-4 network was made
 * by kata-ts with CNI (`kind: 'cni'`). 5 -> 6: QEMU ran as root without seccomp (`confinement`
 * null, `plan.vmm` UNCONFINED_BEFORE_FORMAT_6). 6 -> 7: no `origin` (a cold boot from before the
 * pool; virtioMemBasis reads it as such). 7 -> 8: no `tpm` (no swtpm before TEE profiles). 8 -> 9:
 * nothing to change (no template origin before format 9). Pure;
 * throws when it cannot.
 */
export function migrateSandboxRecord(fromVersion: number, record: unknown): unknown {
  if (![1, 2, 3, 4, 5, 6, 7, 8].includes(fromVersion)) throw new Error(`no migration from sandbox record format ${fromVersion}`);
  if (typeof record !== 'object' || record === null) throw new Error('the record is not an object');
  let out = record as Record<string, unknown>;
  if (fromVersion === 1) {
    const { podConfig, ...rest } = out as { podConfig?: unknown } & Record<string, unknown>;
    if (typeof podConfig !== 'object' || podConfig === null) throw new Error('podConfig is missing');
    out = { ...rest, spec: sandboxSpecFromV1(podConfig as Record<string, unknown>) };
  }
  const network = out.network ?? null;
  const plan = out.plan;
  return {
    ...out,
    confinement: out.confinement ?? null,
    plan:
      typeof plan === 'object' && plan !== null && !('vmm' in plan)
        ? { ...(plan as object), vmm: { ...UNCONFINED_BEFORE_FORMAT_6 } }
        : plan,
    virtiofsd: out.virtiofsd ?? null,
    guestPod: out.guestPod ?? null,
    network: typeof network === 'object' && network !== null && !('kind' in network) ? { kind: 'cni', ...network } : network,
  };
}

/** What both kinds of network record hold (see PodNetworkRecord). */
const networkCommon = {
  netnsPath: { type: 'string', pattern: '^/' },
  ifName: { type: 'string', minLength: 1, maxLength: 15 },
  tapName: { type: 'string', minLength: 1, maxLength: 15 },
  result: nullable({
    type: 'object',
    required: ['ips', 'routes', 'dns'],
    properties: { ips: { type: 'array' }, routes: { type: 'array' }, dns: anyObject },
  }),
  mac: { type: ['string', 'null'] },
  mtu: { type: ['integer', 'null'] },
  tapWired: { type: 'boolean' },
} as const;
const NETWORK_COMMON_REQUIRED = ['kind', 'netnsName', 'netnsPath', 'ifName', 'tapName', 'result', 'mac', 'mtu', 'tapWired'];

const CNI_NETWORK_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: [...NETWORK_COMMON_REQUIRED, 'cniNetwork', 'attachment', 'cniAttached', 'cniResult'],
  properties: {
    kind: { const: 'cni' },
    netnsName: { type: 'string', pattern: '^kata-ts-[0-9a-f]{16}$' },
    ...networkCommon,
    cniNetwork: {
      type: 'object',
      required: ['cniVersion', 'name', 'plugins', 'file'],
      properties: {
        cniVersion: { type: 'string' },
        name: { type: 'string' },
        plugins: { type: 'array', items: { type: 'object', required: ['type'], properties: { type: { type: 'string' } } } },
        file: { type: 'string' },
      },
    },
    attachment: {
      type: 'object',
      additionalProperties: false,
      required: ['containerId', 'netnsPath', 'ifName', 'args', 'runtimeConfig'],
      properties: {
        containerId: { type: 'string' },
        netnsPath: { type: 'string' },
        ifName: { type: 'string' },
        args: { type: 'string' },
        runtimeConfig: anyObject,
      },
    },
    cniAttached: { type: 'boolean' },
    cniResult: {},
  },
} as const;

const JOINED_NETWORK_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: NETWORK_COMMON_REQUIRED,
  properties: {
    kind: { const: 'joined' },
    netnsName: { type: ['string', 'null'], minLength: 1 },
    ...networkCommon,
  },
} as const;

export const SANDBOX_RECORD_KIND: RecordKind = {
  kind: 'sandbox',
  dir: 'sandboxes',
  version: SANDBOX_RECORD_VERSION,
  migrate: migrateSandboxRecord,
  schema: {
    type: 'object',
    additionalProperties: false,
    required: [
      'id',
      'phase',
      'state',
      'createdAtNs',
      'metadata',
      'labels',
      'annotations',
      'runtimeHandler',
      'handler',
      'cgroupDriver',
      'spec',
      'plan',
      'shape',
      'topology',
      'vmm',
      'confinement',
      'virtiofsd',
      'placement',
      'guest',
      'guestPod',
      'network',
      'exit',
    ],
    properties: {
      // 64 hex (CRI, newObjectId), or a caller's id by containerd's identifier rule (the shim).
      id: { type: 'string', pattern: CALLER_ID_PATTERN, maxLength: CALLER_ID_MAX_LENGTH },
      phase: { enum: ['creating', 'running', 'stopped'] },
      state: { enum: ['SANDBOX_READY', 'SANDBOX_NOTREADY'] },
      createdAtNs: { type: 'string', pattern: '^[0-9]+$' },
      metadata: {
        type: 'object',
        additionalProperties: false,
        required: ['name', 'uid', 'namespace', 'attempt'],
        properties: {
          name: { type: 'string' },
          uid: { type: 'string' },
          namespace: { type: 'string' },
          attempt: { type: 'integer', minimum: 0 },
        },
      },
      labels: stringMap,
      annotations: stringMap,
      runtimeHandler: { type: 'string' },
      handler: { type: 'string', minLength: 1 },
      cgroupDriver: { enum: ['systemd', 'cgroupfs'] },
      spec: SANDBOX_SPEC_SCHEMA,
      plan: {
        type: 'object',
        required: ['handler', 'confidential', 'sizing', 'pcie', 'qemu', 'vmm'],
        properties: {
          vmm: {
            type: 'object',
            additionalProperties: false,
            required: ['seccomp', 'unprivileged', 'identityRange', 'optOutReason'],
            properties: {
              seccomp: { type: ['string', 'null'] },
              unprivileged: { type: 'boolean' },
              identityRange: nullable({
                type: 'object',
                additionalProperties: false,
                required: ['firstId', 'count'],
                properties: { firstId: { type: 'integer', minimum: 1 }, count: { type: 'integer', minimum: 1 } },
              }),
              optOutReason: { type: ['string', 'null'] },
            },
          },
          handler: { type: 'string' },
          confidential: { type: 'boolean' },
          sizing: anyObject,
          pcie: anyObject,
          qemu: {
            type: 'object',
            required: ['binary', 'accel', 'argv'],
            properties: { binary: { type: 'string' }, accel: anyObject, argv: { type: 'array', items: { type: 'string' } } },
          },
        },
      },
      shape: {
        type: 'object',
        required: ['vcpus', 'maxVcpus', 'memoryMiB', 'maxMemoryMiB', 'hugepages', 'kernelParams'],
        properties: {
          vcpus: { type: 'integer', minimum: 1 },
          maxVcpus: { type: 'integer', minimum: 1 },
          memoryMiB: { type: 'integer', minimum: 1 },
          maxMemoryMiB: { type: 'integer', minimum: 1 },
          hugepages: { type: 'array' },
          kernelParams: { type: 'array', items: { type: 'string' } },
        },
      },
      topology: anyObject,
      vmm: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['pid', 'startTimeTicks', 'workDir', 'qmpSocket', 'readySocket', 'consoleLog', 'qemuLog'],
        properties: {
          pid: { type: 'integer', minimum: 1 },
          startTimeTicks: { type: 'integer', minimum: 0 },
          workDir: { type: 'string' },
          qmpSocket: { type: 'string' },
          readySocket: { type: 'string' },
          consoleLog: { type: 'string' },
          qemuLog: { type: 'string' },
          agentSocket: { type: 'string' },
          virtiofsSocket: { type: 'string' },
        },
      }),
      confinement: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['seccomp', 'identity', 'jailDir', 'vmmDir', 'optOutReason'],
        properties: {
          seccomp: { type: ['string', 'null'] },
          identity: nullable({
            type: 'object',
            additionalProperties: false,
            required: ['uid', 'gid', 'lease'],
            properties: {
              uid: { type: 'integer', minimum: 1, maximum: 4_294_967_294 },
              gid: { type: 'integer', minimum: 1, maximum: 4_294_967_294 },
              lease: { type: 'string', pattern: '^/' },
            },
          }),
          jailDir: { type: ['string', 'null'], pattern: '^/' },
          vmmDir: { type: ['string', 'null'], pattern: '^/' },
          optOutReason: { type: ['string', 'null'] },
        },
      }),
      virtiofsd: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['pid', 'startTimeTicks', 'socketPath'],
        properties: {
          pid: { type: 'integer', minimum: 1 },
          startTimeTicks: { type: 'integer', minimum: 0 },
          socketPath: { type: 'string' },
        },
      }),
      placement: nullable(PLACEMENT_RECORD_SCHEMA),
      // Checked against its own schema where it is made (src/measure/reference-values.ts).
      referenceValues: nullable({
        type: 'object',
        required: ['schema', 'tee', 'inputs'],
        properties: { schema: { type: 'string' }, tee: { type: 'string' }, inputs: { type: 'object' } },
      }),
      podSecrets: {
        type: 'object',
        additionalProperties: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['resource', 'path'],
            properties: { resource: { type: 'string', minLength: 1 }, path: { type: 'string', pattern: '^/' } },
          },
        },
      },
      tpm: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['pid', 'startTimeTicks', 'ctrlSocketPath', 'stateDir', 'logFile', 'identity', 'ekCertPem'],
        properties: {
          pid: { type: 'integer', minimum: 1 },
          startTimeTicks: { type: 'integer', minimum: 0 },
          ctrlSocketPath: { type: 'string', pattern: '^/' },
          stateDir: { type: 'string', pattern: '^/' },
          logFile: { type: 'string', pattern: '^/' },
          identity: nullable({
            type: 'object',
            additionalProperties: false,
            required: ['uid', 'gid', 'lease'],
            properties: {
              uid: { type: 'integer', minimum: 1, maximum: 4_294_967_294 },
              gid: { type: 'integer', minimum: 1, maximum: 4_294_967_294 },
              lease: { type: 'string', pattern: '^/' },
            },
          }),
          ekCertPem: { type: 'string' },
        },
      }),
      guest: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['vcpus', 'memoryKiB'],
        properties: { vcpus: { type: 'integer' }, memoryKiB: { type: 'integer' } },
      }),
      guestPod: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['pausePid', 'shmPath'],
        properties: { pausePid: { type: 'integer', minimum: 1 }, shmPath: { type: 'string', minLength: 1 } },
      }),
      network: nullable({ anyOf: [CNI_NETWORK_SCHEMA, JOINED_NETWORK_SCHEMA] }),
      origin: {
        type: 'object',
        required: ['kind'],
        properties: {
          kind: { enum: ['pool', 'cold', 'template'] },
          poolVmId: { type: 'string' },
          pooledShape: BOOT_SHAPE_SCHEMA,
          poolMiss: nullable(ORIGIN_MISS_SCHEMA),
          templateMiss: nullable(ORIGIN_MISS_SCHEMA),
          templateName: { type: 'string', pattern: '^[0-9a-f]{16}-[0-9a-f]{16}$' },
          templateShape: BOOT_SHAPE_SCHEMA,
          cloneReadyMs: { type: 'integer', minimum: 0 },
        },
      },
      paused: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['atNs', 'frozenContainers'],
        properties: {
          atNs: { type: 'string', pattern: '^[0-9]+$' },
          frozenContainers: { type: 'array', items: { type: 'string', pattern: CALLER_ID_PATTERN, maxLength: CALLER_ID_MAX_LENGTH } },
        },
      }),
      exit: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['at', 'code', 'signal', 'reason', 'logTail'],
        properties: {
          at: { type: 'string' },
          code: { type: ['integer', 'null'] },
          signal: { type: ['string', 'null'] },
          reason: { type: 'string' },
          logTail: { type: 'string' },
        },
      }),
    },
  },
};

/** The key that makes two RunPodSandbox requests "the same pod attempt" (ALREADY_EXISTS). */
export function identityKey(m: SandboxRecord['metadata']): string {
  return JSON.stringify([m.namespace, m.name, m.uid, m.attempt]);
}

/** Epoch nanoseconds now, as the decimal string CRI int64 timestamps use. */
export function nowNs(): string {
  return epochNs().toString();
}
