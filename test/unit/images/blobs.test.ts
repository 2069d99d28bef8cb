import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sha256Digest } from '../../../src/images/digest.js';
import { BlobStore } from '../../../src/images/store/blobs.js';

let dir: string;
let store: BlobStore;
const signal = new AbortController().signal;

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-blobs-'));
  store = new BlobStore(dir);
  await store.init();
});

afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

function chunks(...parts: string[]): Readable {
  return Readable.from(parts.map((p) => Buffer.from(p)));
}

describe('BlobStore.ingest', () => {
  it('stores verified content under blobs/sha256/<hex> and counts bytes as they flow', async () => {
    const digest = sha256Digest('hello world');
    let seen = 0;
    await store.ingest(digest, 11, chunks('hello ', 'world'), { signal, what: 'test blob', onBytes: (n) => (seen += n) });
    expect(seen).toBe(11);
    expect(await fsp.readFile(path.join(dir, 'blobs/sha256', digest.slice(7)), 'utf8')).toBe('hello world');
    expect(await store.has(digest, 11)).toBe(true);
    expect(await store.list()).toEqual([digest]);
    expect(await fsp.readdir(store.ingestDir)).toEqual([]);
  });

  it('refuses a digest mismatch and keeps nothing', async () => {
    const digest = sha256Digest('hello world');
    await expect(store.ingest(digest, 11, chunks('hello', ' w0rld'), { signal, what: 'layer X' })).rejects.toMatchObject({
      kind: 'invalid',
      reason: 'IMAGE_DIGEST_MISMATCH',
    });
    expect(await store.list()).toEqual([]);
    expect(await fsp.readdir(store.ingestDir)).toEqual([]);
  });

  it('stops as soon as more bytes arrive than the descriptor announced, and on a short body', async () => {
    const digest = sha256Digest('hello world');
    let pulled = 0;
    const endless = new Readable({
      read() {
        pulled++;
        this.push(Buffer.alloc(1024, 1));
      },
    });
    await expect(store.ingest(digest, 11, endless, { signal, what: 'layer Y' })).rejects.toMatchObject({ reason: 'IMAGE_SIZE_MISMATCH' });
    expect(pulled).toBeLessThan(100);
    await expect(store.ingest(digest, 12, chunks('hello world'), { signal, what: 'layer Z' })).rejects.toMatchObject({
      reason: 'IMAGE_SIZE_MISMATCH',
    });
    expect(await store.list()).toEqual([]);
    expect(await fsp.readdir(store.ingestDir)).toEqual([]);
  });

  it('reports a source that breaks off as UNAVAILABLE and an abort as the abort reason', async () => {
    const digest = sha256Digest('x');
    const broken = new Readable({
      read() {
        this.destroy(new Error('socket hang up'));
      },
    });
    await expect(store.ingest(digest, 1, broken, { signal, what: 'layer' })).rejects.toMatchObject({ kind: 'unavailable' });
    const controller = new AbortController();
    const never = new Readable({ read() {} });
    const p = store.ingest(digest, 1, never, { signal: controller.signal, what: 'layer' });
    controller.abort();
    await expect(p).rejects.toMatchObject({ kind: 'cancelled' });
    expect(await fsp.readdir(store.ingestDir)).toEqual([]);
  });
});

describe('BlobStore absence', () => {
  it('answers "not stored" only for a missing file, and lets other errors surface', async () => {
    const digest = sha256Digest('hello world');
    expect(await store.has(digest)).toBe(false);
    await fsp.rm(store.ingestDir, { recursive: true });
    expect(await store.cleanIngest()).toBe(0);
    // A file where the blob and ingest directories should be: ENOTDIR is a broken store, not an
    // absent blob (running as root, EACCES cannot be staged; it takes the same path).
    const blobDir = path.join(dir, 'blobs', 'sha256');
    await fsp.rm(blobDir, { recursive: true });
    await fsp.writeFile(blobDir, '');
    await expect(store.has(digest)).rejects.toMatchObject({ code: 'ENOTDIR' });
    await fsp.writeFile(store.ingestDir, '');
    await expect(store.cleanIngest()).rejects.toMatchObject({ code: 'ENOTDIR' });
  });
});
