import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isReason } from '../../../src/common/errors.js';
import { relayArgs } from '../../../src/shim/node-relay.js';
import { parseNodeRequest } from '../../../src/shim/node-server.js';
import { readTaskRecords, removeTaskRecord, writeTaskRecord } from '../../../src/shim/node-task-records.js';
import { nodeServerPaths, upstreamSocketPath } from '../../../src/shim/paths.js';

function refusal(line: string): string {
  try {
    parseNodeRequest(line);
  } catch (err) {
    expect(isReason(err, 'SHIM_NODE_REQUEST_INVALID')).toBe(true);
    return (err as Error).message;
  }
  throw new Error(`${line} was accepted`);
}

describe('the node shim server control requests', () => {
  it('attach and detach are read with every field', () => {
    expect(parseNodeRequest('{"attach":{"namespace":"k8s.io","sandboxId":"abc","bundle":"/b","socketPath":"/s"}}')).toEqual({
      attach: { namespace: 'k8s.io', sandboxId: 'abc', bundle: '/b', socketPath: '/s' },
    });
    expect(parseNodeRequest('{"detach":{"namespace":"k8s.io","sandboxId":"abc"}}')).toEqual({
      detach: { namespace: 'k8s.io', sandboxId: 'abc' },
    });
  });

  it('a request that is not one is refused naming the field', () => {
    expect(refusal('not json')).toBe('the control request is not JSON.');
    expect(refusal('{"attach":{"namespace":"k8s.io","sandboxId":"abc","bundle":"/b"}}')).toBe(
      'attach.socketPath must be a non-empty string.',
    );
    expect(refusal('{"detach":{"namespace":"","sandboxId":"abc"}}')).toBe('detach.namespace must be a non-empty string.');
    expect(refusal('{"stop":{}}')).toBe('unknown control request "stop"; requests: attach, detach.');
    expect(refusal('{"attach":{},"detach":{}}')).toBe('the control request must hold exactly one of attach, detach.');
    expect(refusal('[]')).toBe('the control request is not an object.');
  });
});

describe('node mode paths and the relay command line', () => {
  it('one node server per state root and containerd address; the upstream beside the pod state', () => {
    const a = nodeServerPaths('/run/kata-ts/shim', '/run/containerd/containerd.sock');
    const b = nodeServerPaths('/run/kata-ts/shim', '/run/other/containerd.sock');
    expect(a.dir).not.toBe(b.dir);
    expect(a.control).toBe(path.join(a.dir, 'ctl.sock'));
    expect(path.dirname(a.dir)).toBe('/run/kata-ts/shim/node');
    expect(upstreamSocketPath('/run/kata-ts/shim/k8s.io/abc')).toBe('/run/kata-ts/shim/k8s.io/abc/upstream.sock');
    expect(() => upstreamSocketPath(`/${'x'.repeat(100)}`)).toThrow(/more than the 106/);
  });

  it("the relay's argv: listen, upstream, pid file, then the revive command after --", () => {
    expect(relayArgs('/s/p', '/d/upstream.sock', '/d/relay.pid', ['node', 'shim', 'node-serve'])).toEqual([
      '--listen',
      '/s/p',
      '--upstream',
      '/d/upstream.sock',
      '--pid-file',
      '/d/relay.pid',
      '--',
      'node',
      'shim',
      'node-serve',
    ]);
  });
});

describe('task files', () => {
  let dir = '';
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-task-records-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('written, read back sandbox first, removed; a file that is not a task is skipped and named', async () => {
    const io = { stdin: '', stdout: '/f/out', stderr: '/f/err', terminal: false };
    const base = { bundle: '/b', io, rootfsMounted: false, crio: false, solo: false, started: true };
    await writeTaskRecord(dir, { id: 'c1', kind: 'container', ...base });
    await writeTaskRecord(dir, { id: 's1', kind: 'sandbox', ...base });
    const { writeFileSync } = await import('node:fs');
    writeFileSync(path.join(dir, 'tasks', 'junk.json'), '{"id":"junk"}');
    const read = await readTaskRecords(dir);
    expect(read.records.map((r) => r.id)).toEqual(['s1', 'c1']);
    expect(read.bad).toEqual(['junk.json']);
    await removeTaskRecord(dir, 'c1');
    expect((await readTaskRecords(dir)).records.map((r) => r.id)).toEqual(['s1']);
    expect(await readTaskRecords(path.join(dir, 'none'))).toEqual({ records: [], bad: [] });
  });
});
