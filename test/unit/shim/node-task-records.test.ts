/**
 * The node mode's task files (src/shim/node-task-records.ts): what a revived node server reads
 * back, the output holder's pid with it; a file whose holder pid is not a pid is skipped as bad.
 */
import { promises as fsp, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { readTaskRecords, type TaskRecordFile, writeTaskRecord } from '../../../src/shim/node-task-records.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const record = (id: string, extra: Partial<TaskRecordFile> = {}): TaskRecordFile => ({
  id,
  kind: 'container',
  bundle: `/run/containerd/b/${id}`,
  io: { stdin: '', stdout: `/run/containerd/fifo/${id}-stdout`, stderr: `/run/containerd/fifo/${id}-stderr`, terminal: false },
  rootfsMounted: true,
  crio: false,
  solo: false,
  started: true,
  ...extra,
});

describe('node task records', () => {
  it("keep the output holder's pid; older files without it still read; a holder pid that is not a pid makes the file bad", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-task-records-'));
    dirs.push(dir);
    await writeTaskRecord(dir, record('a', { outputHolderPid: 4242 }));
    await writeTaskRecord(dir, record('b'));
    await writeTaskRecord(dir, record('s', { kind: 'sandbox' }));
    await fsp.writeFile(path.join(dir, 'tasks', 'c.json'), JSON.stringify({ ...record('c'), outputHolderPid: -1 }));
    await fsp.writeFile(path.join(dir, 'tasks', 'd.json'), JSON.stringify({ ...record('d'), outputHolderPid: '12' }));
    const { records, bad } = await readTaskRecords(dir);
    expect(records.map((r) => [r.id, r.outputHolderPid])).toEqual([
      ['s', undefined],
      ['a', 4242],
      ['b', undefined],
    ]);
    expect(bad).toEqual(['c.json', 'd.json']);
  });
});
