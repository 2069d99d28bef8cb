/**
 * A task's stdout/stderr URIs (parseOutputUri, pure) and what the shim makes for them
 * (openTaskOutput), on real FIFOs, files and a real shell-script logger in a temporary directory:
 * bytes written into the FIFOs the core is handed arrive in the file or at the logger, end-of-file
 * comes once after end(), a logger that never closes its ready pipe or cannot start fails Create
 * with nothing left behind, and close() ends the logger.
 */

import { execFileSync } from 'node:child_process';
import {
  closeSync,
  constants,
  existsSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { openTaskOutput, parseOutputUri } from '../../../src/shim/task-output.js';
import { thrown } from '../../helpers/kata-error.js';
import { until } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';

describe('parseOutputUri: the forms containerd passes', () => {
  it("reads containerd's FIFO paths, file:// and binary:// with its arguments in order", () => {
    expect(parseOutputUri('')).toEqual({ kind: 'fifo' });
    expect(parseOutputUri('/run/containerd/fifo/1/t-stdout')).toEqual({ kind: 'fifo' });
    expect(parseOutputUri('file:///var/log/a%20b.log')).toEqual({ kind: 'file', path: '/var/log/a b.log' });
    expect(parseOutputUri('binary:///usr/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=/var/lib/nerdctl/1&bare&k=v1&k=v2')).toEqual({
      kind: 'binary',
      path: '/usr/bin/nerdctl',
      args: ['_NERDCTL_INTERNAL_LOGGING', '/var/lib/nerdctl/1', 'bare', '', 'k', 'v1'],
    });
  });

  it('refuses other schemes, hosts, relative or unnormalised paths and a query on a file, naming the field', () => {
    for (const bad of ['fifo:relative', 'http://x/y', 'file://host/log', 'file:///', 'binary://', 'relative/path', 'file:///x?y=1']) {
      const err: KataError = thrown(() => parseOutputUri(bad, 'stdout'));
      expect(err.reason, bad).toBe('SHIM_STDIO_INVALID');
      expect(err.details, bad).toEqual({ field: 'stdout' });
    }
  });
});

describe('openTaskOutput on real FIFOs', () => {
  let dir: string;
  const io = (stdout: string) => ({ stdin: '', stdout, stderr: stdout, terminal: false });
  const options = (name: string) => ({ dir: path.join(dir, 'io', name), containerId: 'c1', namespace: 'ns1', logger: silentLogger() });
  /** The core's side: writes into a FIFO it was handed, opened read-write as src/common/fifo.ts does, then closes. */
  const write = (fifo: string, text: string) => {
    const fd = openSync(fifo, constants.O_RDWR | constants.O_NONBLOCK);
    writeSync(fd, text);
    closeSync(fd);
  };

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kts-output-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("hands containerd's FIFOs to the core as they are, making nothing", async () => {
    const out = await openTaskOutput(io('/run/containerd/fifo/x-stdout'), options('fifo'));
    expect(out.io.stdout).toBe('/run/containerd/fifo/x-stdout');
    expect(existsSync(path.join(dir, 'io'))).toBe(false);
  });

  it('file://: both streams appended to the file (made with its directory), through writers that come and go, ending after end()', async () => {
    const file = path.join(dir, 'logs', 'sub', 'task.log');
    const out = await openTaskOutput(io(`file://${file}`), options('file'));
    expect(readFileSync(file, 'utf8')).toBe('');
    expect([out.io.stdout, out.io.stderr]).toEqual([path.join(dir, 'io', 'file', 'stdout'), path.join(dir, 'io', 'file', 'stderr')]);
    write(out.io.stdout, 'one\n');
    // A writer that closed and came back (a broken session) does not end the relay.
    await new Promise((r) => setTimeout(r, 50));
    write(out.io.stdout, 'two\n');
    write(out.io.stderr, 'err\n');
    out.end();
    await out.drained(5_000);
    const text = readFileSync(file, 'utf8');
    expect(text.split('\n').sort()).toEqual(['', 'err', 'one', 'two']);
    expect(text.indexOf('one')).toBeLessThan(text.indexOf('two'));
    await out.close();
    expect(existsSync(path.join(dir, 'io', 'file'))).toBe(false);
  });

  it('binary://: the logger reads fd 3 and 4, has CONTAINER_ID, CONTAINER_NAMESPACE and the query as arguments; close() ends it', async () => {
    const logger = path.join(dir, 'logger.sh');
    const sink = path.join(dir, 'sink');
    writeFileSync(
      logger,
      [
        '#!/bin/sh',
        'printf "%s %s %s\\n" "$CONTAINER_ID" "$CONTAINER_NAMESPACE" "$*" > "$2.env"',
        '/bin/cat <&3 > "$2.out" 5>&- &',
        '/bin/cat <&4 > "$2.err" 5>&- &',
        'exec 5>&-',
        'wait',
        'exec /bin/sleep 600',
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
    const out = await openTaskOutput(io(`binary://${logger}?out=${sink}`), options('bin'));
    // Ready means the logger ran its script up to closing fd 5.
    expect(readFileSync(`${sink}.env`, 'utf8')).toBe(`c1 ns1 out ${sink}\n`);
    write(out.io.stdout, 'to stdout\n');
    write(out.io.stderr, 'to stderr\n');
    out.end();
    await until('the logger to read both streams to their end', async (note) => {
      const got = [`${sink}.out`, `${sink}.err`].map((f) => (existsSync(f) ? readFileSync(f, 'utf8') : ''));
      note(got);
      return got[0] === 'to stdout\n' && got[1] === 'to stderr\n' ? true : undefined;
    });
    // The logger outlives its streams' end until the task is deleted.
    const pid = out.loggerPid;
    expect(pid !== undefined && isRunning(pid)).toBe(true);
    await out.close();
    expect(isRunning(pid as number)).toBe(false);
    expect(out.loggerPid).toBeUndefined();
    expect(existsSync(path.join(dir, 'io', 'bin'))).toBe(false);
  });

  it('a logger that does not close its ready pipe in time, or cannot be started: SHIM_LOGGER_FAILED, nothing left', async () => {
    const stuck = path.join(dir, 'stuck.sh');
    // It blocks opening a FIFO nobody writes: one process of its own, no child to orphan.
    execFileSync('mkfifo', [`${stuck}.fifo`]);
    writeFileSync(stuck, '#!/bin/sh\nread x < "$0.fifo"\n', { mode: 0o755 });
    const err = await openTaskOutput(io(`binary://${stuck}`), { ...options('stuck'), readyTimeoutMs: 300 }).then(
      () => undefined,
      (e: KataError) => e,
    );
    expect(err?.reason).toBe('SHIM_LOGGER_FAILED');
    expect(liveProcessesMentioning(stuck)).toEqual([]);
    const missing = await openTaskOutput(io(`binary://${path.join(dir, 'nope')}`), options('missing')).then(
      () => undefined,
      (e: KataError) => e,
    );
    expect(missing?.reason).toBe('SHIM_LOGGER_FAILED');
    expect(readdirSync(path.join(dir, 'io'))).toEqual([]);
  });
});
