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

/** How often waitForFifoReader looks. */
const READER_POLL_MS = 50;

/**
 * Resolves true once `fifo` has a reader (a write-only non-blocking open succeeds only then; it
 * fails with ENXIO while nobody reads), false after `timeoutMs` or on `signal`. A writer that
 * opened read-write and is about to close calls this first: bytes still in the pipe when its last
 * descriptor closes with no reader yet would be lost, and a reader that is about to open (containerd
 * opens its read side asynchronously) gets them once it has.
 */
export async function waitForFifoReader(fifo: string, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
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
