/**
 * The guest with an image (kernel, initramfs, guest.img) built around the stub agent
 * (test/fixtures/guest-agent-stub.ts), for tests and benches that boot it. Built with
 * scripts/build-guest.sh into a directory of the tests' own, never the installed guest
 * (/usr/local/share/kata-ts/guest, which other tests use): KATA_TS_STUB_GUEST_DIR, default
 * <repo>/.cache/guest-stub. The build is idempotent, so this is quick when nothing changed.
 */
import { execFileSync } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

export interface StubGuest {
  dir: string;
  kernelPath: string;
  initrdPath: string;
  /** Absent for the initramfs layout. */
  guestImagePath?: string;
}

export type GuestLayout = 'image' | 'initramfs';

/** Build (or find up to date) the stub-agent guest in `dir` with the given layout. */
export function ensureStubGuest(layout: GuestLayout = 'image', dir = defaultStubGuestDir(layout)): StubGuest {
  const args = [path.join(repo, 'scripts/build-guest.sh'), '--out', dir, '--layout', layout];
  args.push('--agent-entry', path.join(repo, 'test/fixtures/guest-agent-stub.ts'));
  if (process.env.KATA_TS_GUEST_CACHE !== undefined) args.push('--cache', process.env.KATA_TS_GUEST_CACHE);
  execFileSync('bash', args, { stdio: ['ignore', 'ignore', 'inherit'] });
  return {
    dir,
    kernelPath: path.join(dir, 'vmlinuz'),
    initrdPath: path.join(dir, 'initramfs.cpio.gz'),
    ...(layout === 'image' ? { guestImagePath: path.join(dir, 'guest.img') } : {}),
  };
}

function defaultStubGuestDir(layout: GuestLayout): string {
  const base = process.env.KATA_TS_STUB_GUEST_DIR ?? path.join(repo, '.cache/guest-stub');
  return layout === 'image' ? base : `${base}-initramfs`;
}

/**
 * The host end of the stub agent's port: JSON lines in, commands out. Connect before the guest
 * runs (a guest write blocks until a host end is connected, so nothing is lost).
 */
export class StubAgentConnection {
  private readonly messages: Array<Record<string, unknown>> = [];
  private waiters: Array<() => void> = [];
  private pending = '';

  private constructor(private readonly socket: net.Socket) {
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      this.pending += chunk;
      let newline = this.pending.indexOf('\n');
      while (newline >= 0) {
        this.messages.push(JSON.parse(this.pending.slice(0, newline)) as Record<string, unknown>);
        this.pending = this.pending.slice(newline + 1);
        newline = this.pending.indexOf('\n');
      }
      for (const wake of this.waiters.splice(0)) wake();
    });
    socket.on('error', () => {
      // QEMU went away; next() times out or the test has finished
    });
  }

  static connect(socketPath: string): Promise<StubAgentConnection> {
    return new Promise((resolve, reject) => {
      const socket = net.connect(socketPath);
      socket.once('connect', () => resolve(new StubAgentConnection(socket)));
      socket.once('error', reject);
    });
  }

  send(line: string): void {
    this.socket.write(`${line}\n`);
  }

  /** The next message (in order), waiting up to `timeoutMs`. */
  async next(timeoutMs: number): Promise<Record<string, unknown>> {
    const deadline = Date.now() + timeoutMs;
    while (this.messages.length === 0) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no message from the guest agent within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    return this.messages.shift()!;
  }

  close(): void {
    this.socket.destroy();
  }
}
