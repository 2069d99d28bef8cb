/**
 * What `delete` writes on stdout for containerd: the task API's DeleteResponse. Kept apart from
 * delete.ts (which composes a whole pod's core) so that `delete` itself loads next to nothing.
 */
import { decodeMessage, encodeMessage, nsOfTimestamp, timestampOfNs } from './proto.js';

/** 128 + SIGKILL: how a task whose shim died (or was killed for it) ended. */
export const EXIT_STATUS_KILLED = 137;

/** containerd.task.v2.DeleteResponse. */
export interface DeleteResult {
  pid: number;
  exitStatus: number;
  exitedAt: Date;
}

/** The DeleteResponse bytes containerd reads from `delete`'s stdout. */
export function encodeDeleteResponse(result: DeleteResult): Uint8Array {
  return encodeMessage('containerd.task.v2.DeleteResponse', {
    pid: result.pid,
    exit_status: result.exitStatus,
    exited_at: timestampOfNs(BigInt(result.exitedAt.getTime()) * 1_000_000n),
  });
}

/** The inverse of encodeDeleteResponse (tests, and a reader of our own output). */
export function decodeDeleteResponse(bytes: Uint8Array): DeleteResult {
  const o = decodeMessage('containerd.task.v2.DeleteResponse', bytes);
  const ns = nsOfTimestamp(o.exited_at) ?? 0n;
  return { pid: o.pid, exitStatus: o.exit_status, exitedAt: new Date(Number(ns / 1_000_000n)) };
}
