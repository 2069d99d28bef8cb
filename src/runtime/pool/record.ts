/**
 * A pooled VM's record (`<stateDir>/pool/<id>.json`): written before anything is made for it and
 * filled in step by step, so a daemon start finds a ready VM again (pid + start time, its sockets)
 * or discards what a crash left half made. Its `vmm.pid` and `network.netnsName` are where the
 * orphan audit looks for owners, as in a sandbox record (and its id names its cgroup,
 * `kata-ts-<id>` under the pool's).
 */
import type { PlacementRecord } from '../../cgroups/index.js';
import { PLACEMENT_RECORD_SCHEMA } from '../sandbox/record.js';
import type { RecordKind } from '../store.js';
import type { PoolKey } from './plan.js';

export interface PooledVmRecord {
  id: string;
  /** `booting` until the agent answered; `ready` once it can be claimed. */
  phase: 'booting' | 'ready';
  handler: string;
  key: PoolKey;
  shape: { vcpus: number; maxVcpus: number; memoryMiB: number; maxMemoryMiB: number };
  createdAtNs: string;
  /** `<stateDir>/pool-vm/<16 hex>`; renamed to the sandbox's work dir at claim. */
  workDir: string;
  /** The namespace made for it, which becomes its pod's; null without pod networking. */
  network: { netnsName: string; netnsPath: string } | null;
  /** A confined QEMU's identity (its lease names this record) and dirs; null: QEMU as root. */
  confinement: { uid: number; gid: number; jailDir: string; vmmDir: string } | null;
  vmm: {
    pid: number;
    startTimeTicks: number;
    qmpSocket: string;
    readySocket: string;
    consoleLog: string;
    qemuLog: string;
    agentSocket: string;
    /** virtiofsd's socket as QEMU will be told it at claim (inside the jail's view when confined). */
    qemuVirtiofsSocket: string;
  } | null;
  /**
   * QEMU's cgroup under the pool's (pool.cgroupParent, cpu.shares pool.cpuShares) until the claim
   * moves it to its pod's; null before it is placed (a crash before this was written is cleaned
   * by `placementFor(id, parent)`). Its `createdParents` lists the pool's cgroup whoever made it,
   * so that the last pooled VM discarded removes it (left while another VM is in it).
   */
  placement: PlacementRecord | null;
  guest: { vcpus: number; memoryKiB: number } | null;
  /** Wall time the boot took (start to agent ready) and the CPU time QEMU used for it. */
  bootMs: number | null;
  bootCpuMs: number | null;
}

const int = { type: 'integer' } as const;
const str = { type: 'string' } as const;
const nullable = (schema: object) => ({ anyOf: [{ type: 'null' }, schema] });

export const POOLED_VM_RECORD_KIND: RecordKind = {
  kind: 'pooled-vm',
  dir: 'pool',
  // 2: `placement` (the pool's cgroup); a format-1 VM ran in the daemon's cgroup (null).
  version: 2,
  migrate(fromVersion: number, record: unknown): unknown {
    if (fromVersion !== 1) throw new Error(`no migration from pooled VM record format ${fromVersion}`);
    if (typeof record !== 'object' || record === null) throw new Error('the record is not an object');
    return { ...record, placement: null };
  },
  schema: {
    type: 'object',
    additionalProperties: false,
    required: [
      'id',
      'phase',
      'handler',
      'key',
      'shape',
      'createdAtNs',
      'workDir',
      'network',
      'confinement',
      'vmm',
      'placement',
      'guest',
      'bootMs',
      'bootCpuMs',
    ],
    properties: {
      id: { type: 'string', pattern: '^[0-9a-f]{64}$' },
      phase: { enum: ['booting', 'ready'] },
      handler: str,
      key: { type: 'object' },
      shape: {
        type: 'object',
        additionalProperties: false,
        required: ['vcpus', 'maxVcpus', 'memoryMiB', 'maxMemoryMiB'],
        properties: { vcpus: int, maxVcpus: int, memoryMiB: int, maxMemoryMiB: int },
      },
      createdAtNs: { type: 'string', pattern: '^[0-9]+$' },
      workDir: str,
      network: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['netnsName', 'netnsPath'],
        properties: { netnsName: str, netnsPath: str },
      }),
      confinement: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['uid', 'gid', 'jailDir', 'vmmDir'],
        properties: { uid: int, gid: int, jailDir: str, vmmDir: str },
      }),
      vmm: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['pid', 'startTimeTicks', 'qmpSocket', 'readySocket', 'consoleLog', 'qemuLog', 'agentSocket', 'qemuVirtiofsSocket'],
        properties: {
          pid: int,
          startTimeTicks: int,
          qmpSocket: str,
          readySocket: str,
          consoleLog: str,
          qemuLog: str,
          agentSocket: str,
          qemuVirtiofsSocket: str,
        },
      }),
      placement: nullable(PLACEMENT_RECORD_SCHEMA),
      guest: nullable({
        type: 'object',
        additionalProperties: false,
        required: ['vcpus', 'memoryKiB'],
        properties: { vcpus: int, memoryKiB: int },
      }),
      bootMs: nullable(int),
      bootCpuMs: nullable(int),
    },
  },
};
