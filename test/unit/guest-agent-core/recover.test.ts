import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { findBundles, readExitFile, runtimeStatus, writeBundleRecord } from '../../../guest/agent/containers/recover.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'h6-recover-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

describe('recovery after an agent restart', () => {
  it('reads the reaper exit file: exit, signal, or nothing yet', async () => {
    const pidFile = path.join(dir, 'init.pid');
    expect(await readExitFile(pidFile)).toBeUndefined();
    writeFileSync(`${pidFile}.exit`, 'signal 9\n');
    expect((await readExitFile(pidFile))?.status).toEqual({ kind: 'signal', signal: 9 });
    writeFileSync(`${pidFile}.exit`, 'exit 3\n');
    expect((await readExitFile(pidFile))?.status).toEqual({ kind: 'exit', code: 3 });
  });

  it('finds bundles that reached crun create, skipping half-made ones', async () => {
    const a = path.join(dir, 'a');
    const b = path.join(dir, 'b');
    for (const d of [a, b]) rmSync(d, { recursive: true, force: true });
    await import('node:fs/promises').then((fs) => Promise.all([fs.mkdir(a), fs.mkdir(b)]));
    writeFileSync(path.join(a, 'init.pid'), '42');
    await writeBundleRecord(a, { createdAtMs: 5, writableLayerPath: '/w' });
    writeFileSync(path.join(b, 'config.json'), '{}');
    expect(await findBundles(dir)).toEqual([{ id: 'a', bundle: a, pid: 42, record: { createdAtMs: 5, writableLayerPath: '/w' } }]);
    expect(await findBundles(path.join(dir, 'missing'))).toEqual([]);
  });

  it("maps crun's status", () => {
    expect(runtimeStatus('{"status":"created"}')).toBe('created');
    expect(runtimeStatus('{"status":"running"}')).toBe('running');
    expect(runtimeStatus('{"status":"paused"}')).toBe('running');
    expect(runtimeStatus('{"status":"stopped"}')).toBe('stopped');
  });
});
