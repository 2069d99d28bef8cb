import { Buffer } from 'node:buffer';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { type Frame, FrameReader } from '../../../src/ttrpc/frames.js';

/** A private directory for sockets, removed by the returned cleanup. */
export function socketDir(): { dir: string; socket: (name: string) => string; remove: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-ttrpc-'));
  return { dir, socket: (name) => path.join(dir, name), remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * A raw byte-level peer on a unix socket: writes whatever bytes a test builds and collects the
 * frames that come back, for tests that speak the protocol frame by frame.
 */
export class RawPeer {
  private readonly reader = new FrameReader();
  private readonly frames: Frame[] = [];
  private waiters: (() => void)[] = [];
  ended = false;

  private constructor(readonly socket: net.Socket) {
    socket.on('data', (chunk: Buffer) => {
      for (const event of this.reader.push(chunk)) {
        if (event.kind === 'frame') this.frames.push(event.frame);
      }
      this.wake();
    });
    socket.on('close', () => {
      this.ended = true;
      this.wake();
    });
    socket.on('error', () => {});
  }

  static async connect(socketPath: string): Promise<RawPeer> {
    const socket = net.connect(socketPath);
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    return new RawPeer(socket);
  }

  send(bytes: Buffer): void {
    this.socket.write(bytes);
  }

  /** The next `count` frames received (waits for them; fails if the connection closes first). */
  async next(count = 1): Promise<Frame[]> {
    while (this.frames.length < count) {
      if (this.ended) throw new Error(`connection closed after ${this.frames.length} of ${count} frames`);
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
    return this.frames.splice(0, count);
  }

  /** Resolves once the server has closed the connection. */
  async closedByPeer(): Promise<void> {
    while (!this.ended) await new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  close(): void {
    this.socket.destroy();
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }
}

/** A promise and the functions that settle it. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

export const utf8 = (text: string): Buffer => Buffer.from(text, 'utf8');
