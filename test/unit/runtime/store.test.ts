import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { type RecordKind, RecordStore } from '../../../src/runtime/store.js';

interface Thing {
  id: string;
  size: number;
}
const KIND: RecordKind = {
  kind: 'thing',
  dir: 'things',
  version: 2,
  schema: {
    type: 'object',
    additionalProperties: false,
    required: ['id', 'size'],
    properties: { id: { type: 'string' }, size: { type: 'integer', minimum: 0 } },
  },
};

describe('RecordStore', () => {
  let stateDir: string;
  let store: RecordStore<Thing>;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-store-'));
    store = new RecordStore<Thing>(stateDir, KIND, silentLogger());
    await store.init();
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('round-trips records in a versioned envelope', async () => {
    await store.put({ id: 'a1', size: 1 });
    await store.put({ id: 'b2', size: 2 });
    await store.put({ id: 'a1', size: 3 });
    const { records, problems } = await store.load();
    expect(problems).toEqual([]);
    expect(records).toEqual([
      { id: 'a1', size: 3 },
      { id: 'b2', size: 2 },
    ]);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'things', 'a1.json'), 'utf8'));
    expect(onDisk).toEqual({ kind: 'thing', version: 2, record: { id: 'a1', size: 3 } });
  });

  it('writes atomically: no temporary file survives, and a leftover temp from a crash is discarded', async () => {
    await store.put({ id: 'a1', size: 1 });
    expect(await readdir(store.directory)).toEqual(['a1.json']);
    // What a crash between write and rename leaves behind: a half-written temp next to the old record.
    await writeFile(path.join(store.directory, '.a1.json.deadbeef.tmp'), '{"kind":"thing","vers');
    const { records, problems } = await store.load();
    expect(records).toEqual([{ id: 'a1', size: 1 }]);
    expect(problems).toEqual([]);
    expect(await readdir(store.directory)).toEqual(['a1.json']);
  });

  it('refuses to persist an invalid record', async () => {
    await expect(store.put({ id: 'x', size: -1 })).rejects.toThrow(/invalid thing record/);
    await expect(store.put({ id: '../escape', size: 1 })).rejects.toMatchObject({ reason: 'STORE_BAD_ID' });
    expect(await readdir(store.directory)).toEqual([]);
  });

  it('sets corrupt and invalid records aside, reports each, and keeps loading the rest', async () => {
    await store.put({ id: 'good', size: 1 });
    await writeFile(path.join(store.directory, 'torn.json'), '{"kind":"thing","version":2,"rec');
    await writeFile(
      path.join(store.directory, 'bad.json'),
      JSON.stringify({ kind: 'thing', version: 2, record: { id: 'bad', size: 'big' } }),
    );
    await writeFile(path.join(store.directory, 'alien.json'), JSON.stringify({ kind: 'other', version: 2, record: {} }));
    await writeFile(
      path.join(store.directory, 'moved.json'),
      JSON.stringify({ kind: 'thing', version: 2, record: { id: 'elsewhere', size: 1 } }),
    );
    const { records, problems } = await store.load();
    expect(records).toEqual([{ id: 'good', size: 1 }]);
    expect(problems.map((p) => path.basename(p.file)).sort()).toEqual(['alien.json', 'bad.json', 'moved.json', 'torn.json']);
    expect(problems.find((p) => p.file.endsWith('bad.json'))?.problem).toMatch(/\/size must be integer/);
    for (const p of problems) expect(p.setAsideTo).toMatch(/\/things\/corrupt\//);
    // Nothing was dropped: every file is still on disk, under corrupt/.
    expect((await readdir(path.join(store.directory, 'corrupt'))).length).toBe(4);
    expect((await store.load()).problems).toEqual([]);
  });

  it('leaves a record from a newer format in place and reports it', async () => {
    const file = path.join(store.directory, 'future.json');
    await writeFile(file, JSON.stringify({ kind: 'thing', version: 3, record: { id: 'future', size: 1, extra: true } }));
    const { records, problems } = await store.load();
    expect(records).toEqual([]);
    expect(problems).toEqual([expect.objectContaining({ file, setAsideTo: null })]);
    expect(await readdir(store.directory)).toContain('future.json');
  });

  it("migrates an older format on load with the kind's migrate, writes it back, and sets aside what cannot migrate", async () => {
    const migrating = new RecordStore<Thing>(
      stateDir,
      {
        ...KIND,
        migrate: (_from, record) => {
          const r = record as { id: string; bytes?: number };
          if (r.bytes === undefined) throw new Error('bytes is missing');
          return { id: r.id, size: r.bytes };
        },
      },
      silentLogger(),
    );
    await writeFile(path.join(store.directory, 'old.json'), JSON.stringify({ kind: 'thing', version: 1, record: { id: 'old', bytes: 7 } }));
    await writeFile(path.join(store.directory, 'odd.json'), JSON.stringify({ kind: 'thing', version: 1, record: { id: 'odd' } }));
    const { records, problems } = await migrating.load();
    expect(records).toEqual([{ id: 'old', size: 7 }]);
    expect(problems.map((p) => [path.basename(p.file), p.problem])).toEqual([
      ['odd.json', 'format 1 could not be migrated: bytes is missing'],
    ]);
    const written = JSON.parse(await readFile(path.join(store.directory, 'old.json'), 'utf8'));
    expect(written).toEqual({ kind: 'thing', version: 2, record: { id: 'old', size: 7 } });
    // Without a migrate, an older format is set aside as before.
    await writeFile(
      path.join(store.directory, 'older.json'),
      JSON.stringify({ kind: 'thing', version: 1, record: { id: 'older', bytes: 1 } }),
    );
    expect((await store.load()).problems.map((p) => p.problem)).toEqual(['unsupported format version 1']);
  });

  it('delete is idempotent', async () => {
    await store.put({ id: 'a1', size: 1 });
    await store.delete('a1');
    await store.delete('a1');
    expect((await store.load()).records).toEqual([]);
  });
});
