/**
 * The shim's log target: containerd's `<bundle>/log` FIFO when someone reads it, else a file in
 * the pod's state dir; and a logger that drops lines rather than blocking on a full FIFO.
 */
import { execFileSync } from 'node:child_process';
import fs, { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DroppingFdSink, LogfmtSink, logfmtLine, logfmtValue, openShimLog, shimLogger } from '../../../src/shim/log.js';

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

  it('writes logfmt lines naming the pod into a FIFO containerd reads, and never blocks when it is full', async () => {
    const dir = tmp();
    const fifo = path.join(dir, 'log');
    execFileSync('mkfifo', [fifo]);
    const reader = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    try {
      const target = await openShimLog(dir, path.join(dir, 'state'));
      expect(target).toMatchObject({ kind: 'fifo', path: fifo });
      const logger = shimLogger(target.fd, 'info', { namespace: 'k8s.io', sandboxId: 'sb' });
      logger.info('hello');
      // A task's call: its logger names the container and the exec.
      logger.child({ containerId: 'c1', execId: 'e1', method: 'Start' }).warn({ exitStatus: 3 }, 'exec failed');
      logger.debug('not at info');
      const buf = Buffer.alloc(4096);
      const lines = buf.subarray(0, fs.readSync(reader, buf)).toString().split('\n');
      expect(lines).toHaveLength(3);
      expect(lines[0]).toMatch(
        /^time=\d{4}-\d\d-\d\dT\S+Z level=info msg=hello namespace=k8s\.io sandboxId=sb app=kata-ts component=shim pid=\d+$/,
      );
      expect(lines[1]).toMatch(
        /^time=\S+ level=warn msg="exec failed" namespace=k8s\.io sandboxId=sb containerId=c1 execId=e1 app=kata-ts component=shim pid=\d+ method=Start exitStatus=3$/,
      );
      expect(lines[2]).toBe('');
      // Nobody reads now: 1 MiB of lines go into a 64 KiB pipe without blocking this process.
      const sink = new DroppingFdSink(target.fd);
      for (let i = 0; i < 1024; i++) sink.write(`${'x'.repeat(1023)}\n`);
      expect(sink.dropped).toBeGreaterThan(0);
      fs.closeSync(target.fd);
    } finally {
      fs.closeSync(reader);
    }
  });

  it('logfmt: plain tokens bare, anything else quoted with \\, " and control characters escaped; objects as JSON', () => {
    expect(logfmtValue('k8s.io')).toBe('k8s.io');
    expect(logfmtValue('/run/kata-ts/shim/s/ab')).toBe('/run/kata-ts/shim/s/ab');
    expect(logfmtValue('')).toBe('""');
    expect(logfmtValue('two words')).toBe('"two words"');
    expect(logfmtValue('a=b')).toBe('"a=b"');
    expect(logfmtValue('say "hi"\\\n\tend\u0001')).toBe('"say \\"hi\\"\\\\\\n\\tend\\u0001"');
    expect([logfmtValue(3), logfmtValue(true), logfmtValue(null), logfmtValue(undefined)]).toEqual(['3', 'true', 'null', '""']);
    expect(logfmtValue({ a: [1, 'x y'] })).toBe('"{\\"a\\":[1,\\"x y\\"]}"');
    // Leading keys first (time, level, msg, then the ids), the rest in their order.
    expect(logfmtLine({ z: 1, execId: 'e', msg: 'm', sandboxId: 's', time: 't', level: 'info', containerId: 'c', namespace: 'n' })).toBe(
      'time=t level=info msg=m namespace=n sandboxId=s containerId=c execId=e z=1\n',
    );
    // A line that is not a JSON object passes through as it came.
    const got: string[] = [];
    const sink = new LogfmtSink({ write: (l) => got.push(l) > 0 });
    sink.write('not json\n');
    sink.write('[1]\n');
    sink.write('{"msg":"x y"}\n');
    expect(got).toEqual(['not json\n', '[1]\n', 'msg="x y"\n']);
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
