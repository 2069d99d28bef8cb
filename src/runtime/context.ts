import type { Logger } from '../common/logger.js';

/**
 * What an operation learns about the request that asked for it, whatever the transport: the CRI
 * server builds one per gRPC call (see cri/server.ts), tests and tools can build their own.
 */
export interface RequestContext {
  /** The operation's name, e.g. `RunPodSandbox`. */
  method: string;
  logger: Logger;
  /** Aborted when the caller cancels or its deadline passes. */
  signal: AbortSignal;
  /** Absolute deadline in epoch milliseconds, or undefined when the caller set none. */
  deadlineMs: number | undefined;
  /** Add fields (such as the sandbox id) to the request's completion log line. */
  annotate(fields: Record<string, unknown>): void;
}
