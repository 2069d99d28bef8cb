/**
 * The shim's log target: containerd's `<bundle>/log` FIFO when someone reads it, else a file in
 * the pod's state dir; and a logger that drops lines rather than blocking on a full FIFO.
 */
import { execFileSync } from 'node:child_process';
import fs, { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DroppingFdSink, openShimLog, shimLogger } from '../../../src/shim/log.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
function tmp(): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-log-'));
  dirs.push(d);
  return d;
}

describe('openShimLog', () => {
  it('falls back to <stateDir>/shim.log without a FIFO, or with one nobody reads', async () => {
    const dir = tmp();
    const stateDir = path.join(dir, 'state');
    const noFifo = await openShimLog(dir, stateDir);
    fs.closeSync(noFifo.fd);
    expect(noFifo).toMatchObject({ kind: 'file', path: path.join(stateDir, 'shim.log') });
    execFileSync('mkfifo', [path.join(dir, 'log')]);
    const unread = await openShimLog(dir, stateDir);
    fs.closeSync(unread.fd);
    expect(unread.kind).toBe('file');
  });

  it('writes JSON lines into a FIFO containerd reads, and never blocks when it is full', async () => {
    const dir = tmp();
    const fifo = path.join(dir, 'log');
    execFileSync('mkfifo', [fifo]);
    const reader = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    try {
      const target = await openShimLog(dir, path.join(dir, 'state'));
      expect(target).toMatchObject({ kind: 'fifo', path: fifo });
      const logger = shimLogger(target.fd, 'info', { namespace: 'k8s.io', sandboxId: 'sb' });
      logger.info('hello');
      const buf = Buffer.alloc(4096);
      const line = buf.subarray(0, fs.readSync(reader, buf)).toString();
      expect(JSON.parse(line)).toMatchObject({ msg: 'hello', component: 'shim', namespace: 'k8s.io', sandboxId: 'sb', level: 'info' });
      // Nobody reads now: 1 MiB of lines go into a 64 KiB pipe without blocking this process.
      const sink = new DroppingFdSink(target.fd);
      for (let i = 0; i < 1024; i++) sink.write(`${'x'.repeat(1023)}\n`);
      expect(sink.dropped).toBeGreaterThan(0);
      fs.closeSync(target.fd);
    } finally {
      fs.closeSync(reader);
    }
  });

  it('a write to a FIFO whose reader left is dropped, not thrown', async () => {
    const dir = tmp();
    const fifo = path.join(dir, 'log');
    execFileSync('mkfifo', [fifo]);
    const reader = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    const target = await openShimLog(dir, path.join(dir, 'state'));
    fs.closeSync(reader);
    const sink = new DroppingFdSink(target.fd);
    expect(sink.write('lost\n')).toBe(true);
    expect(sink.dropped).toBe(1);
    fs.closeSync(target.fd);
  });
});
