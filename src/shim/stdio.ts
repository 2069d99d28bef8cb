/**
 * containerd's FIFOs for an exec'd process: containerd makes them and opens its ends before it
 * calls Exec/Start; the shim writes stdout and stderr and reads stdin (src/common/fifo.ts opens
 * them without waiting for the other side). stdin ends at its writer's end, at CloseIO, or when
 * the exec goes.
 */
import type net from 'node:net';
import type { Readable, Writable } from 'node:stream';
import { destroySocket, FIFO_READER_WAIT_MS, handOverFifo, openFifoSocket } from '../common/fifo.js';

import { newExecId } from '../runtime/container/commands.js';

/** Where a task's or an exec's stdio goes: the FIFOs containerd made ('' for none). */
export interface TaskIo {
  stdin: string;
  stdout: string;
  stderr: string;
  terminal: boolean;
}

export interface ExecStdio {
  /** The agent's id of the process (containerd's exec ids can be too long for the guest's socket paths). */
  guestExecId: string;
  channels: { stdin: Readable | null; stdout: Writable | null; stderr: Writable | null; resizes: null };
  /** CloseIO: the process's stdin ends. */
  closeStdin(): void;
  /** The exec is over: every FIFO closed (containerd's readers see their end). */
  close(): Promise<void>;
}

export async function openExecStdio(io: TaskIo, signal: AbortSignal): Promise<ExecStdio> {
  const opened: net.Socket[] = [];
  try {
    const stdin = io.stdin === '' ? null : await openFifoSocket(io.stdin, 'read');
    if (stdin !== null) opened.push(stdin);
    const stdout = io.stdout === '' ? null : await openFifoSocket(io.stdout, 'write');
    if (stdout !== null) opened.push(stdout);
    const stderr = io.terminal || io.stderr === '' ? null : await openFifoSocket(io.stderr, 'write');
    if (stderr !== null) opened.push(stderr);
    for (const s of opened) s.on('error', () => undefined);
    const closeStdin = () => {
      // Ending the readable side: the exec's stdin pump sees its end and closes the process's stdin.
      stdin?.push(null);
      stdin?.destroy();
    };
    signal.addEventListener('abort', closeStdin, { once: true });
    return {
      guestExecId: newExecId(),
      channels: { stdin, stdout, stderr, resizes: null },
      closeStdin,
      close: async () => {
        closeStdin();
        // The last bytes go in, then each FIFO is handed to its reader (bytes in a pipe whose
        // reader has not opened yet would go with our descriptor).
        const handOver = async (s: net.Socket | null, fifo: string) => {
          if (s === null || s.destroyed) return;
          await new Promise<void>((resolve) => s.end(() => resolve()));
          await handOverFifo(fifo, () => destroySocket(s), FIFO_READER_WAIT_MS, signal);
        };
        await Promise.all([handOver(stdout, io.stdout), handOver(stderr, io.stderr)]);
      },
    };
  } catch (err) {
    for (const s of opened) s.destroy();
    throw err;
  }
}
