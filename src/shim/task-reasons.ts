/** Reason codes (`KataError.reason`) of the shim's task API (src/shim/tasks.ts, task-service.ts). */
export type ShimTaskReason =
  /** Create for an id this shim already holds. */
  | 'TASK_EXISTS'
  /** A task or exec id this shim does not hold. */
  | 'TASK_NOT_FOUND'
  | 'EXEC_NOT_FOUND'
  /** Kill of a process that has exited (containerd's "process already finished"). */
  | 'PROCESS_FINISHED'
  /** Start twice. */
  | 'TASK_ALREADY_STARTED'
  | 'EXEC_ALREADY_STARTED'
  /** An rpc that needs a running task or exec. */
  | 'TASK_NOT_RUNNING'
  | 'EXEC_NOT_RUNNING'
  /** Delete of a process that still runs. */
  | 'TASK_RUNNING'
  | 'EXEC_RUNNING'
  /** Delete of the sandbox task while app tasks remain. */
  | 'SANDBOX_HAS_TASKS'
  /** Exec asked of the sandbox task, or without an exec id, or twice. */
  | 'EXEC_IN_SANDBOX'
  | 'EXEC_ID_MISSING'
  | 'EXEC_EXISTS'
  /** Pause, Resume, Checkpoint: not offered for pod VMs. */
  | 'SHIM_UNSUPPORTED'
  /** containerd's port-forward door into the guest (port-forward.ts) could not be made. */
  | 'PORT_FORWARD_DOOR_FAILED';

declare module '../common/errors.js' {
  interface KataReasons {
    shimTask: ShimTaskReason;
  }
}
