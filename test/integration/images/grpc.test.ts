import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { imageServiceHandlers } from '../../../src/cri/image-handlers.js';
import { loadCriPackage } from '../../../src/cri/proto.js';
import { type CriServer, startCriServer } from '../../../src/cri/server.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { type CriClient, criClient } from '../../helpers/cri-client.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import {
  buildTestImages,
  listFiles,
  publishTestImages,
  type ServiceHarness,
  startImageService,
  type TestImages,
} from '../../helpers/images-fixtures.js';
import { type ProxyHandle, startProxy } from '../../helpers/images-proxy.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';

// The ImageService behind the real CRI gRPC server, driven by a grpc-js client over its unix socket,
// pulling from a real docker-registry.
let registry: RegistryHandle;
let images: TestImages;
let h: ServiceHarness;
let server: CriServer;
let clients: CriClient;
let stallProxy: ProxyHandle;

beforeAll(async () => {
  images = await buildTestImages();
  registry = await startRegistry();
  await publishTestImages(registry, images);
  stallProxy = await startProxy(registry.url, { stallBlob: { digest: images.layered.layers[1]?.digest ?? '', afterBytes: 64 } });
  h = await startImageService();
  const cri = loadCriPackage();
  server = await startCriServer({
    socketPath: path.join(h.stateDir, 'cri.sock'),
    logger: silentLogger(),
    metrics: new RuntimeMetrics(),
    services: [{ name: 'runtime.v1.ImageService', definition: cri.imageService, handlers: imageServiceHandlers(h.service) }],
  });
  clients = criClient(server.socketPath);
});

afterAll(async () => {
  clients?.close();
  await server?.close(1000);
  await stallProxy?.stop();
  await h?.cleanup();
  await registry?.stop();
});

describe('ImageService over gRPC', () => {
  it('pulls, lists, inspects, reports usage and removes through the CRI socket', async () => {
    const ref = `${registry.host}/kata/nonroot:latest`;
    const pulled = await clients.image.PullImage({ image: { image: ref }, auth: {} });
    expect(pulled.image_ref).toBe(images.nonroot.id);

    const listed = await clients.image.ListImages({ filter: { image: { image: ref } } });
    expect(listed.images).toHaveLength(1);
    expect(listed.images[0]).toMatchObject({ id: images.nonroot.id, repo_tags: [ref], uid: { value: '1000' }, username: '' });
    expect(Number(listed.images[0]?.size)).toBeGreaterThan(0);

    const status = await clients.image.ImageStatus({
      image: { image: ref },
      verbose: true,
    });
    expect(status.image?.id).toBe(images.nonroot.id);
    expect(JSON.parse(status.info.info ?? '{}')).toMatchObject({ imageSpec: { config: { User: '1000:1000' } } });

    const fs = await clients.image.ImageFsInfo({});
    expect(Number(fs.image_filesystems[0]?.used_bytes?.value)).toBeGreaterThan(0);

    await clients.image.RemoveImage({ image: { image: ref } });
    const after = await clients.image.ImageStatus({ image: { image: ref } });
    expect(after.image).toBeNull();
    await clients.image.RemoveImage({ image: { image: ref } }); // idempotent
  });

  it('maps errors to gRPC codes with the reason in metadata', async () => {
    await expectGrpcError(
      clients.image.PullImage({ image: { image: `${registry.host}/kata/none:1` } }),
      GrpcStatus.NOT_FOUND,
      'IMAGE_NOT_FOUND',
    );
    await expectGrpcError(
      clients.image.PullImage({ image: { image: 'kata/UPPER:1' } }),
      GrpcStatus.INVALID_ARGUMENT,
      'IMAGE_REFERENCE_INVALID',
    );
    await clients.image.PullImage({ image: { image: `${registry.host}/kata/busybox:1.0` } });
    h.inUse.add(images.busybox.id);
    try {
      await expectGrpcError(
        clients.image.RemoveImage({ image: { image: images.busybox.id } }),
        GrpcStatus.FAILED_PRECONDITION,
        'IMAGE_IN_USE',
      );
    } finally {
      h.inUse.delete(images.busybox.id);
    }
  });

  it("stops a stalled pull when the client's deadline passes and leaves no temp file", async () => {
    const call = clients.image.PullImage({ image: { image: `${stallProxy.host}/kata/layered:latest` } }, { deadline: Date.now() + 2_000 });
    await expectGrpcError(call, GrpcStatus.DEADLINE_EXCEEDED);
    const ingest = path.join(h.stateDir, 'images', 'ingest');
    while ((await listFiles(ingest)).length > 0) await new Promise((r) => setTimeout(r, 50));
    const st = await clients.image.ImageStatus({ image: { image: images.layered.id } });
    expect(st.image).toBeNull();
    expect(await fsp.readdir(path.join(h.stateDir, 'images', 'rootfs'))).toEqual(expect.not.arrayContaining([images.layered.id.slice(7)]));
  });
});
