/**
 * The one place an exec'd process is described for the guest (pure). ExecSync
 * (guest-ops.ts `execSync`) and the streaming Exec and the shim's Exec (`runExec`, commands.ts) both start
 * their process with this request, so a command runs with the same identity, environment, working
 * directory and capabilities as the container's own process, whichever way it was asked for.
 */
import type { ExecProcessRequest } from '../../generated/agent/agent.js';
import type { OciProcess } from '../../oci/index.js';
import type { ContainerRecord } from './record.js';

export interface ExecProcessInput {
  /** Chosen by the caller, unique within the container (the agent's exec_id). */
  execId: string;
  /** argv of the new process; the callers refuse an empty one with their own reason. */
  cmd: readonly string[];
  /** A terminal in the guest (its output then arrives as stdout only). */
  tty: boolean;
  /** Whether the caller will write to the process's stdin. */
  stdin: boolean;
  /**
   * The terminal's size when the process starts (tty only): a process that starts on a terminal
   * of 0 rows sees no size (`stty size` fails), so the first size the client sent goes in here.
   */
  consoleSize?: { height: number; width: number };
}

/**
 * The OCI process of an exec: the container's stored `process` with `args`, `terminal` and (when
 * given) `consoleSize` replaced. A container without a guest plan (a record from before
 * containers ran in the guest) has no process to start from: only those three fields then.
 */
export function execOciProcess(record: Pick<ContainerRecord, 'guest'>, input: ExecProcessInput): Partial<OciProcess> {
  const base: Partial<OciProcess> = record.guest?.ociSpec.process ?? {};
  const process: Partial<OciProcess> = { ...base, terminal: input.tty, args: [...input.cmd] };
  if (input.consoleSize !== undefined) process.consoleSize = { height: input.consoleSize.height, width: input.consoleSize.width };
  return process;
}

/** The agent's ExecProcessRequest for a new process in the container (see execOciProcess). */
export function execProcessRequest(record: Pick<ContainerRecord, 'id' | 'guest'>, input: ExecProcessInput): ExecProcessRequest {
  return {
    containerId: record.id,
    execId: input.execId,
    ociProcessJson: JSON.stringify(execOciProcess(record, input)),
    tty: input.tty,
    stdin: input.stdin,
  };
}
