import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { type Logger, silentLogger } from '../../src/common/logger.js';
import { ImageService, type ImageServiceOptions } from '../../src/images/service.js';
import { type Blob, type BuiltImage, buildImage, buildIndex, busyboxBaseEntries, RegistryPusher } from './images-builder.js';
import type { RegistryHandle } from './images-registry.js';

/** The test images every integration file can publish, by role. */
export interface TestImages {
  /** OCI: busybox base (gzip) + an app layer (zstd). Pushed as kata/busybox:1.0 and :1.1-alias. */
  busybox: BuiltImage;
  /** Four layers exercising whiteouts, an opaque dir, hard links, symlinks and modes; kata/layered:latest. */
  layered: BuiltImage;
  /** kata/multiarch:latest is an OCI index over these two. */
  multiarchAmd64: BuiltImage;
  multiarchArm64: BuiltImage;
  multiarchIndex: Blob;
  /** Docker schema 2, USER 1000:1000; kata/nonroot:latest, pushed in chunks. */
  nonroot: BuiltImage;
  /** USER app (a name); kata/named-user:latest. */
  namedUser: BuiltImage;
  /** Shares busybox's base layer; kata/sibling:latest. */
  sibling: BuiltImage;
}

export async function buildTestImages(): Promise<TestImages> {
  const base = { entries: busyboxBaseEntries(), compression: 'gzip' as const };
  const busybox = await buildImage({
    layers: [
      base,
      {
        entries: [
          { name: 'app/', type: 'directory' },
          { name: 'app/hello.txt', content: 'hello from a zstd layer\n' },
        ],
        compression: 'zstd',
      },
    ],
    cmd: ['/bin/sh', '-c', 'cat /app/hello.txt'],
  });
  const layered = await buildImage({
    layers: [
      base,
      {
        compression: 'gzip',
        entries: [
          { name: 'data/', type: 'directory' },
          { name: 'data/keep.txt', content: 'keep' },
          { name: 'data/remove-me.txt', content: 'gone in the next layer' },
          { name: 'data/dir-to-remove/', type: 'directory' },
          { name: 'data/dir-to-remove/inner', content: 'x' },
          { name: 'opt/', type: 'directory' },
          { name: 'opt/lower-only.txt', content: 'hidden by the opaque dir' },
          { name: 'opt/sub/', type: 'directory' },
          { name: 'opt/sub/lower.txt', content: 'hidden too' },
        ],
      },
      {
        compression: 'zstd',
        entries: [
          { name: 'data/.wh.remove-me.txt', content: '' },
          { name: 'data/.wh.dir-to-remove', content: '' },
          { name: 'opt/', type: 'directory', mode: 0o750 },
          { name: 'opt/.wh..wh..opq', content: '' },
          { name: 'opt/upper.txt', content: 'from the upper layer' },
        ],
      },
      {
        compression: 'none',
        entries: [
          { name: 'usr/', type: 'directory' },
          { name: 'usr/local/', type: 'directory' },
          { name: 'usr/local/bin/', type: 'directory' },
          { name: 'usr/local/bin/suid-tool', content: '#!/bin/sh\n', mode: 0o4755, uid: 0, gid: 0 },
          { name: 'usr/local/bin/tool-link', type: 'link', linkname: 'usr/local/bin/suid-tool' },
          { name: 'usr/local/bin/tool-sym', type: 'symlink', linkname: 'suid-tool' },
          { name: 'home/', type: 'directory' },
          { name: 'home/app/', type: 'directory', mode: 0o700, uid: 1000, gid: 1000 },
          { name: 'home/app/.profile', content: 'export PS1=app\n', mode: 0o640, uid: 1000, gid: 1000 },
        ],
      },
    ],
  });
  const marker = (arch: string) => ({
    entries: [
      { name: 'etc/', type: 'directory' as const },
      { name: 'etc/arch', content: `${arch}\n` },
    ],
    compression: 'gzip' as const,
  });
  const multiarchAmd64 = await buildImage({ layers: [base, marker('amd64')], architecture: 'amd64' });
  const multiarchArm64 = await buildImage({ layers: [marker('arm64')], architecture: 'arm64' });
  const multiarchIndex = buildIndex([
    { image: multiarchArm64, os: 'linux', architecture: 'arm64', variant: 'v8' },
    { image: multiarchAmd64, os: 'linux', architecture: 'amd64' },
  ]);
  const nonroot = await buildImage({ flavour: 'docker', layers: [base], user: '1000:1000', label: 'nonroot' });
  const namedUser = await buildImage({ layers: [base], user: 'app', label: 'named-user' });
  const sibling = await buildImage({ layers: [base, { entries: [{ name: 'sibling.txt', content: 'sibling' }], compression: 'gzip' }] });
  return { busybox, layered, multiarchAmd64, multiarchArm64, multiarchIndex, nonroot, namedUser, sibling };
}

/** Push every test image to `registry`. */
export async function publishTestImages(registry: RegistryHandle, images: TestImages): Promise<void> {
  const pusher = new RegistryPusher(registry.url, registry.pushAuthorization);
  await pusher.pushImage('kata/busybox', '1.0', images.busybox);
  await pusher.pushManifest('kata/busybox', '1.1-alias', images.busybox.manifest);
  await pusher.pushImage('kata/layered', 'latest', images.layered);
  await pusher.pushIndex('kata/multiarch', 'latest', images.multiarchIndex, [images.multiarchAmd64, images.multiarchArm64]);
  await pusher.pushImage('kata/nonroot', 'latest', images.nonroot, 'chunked');
  await pusher.pushImage('kata/named-user', 'latest', images.namedUser);
  await pusher.pushImage('kata/sibling', 'latest', images.sibling);
}

export interface ServiceHarness {
  service: ImageService;
  stateDir: string;
  registriesFile: string;
  inUse: Set<string>;
  /** A fresh ImageService on the same state dir (a daemon restart). */
  restart(): Promise<ImageService>;
  cleanup(): Promise<void>;
}

/** An ImageService on a temp state dir whose registries file marks 127.0.0.1:* as plain HTTP. */
export async function startImageService(
  extra: Partial<ImageServiceOptions> & { registries?: Record<string, unknown>; logger?: Logger } = {},
): Promise<ServiceHarness> {
  const stateDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-images-state-'));
  const registriesFile = path.join(stateDir, 'registries.json');
  await fsp.writeFile(registriesFile, JSON.stringify({ registries: extra.registries ?? { '127.0.0.1:*': { plainHttp: true } } }));
  const inUse = new Set<string>();
  const services: ImageService[] = [];
  const make = async (): Promise<ImageService> => {
    const { registries: _r, ...rest } = extra;
    const svc = new ImageService({
      stateDir,
      registriesConfigPath: registriesFile,
      logger: extra.logger ?? silentLogger(),
      isImageInUse: (id) => inUse.has(id),
      // These tests read unpacked images as flat trees (rootfsFor): copy mode, unless a test asks
      // for the overlay layout (test/integration/images/layers.test.ts).
      rootfsMode: 'copy',
      ...rest,
    });
    await svc.init();
    services.push(svc);
    return svc;
  };
  let service: ImageService;
  try {
    service = await make();
  } catch (err) {
    await fsp.rm(stateDir, { recursive: true, force: true });
    throw err;
  }
  return {
    service,
    stateDir,
    registriesFile,
    inUse,
    restart: make,
    cleanup: async () => {
      for (const s of services) s.close();
      await fsp.rm(stateDir, { recursive: true, force: true });
    },
  };
}

/** Files under a directory, relative, sorted (for asserting what the store holds). */
export async function listFiles(dir: string): Promise<string[]> {
  try {
    return (await fsp.readdir(dir)).sort();
  } catch {
    return [];
  }
}
