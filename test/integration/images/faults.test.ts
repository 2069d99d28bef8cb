import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../../src/common/logger.js';
import {
  buildTestImages,
  listFiles,
  publishTestImages,
  type ServiceHarness,
  startImageService,
  type TestImages,
} from '../../helpers/images-fixtures.js';
import { type ProxyHandle, startProxy } from '../../helpers/images-proxy.js';
import { freePort, type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

// Faults between a real docker-registry and the ImageService: a proxy corrupts or stalls one blob.
let registry: RegistryHandle;
let images: TestImages;
const cleanups: Array<() => Promise<void>> = [];

beforeAll(async () => {
  images = await buildTestImages();
  registry = await startRegistry();
  await publishTestImages(registry, images);
});

afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()?.();
});

afterAll(async () => {
  await registry?.stop();
});

async function harness(extra: Parameters<typeof startImageService>[0] = {}): Promise<ServiceHarness> {
  const h = await startImageService(extra);
  cleanups.push(h.cleanup);
  return h;
}

async function proxy(opts: Parameters<typeof startProxy>[1]): Promise<ProxyHandle> {
  const p = await startProxy(registry.url, opts);
  cleanups.push(p.stop);
  return p;
}

const hex = (d: string): string => d.slice('sha256:'.length);
const storeDirs = (h: ServiceHarness) => ({
  blobs: path.join(h.stateDir, 'images', 'blobs', 'sha256'),
  ingest: path.join(h.stateDir, 'images', 'ingest'),
  rootfs: path.join(h.stateDir, 'images', 'rootfs'),
});

/** Poll until `check` holds (no timing asserted: the test timeout is the only bound). */
async function eventually(check: () => Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((r) => setTimeout(r, 50));
}

describe('registry faults', () => {
  it('refuses a blob whose bytes do not match its digest and keeps nothing of it', async () => {
    const layer = images.busybox.layers[1]?.digest ?? '';
    const p = await proxy({ corruptBlob: layer });
    const h = await harness();
    const err = await h.service.pullImage({ image: { image: `${p.host}/kata/busybox:1.0` } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_DIGEST_MISMATCH' });
    expect((err as Error).message).toContain(layer);
    expect(p.blobGets.get(layer)).toBe(1);
    const dirs = storeDirs(h);
    expect(await listFiles(dirs.blobs)).not.toContain(hex(layer));
    expect(await listFiles(dirs.ingest)).toEqual([]);
    expect(await listFiles(dirs.rootfs)).toEqual([]);
    expect((await h.service.listImages({})).images).toEqual([]);
  });

  it('answers UNAVAILABLE when the registry cannot be reached', async () => {
    const h = await harness();
    const port = await freePort();
    await expect(h.service.pullImage({ image: { image: `127.0.0.1:${port}/kata/busybox:1.0` } })).rejects.toMatchObject({
      kind: 'unavailable',
      reason: 'IMAGE_REGISTRY_UNREACHABLE',
    });
  });

  it('shares one download between concurrent pulls of the same image and of images with a common layer', async () => {
    const p = await proxy({});
    const h = await harness();
    const ref = `${p.host}/kata/busybox:1.0`;
    const results = await Promise.all([
      h.service.pullImage({ image: { image: ref } }),
      h.service.pullImage({ image: { image: ref } }),
      h.service.pullImage({ image: { image: ref } }),
      h.service.pullImage({ image: { image: `${p.host}/kata/sibling:latest` } }),
    ]);
    expect(results.map((r) => r.image_ref)).toEqual([images.busybox.id, images.busybox.id, images.busybox.id, images.sibling.id]);
    for (const blob of [...images.busybox.layers, images.busybox.config, ...images.sibling.layers.slice(1)]) {
      expect(p.blobGets.get(blob.digest), blob.digest).toBe(1);
    }
    expect((await h.service.listImages({})).images).toHaveLength(2);
  });

  it("cancels a stalled pull on the caller's signal, removing its temp file and showing no image", async () => {
    const layer = images.busybox.layers[0];
    const p = await proxy({ stallBlob: { digest: layer?.digest ?? '', afterBytes: 4096 } });
    const h = await harness();
    const controller = new AbortController();
    const pull = h.service.pullImage({ image: { image: `${p.host}/kata/busybox:1.0` } }, { signal: controller.signal });
    pull.catch(() => undefined);
    await p.stalled;
    const dirs = storeDirs(h);
    await eventually(async () => (await listFiles(dirs.ingest)).length === 1);
    controller.abort();
    await expect(pull).rejects.toMatchObject({ kind: 'cancelled' });
    await eventually(async () => (await listFiles(dirs.ingest)).length === 0);
    expect((await h.service.listImages({})).images).toEqual([]);
    expect(await listFiles(dirs.rootfs)).toEqual([]);
  });

  it('keeps a shared pull running while one caller remains, and stops it at the deadline of the last', async () => {
    const layer = images.busybox.layers[0];
    const p = await proxy({ stallBlob: { digest: layer?.digest ?? '', afterBytes: 4096 } });
    const h = await harness();
    const ref = `${p.host}/kata/busybox:1.0`;
    const first = new AbortController();
    const a = h.service.pullImage({ image: { image: ref } }, { signal: first.signal });
    let bSettled = false;
    const b = h.service.pullImage({ image: { image: ref } }, { deadlineMs: Date.now() + 3_000 });
    b.then(
      () => (bSettled = true),
      () => (bSettled = true),
    );
    await p.stalled;
    first.abort();
    await expect(a).rejects.toMatchObject({ kind: 'cancelled' });
    await new Promise((r) => setImmediate(r));
    expect(bSettled).toBe(false);
    await expect(b).rejects.toMatchObject({ kind: 'timeout', reason: 'IMAGE_DEADLINE_EXCEEDED' });
    const dirs = storeDirs(h);
    await eventually(async () => (await listFiles(dirs.ingest)).length === 0);
    expect(p.blobGets.get(layer?.digest ?? '')).toBe(1);
    expect((await h.service.listImages({})).images).toEqual([]);
  });

  it('logs progress (bytes and layers done) while a long pull runs', async () => {
    const layer = images.layered.layers[2];
    const p = await proxy({ stallBlob: { digest: layer?.digest ?? '', afterBytes: 100 } });
    const lines: Array<Record<string, unknown>> = [];
    const logger = createLogger({
      level: 'info',
      destination: { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) },
    });
    const h = await harness({ logger, progressIntervalMs: 20 });
    const controller = new AbortController();
    const pull = h.service.pullImage({ image: { image: `${p.host}/kata/layered:latest` } }, { signal: controller.signal });
    pull.catch(() => undefined);
    await p.stalled;
    const done = images.layered.layers.reduce((n, l) => n + l.size, 0) - (layer?.size ?? 0) + 100;
    // Every other layer completes; the stalled one has sent 100 bytes.
    await eventually(async () => lines.some((l) => l.msg === 'pull progress' && l.bytesDone === done && l.layersDone === 3));
    const line = lines.find((l) => l.msg === 'pull progress' && l.bytesDone === done);
    expect(line).toMatchObject({
      image: `${p.host}/kata/layered:latest`,
      layersTotal: 4,
      bytesTotal: images.layered.layers.reduce((n, l) => n + l.size, 0),
    });
    controller.abort();
    await expect(pull).rejects.toMatchObject({ kind: 'cancelled' });
  });

  it('after a crash halfway through a pull, the next start shows no image and removes every leftover', async () => {
    const stalledLayer = images.layered.layers[3];
    const p = await proxy({ stallBlob: { digest: stalledLayer?.digest ?? '', afterBytes: 1024 } });
    const h = await harness();
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        fileURLToPath(new URL('../../helpers/images-pull-child.ts', import.meta.url)),
        h.stateDir,
        h.registriesFile,
        `${p.host}/kata/layered:latest`,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
    cleanups.push(async () => {
      if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
        process.kill(child.pid, 'SIGKILL');
        await exited;
      }
    });
    const dirs = storeDirs(h);
    await Promise.race([p.stalled, exited.then(() => Promise.reject(new Error(`pull child exited early: ${stderr}`)))]);
    // Wait until the other layers are complete, so the crash leaves verified blobs and a temp file.
    await eventually(async () => (await listFiles(dirs.blobs)).length >= 4 && (await listFiles(dirs.ingest)).length === 1);
    process.kill(child.pid as number, 'SIGKILL');
    await exited;

    // The stalled layer's temp file at least (a download that started between the look and the kill adds one).
    expect((await listFiles(dirs.ingest)).length).toBeGreaterThanOrEqual(1);
    const index = path.join(h.stateDir, 'images', 'index.json');
    const before = await fsp.readFile(index, 'utf8').catch(() => '{"images":[]}');
    expect((JSON.parse(before) as { images: unknown[] }).images).toEqual([]);

    const restarted = await h.restart();
    expect((await restarted.listImages({})).images).toEqual([]);
    expect(await listFiles(dirs.ingest)).toEqual([]);
    expect(await listFiles(dirs.blobs)).toEqual([]);
    expect(await listFiles(dirs.rootfs)).toEqual([]);
  });
});
