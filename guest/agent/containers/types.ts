/**
 * The guest agent's container core in its own terms: OCI spec and process, create and exec
 * requests, container state and exit, output chunks and cgroup stats, with times in ms since the
 * epoch and counters as bigint. `Containers` (containers.ts) implements `ContainerBackendCore`;
 * `CrunBackend` (crun-backend.ts) translates between these types and the agent API's
 * (src/generated/agent) to serve guest/agent/backend.ts's `ContainerBackend` to the server.
 */
import type { GuestDevice } from '../../../src/generated/agent/agent.js';

/** The OCI runtime spec as the host generated it (config.json); only `root` is rewritten here. */
export type OciSpec = Record<string, unknown> & {
  process?: OciProcess;
  root?: { path: string; readonly?: boolean };
  linux?: Record<string, unknown> & { cgroupsPath?: string };
};

/** The OCI `process` object (also what `crun exec --process` reads). */
export interface OciProcess {
  args: string[];
  env?: string[];
  cwd: string;
  terminal?: boolean;
  user?: { uid: number; gid: number; additionalGids?: number[] };
  [key: string]: unknown;
}

/** How the process's stdio is wired: plain pipes, or a terminal (output arrives as stdout). */
export interface StdioOptions {
  tty: boolean;
  /** Whether the caller will write to stdin; without it stdin is /dev/null. */
  stdin: boolean;
}

export interface CreateRequest {
  /** Container id, also crun's id: [A-Za-z0-9][A-Za-z0-9_.-]* */
  id: string;
  spec: OciSpec;
  /** The container's root filesystem as mounted in the guest (virtio-fs). */
  rootfsPath: string;
  stdio: StdioOptions;
  /** The writable layer's upper directory in the guest, when there is one (for stats). */
  writableLayerPath?: string;
  /** The host's devices for the container (CreateContainerRequest.devices); none when absent. */
  devices?: readonly GuestDevice[];
}

export type ContainerStatus = 'created' | 'running' | 'stopped';

/** How a process ended; `exitCode` follows the shell's 128+signal convention when killed. */
export interface ExitStatus {
  exitCode: number;
  /** Signal number that killed the process, when it was killed. */
  signal?: number;
  /** The container's cgroup counted an OOM kill (memory.events oom_kill > 0). */
  oomKilled: boolean;
  finishedAtMs: number;
}

export interface ContainerState {
  id: string;
  status: ContainerStatus;
  pid?: number;
  createdAtMs: number;
  startedAtMs?: number;
  exit?: ExitStatus;
}

export type StreamName = 'stdout' | 'stderr';

/** A piece of a process's output; `offset` is the number of bytes of that stream before `data`. */
export interface OutputChunk {
  stream: StreamName;
  offset: number;
  data: Buffer;
}

export interface ContainerStats {
  timestampMs: number;
  /** cpu.stat usage_usec in nanoseconds. */
  cpuUsageNs: bigint;
  cpuUserNs: bigint;
  cpuSystemNs: bigint;
  memoryUsageBytes: bigint;
  /** memory.current - inactive_file, floored at 0 (what the kubelet evicts on). */
  memoryWorkingSetBytes: bigint;
  /** anon memory (cgroup v2 has no rss line; anon is what cadvisor reports as RSS). */
  memoryRssBytes: bigint;
  pageFaults: bigint;
  majorPageFaults: bigint;
  pids: bigint;
  /** memory.max in bytes; undefined when unlimited ("max") or absent. */
  memoryLimitBytes?: bigint;
  /** memory.events oom_kill. */
  oomKills: bigint;
  /** Bytes used by the writable layer, when a path for it was given. */
  writableLayerBytes?: bigint;
  writableLayerInodes?: bigint;
}

export interface ExecRequest {
  containerId: string;
  execId: string;
  process: OciProcess;
  stdio: StdioOptions;
  /** Kill the process (not only crun) when it runs longer; 0 or absent: no limit. */
  timeoutMs?: number;
}

/** The core's per-container operations; `Containers` implements them (and exec, process handles, events). */
export interface ContainerBackendCore {
  create(request: CreateRequest): Promise<ContainerState>;
  start(id: string): Promise<ContainerState>;
  signal(id: string, signal: number, all: boolean): Promise<void>;
  /** New limits for a running container's cgroup (the OCI linux.resources object). */
  update(id: string, resources: Record<string, unknown>): Promise<void>;
  /** Freeze (`frozen` true) or thaw every process of a running container. */
  freeze(id: string, frozen: boolean): Promise<void>;
  wait(id: string): Promise<ExitStatus>;
  delete(id: string): Promise<void>;
  state(id: string): ContainerState;
  list(): ContainerState[];
  stats(id: string): Promise<ContainerStats>;
}
