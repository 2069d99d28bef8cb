/**
 * A FIFO as a libuv pipe (a net.Socket on its descriptor), opened so that the open never waits
 * for the other side: the writing side read-write (O_RDWR never blocks on Linux, and keeps the
 * pipe usable for a reader that comes late), the reading side read-only and non-blocking (Linux
 * reports no hang-up to such a reader until a writer has come and gone, so it waits for the
 * writer's bytes and end rather than seeing an end at once). containerd's shims do the same.
 */
import { close, constants, fstat, open } from 'node:fs';
import net from 'node:net';
import { promisify } from 'node:util';

const openFd = promisify(open);
const fstatFd = promisify(fstat);
const closeFd = promisify(close);

/** Open `fifo` for `mode`; rejects when it cannot be opened or is not a FIFO. The socket owns the descriptor. */
export async function openFifoSocket(fifo: string, mode: 'read' | 'write'): Promise<net.Socket> {
  const flags = (mode === 'read' ? constants.O_RDONLY : constants.O_RDWR) | constants.O_NONBLOCK | constants.O_NOCTTY;
  const fd = await openFd(fifo, flags);
  const st = await fstatFd(fd).catch(() => undefined);
  if (st === undefined || !st.isFIFO()) {
    await closeFd(fd).catch(() => undefined);
    throw new Error(`${fifo} is not a FIFO`);
  }
  return new net.Socket({ fd, readable: mode === 'read', writable: mode === 'write' });
}

/**
 * Close our writing end of `fifo` without losing what is in the pipe, once its reader has opened.
 * Our end (openFifoSocket 'write') is read-write, so it is itself a reader: while it is open a
 * probe for a reader always succeeds and cannot tell whether the real one has come. So: take a
 * write-only descriptor (it opens: ours still reads), `close` ours, then wait for a reader (a
 * write-only non-blocking open succeeds only once one has opened) and close the write-only one,
 * which gives that reader its end of file after the bytes. The bytes stay in the pipe meanwhile:
 * the kernel frees a pipe's buffer only when its last descriptor of either kind closes. True when
 * a reader took over; false after `timeoutMs` or on `signal` (the bytes then go with the pipe).
 */
export async function handOverFifo(fifo: string, close: () => Promise<void>, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
  const hold = await openFd(fifo, constants.O_WRONLY | constants.O_NONBLOCK | constants.O_NOCTTY).catch(() => undefined);
  try {
    const st = hold === undefined ? undefined : await fstatFd(hold).catch(() => undefined);
    await close();
    if (st === undefined || !st.isFIFO()) return false;
    return await waitForFifoReader(fifo, timeoutMs, signal);
  } finally {
    if (hold !== undefined) await closeFd(hold).catch(() => undefined);
  }
}

/** Destroy a socket and resolve once its descriptor is closed. */
export function destroySocket(socket: net.Socket): Promise<void> {
  if (socket.closed) return Promise.resolve();
  return new Promise((resolve) => {
    socket.once('close', () => resolve());
    socket.destroy();
  });
}

/** How long a hand-over waits for a FIFO's reader to open before closing anyway. */
export const FIFO_READER_WAIT_MS = 30_000;

/** How often waitForFifoReader looks. */
const READER_POLL_MS = 50;

/**
 * Resolves true once `fifo` has a reader (a write-only non-blocking open succeeds only then; it
 * fails with ENXIO while nobody reads), false after `timeoutMs` or on `signal`. A read-write
 * descriptor of our own counts as a reader: `handOverFifo` closes it first.
 */
async function waitForFifoReader(fifo: string, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await closeFd(await openFd(fifo, constants.O_WRONLY | constants.O_NONBLOCK | constants.O_NOCTTY));
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENXIO') return false;
    }
    if (Date.now() >= deadline || signal?.aborted === true) return false;
    await new Promise((resolve) => setTimeout(resolve, READER_POLL_MS));
  }
}
