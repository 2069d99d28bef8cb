import { Buffer } from 'node:buffer';
import { open, readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import type { ChannelServer, Link } from '../../src/channel/index.js';
import { notFound, unavailable } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';

/** The name QEMU's virtserialport carries for the agent channel (`name=` on the device). */
export const AGENT_PORT_NAME = 'org.kata-ts.agent';

/** /dev/vportNpM of the virtio-serial port named `name` (roots are parameters for tests). */
export async function findPort(name: string, sysRoot = '/sys', devRoot = '/dev'): Promise<string> {
  const dir = path.join(sysRoot, 'class/virtio-ports');
  for (const entry of await readdir(dir).catch(() => [] as string[])) {
    const portName = await readFile(path.join(dir, entry, 'name'), 'utf8').catch(() => '');
    if (portName.trim() === name) return path.join(devRoot, entry);
  }
  throw notFound('AGENT_PORT_NOT_FOUND', `no virtio-serial port is named ${name}.`);
}

const READ_BYTES = 64 * 1024;
/** How often to look again while the host end is disconnected (reads return EOF at once then). */
const IDLE_POLL_MS = 100;

/**
 * The guest's end of the channel: a virtio-serial character device, read and written with
 * blocking calls in libuv's thread pool (one read and at most one write in flight, so the pool
 * needs two threads for us; size it with UV_THREADPOOL_SIZE). While the host end is
 * disconnected a read returns EOF at once and a write blocks; EOF is how the agent learns the
 * daemon went away: the session ends, and reading goes on (polling) until a new host says HELLO.
 */
export class VirtioPort implements Link {
  private writeChain: Promise<void> = Promise.resolve();
  private stopped = false;

  private constructor(
    private readonly file: Awaited<ReturnType<typeof open>>,
    private readonly logger: Logger,
  ) {}

  static async open(devicePath: string, logger: Logger): Promise<VirtioPort> {
    try {
      return new VirtioPort(await open(devicePath, 'r+'), logger);
    } catch (err) {
      throw unavailable('AGENT_PORT_OPEN_FAILED', `the agent port ${devicePath} could not be opened.`, { cause: err });
    }
  }

  send(bytes: Buffer): Promise<void> {
    const next = this.writeChain.then(async () => {
      let off = 0;
      while (off < bytes.length) {
        const { bytesWritten } = await this.file.write(bytes, off, bytes.length - off, null);
        off += bytesWritten;
      }
    });
    // One failed write must not poison the ones after it (a new session may follow).
    this.writeChain = next.catch(() => {});
    return next;
  }

  /** Read until stop(), feeding the server; EOF ends the current session. */
  async run(server: ChannelServer): Promise<void> {
    let connected = false;
    while (!this.stopped) {
      const buf = Buffer.allocUnsafe(READ_BYTES);
      let n: number;
      try {
        ({ bytesRead: n } = await this.file.read(buf, 0, READ_BYTES, null));
      } catch (err) {
        this.logger.warn({ err }, 'agent port read failed');
        n = 0;
      }
      if (n > 0) {
        if (!connected) this.logger.info('host connected to the agent port');
        connected = true;
        server.feed(buf.subarray(0, n));
        continue;
      }
      if (connected) {
        this.logger.info('host disconnected from the agent port');
        connected = false;
        server.linkLost();
      }
      await new Promise((resolve) => setTimeout(resolve, IDLE_POLL_MS));
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.file.close();
  }
}
