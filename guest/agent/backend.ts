/**
 * What the agent's server (guest/agent/server.ts) needs from whatever runs containers in the
 * guest. The real implementation drives crun (guest/agent/containers/); unit tests of the RPC
 * plumbing use a fake. The calls mirror proto/agent/agent.proto; the server owns everything
 * about sessions, streams, output offsets and acknowledgements, so a backend only runs
 * processes and hands over their stdio as node streams.
 */
import type { Readable, Writable } from 'node:stream';
import type {
  ContainerStatsEntry,
  ContainerStatus,
  CreateContainerRequest,
  ExecProcessRequest,
  ExitStatus,
  GuestFacts,
  GuestStatsResponse,
  Timestamp,
} from '../../src/generated/agent/agent.js';

/**
 * A process's stdio as the backend hands it over. With a terminal there is one output, `stdout`
 * (the pty's master side), and no `stderr`. `stdin` is present only when it was asked for.
 * The server reads outputs only as fast as the host takes them: leaving a Readable unread is how
 * a slow host throttles the process.
 */
export interface ProcessStdio {
  stdin?: Writable;
  stdout?: Readable;
  stderr?: Readable;
  /** Instead of stdout/stderr: the output as the reaper's spool file (output-spool.ts). */
  spool?: string;
}

export interface CreatedContainer {
  /** The container's init process (crun create leaves it waiting for start). */
  pid: number;
  stdio: ProcessStdio;
}

export interface StartedProcess {
  pid: number;
  stdio: ProcessStdio;
}

/** One container as the backend knows it; the server adds the output offsets. */
export interface BackendContainerState {
  containerId: string;
  status: ContainerStatus;
  pid: number;
  createdAt: Timestamp | null;
  startedAt: Timestamp | null;
  /** Set once the init process has exited. */
  exit: ExitStatus | null;
}

/** Something that happened in the guest, told to every GuestEvents subscriber. */
export type BackendEvent =
  | { kind: 'container-started'; containerId: string; at: Timestamp }
  | { kind: 'container-exited'; containerId: string; exit: ExitStatus }
  | { kind: 'process-exited'; containerId: string; execId: string; exit: ExitStatus }
  | { kind: 'oom'; containerId: string; at: Timestamp }
  | { kind: 'facts-changed'; facts: GuestFacts };

/**
 * Container operations. Errors are KataErrors (src/common/errors.ts): `not_found` for an
 * unknown container or exec id, `exists` for a duplicate, `precondition` for a wrong state;
 * the server carries kind and reason to the host unchanged. An `execId` of '' names the
 * container's init process where the call allows it (signalProcess, resizeTty, waitProcess,
 * stdin through the CreatedContainer's stdio).
 */
export interface ContainerBackend {
  guestFacts(): Promise<GuestFacts>;
  createContainer(request: CreateContainerRequest): Promise<CreatedContainer>;
  startContainer(containerId: string): Promise<{ startedAt: Timestamp }>;
  signalContainer(containerId: string, signal: number, all: boolean): Promise<void>;
  /** New limits (OCI linux.resources as JSON) for a running container's cgroup. */
  updateContainer(containerId: string, ociResourcesJson: string): Promise<void>;
  /** Freeze (pause) or thaw (resume) every process of a running container. */
  freezeContainer(containerId: string, frozen: boolean): Promise<void>;
  /** Settles when the init process has exited (at once if it has); `signal` stops waiting. */
  waitContainer(containerId: string, signal: AbortSignal): Promise<ExitStatus>;
  /** Removes the container from the OCI runtime; `force` kills it first. */
  deleteContainer(containerId: string, force: boolean): Promise<void>;
  /** Every container, or only these ids when the list is not empty (unknown ids are skipped). */
  listContainers(containerIds: string[]): Promise<BackendContainerState[]>;
  containerStats(containerIds: string[]): Promise<ContainerStatsEntry[]>;
  guestStats(): Promise<GuestStatsResponse>;

  execProcess(request: ExecProcessRequest): Promise<StartedProcess>;
  signalProcess(containerId: string, execId: string, signal: number): Promise<void>;
  resizeTty(containerId: string, execId: string, rows: number, columns: number): Promise<void>;
  waitProcess(containerId: string, execId: string, signal: AbortSignal): Promise<ExitStatus>;
  /** Forgets an exited exec'd process; refuses (`precondition`) one that still runs. */
  deleteProcess(containerId: string, execId: string): Promise<void>;

  /**
   * The output spool of a container this agent did not create (found again after an agent
   * restart), so the server can resume its output; undefined when there is none.
   */
  outputSpool?(containerId: string): string | undefined;

  /** Subscribe to guest events; returns the unsubscribe function. */
  onEvent(listener: (event: BackendEvent) => void): () => void;
}
