/**
 * What running a command in a container (exec, attach) needs of whoever asked for it, whatever the
 * face: the CRI's streaming server gives SPDY or WebSocket channels, the shim gives containerd's
 * FIFOs. stdin, stdout, stderr, terminal sizes, a signal for the asker going away, the final status.
 */
import type { Readable, Writable } from 'node:stream';

export interface TerminalSize {
  width: number;
  height: number;
}

/** How a command ended: its exit code, or an error before or instead of one. */
export type CommandResult = { exitCode: number; cmd?: readonly string[] } | { error: string };

export interface CommandChannels {
  stdin: Readable | null;
  stdout: Writable | null;
  stderr: Writable | null;
  /** Terminal sizes as the client sends them (tty only). */
  resizes: AsyncIterable<TerminalSize> | null;
  /** Aborted when the client goes away before `finish`. */
  signal: AbortSignal;
  /** Flush stdout/stderr, write the status, close the connection. */
  finish(result: CommandResult): Promise<void>;
}
