import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { buildTar, FIXED_MTIME, gzip, type TarEntrySpec, zstd } from './images-tar.js';

/** A blob ready to push: its bytes, digest and media type. */
export interface Blob {
  bytes: Buffer;
  digest: string;
  size: number;
  mediaType: string;
}

export interface BuiltImage {
  manifest: Blob;
  config: Blob;
  layers: Blob[];
  /** sha256 of each uncompressed layer tar. */
  diffIds: string[];
  /** The image id a runtime reports: the config digest. */
  id: string;
}

export interface LayerSpec {
  entries: TarEntrySpec[];
  compression: 'gzip' | 'zstd' | 'none';
}

export interface ImageSpecForBuild {
  layers: LayerSpec[];
  /** `oci` (OCI media types) or `docker` (Docker v2 schema 2). zstd layers need `oci`. */
  flavour?: 'oci' | 'docker';
  architecture?: string;
  user?: string;
  cmd?: string[];
  env?: string[];
  /** Varies the config so otherwise identical images get different ids. */
  label?: string;
}

export function sha256(data: Buffer | string): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

export function blobOf(bytes: Buffer, mediaType: string): Blob {
  return { bytes, digest: sha256(bytes), size: bytes.length, mediaType };
}

const LAYER_MEDIA: Record<'oci' | 'docker', Record<LayerSpec['compression'], string>> = {
  oci: {
    gzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
    zstd: 'application/vnd.oci.image.layer.v1.tar+zstd',
    none: 'application/vnd.oci.image.layer.v1.tar',
  },
  docker: {
    gzip: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
    zstd: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
    none: 'application/vnd.docker.image.rootfs.diff.tar',
  },
};

/** Build a complete image (layers, config, manifest) in memory. */
export async function buildImage(spec: ImageSpecForBuild): Promise<BuiltImage> {
  const flavour = spec.flavour ?? 'oci';
  const layers: Blob[] = [];
  const diffIds: string[] = [];
  for (const layer of spec.layers) {
    const tar = await buildTar(layer.entries);
    diffIds.push(sha256(tar));
    const bytes = layer.compression === 'gzip' ? gzip(tar) : layer.compression === 'zstd' ? await zstd(tar) : tar;
    layers.push(blobOf(bytes, LAYER_MEDIA[flavour][layer.compression]));
  }
  const configDoc = {
    created: FIXED_MTIME.toISOString(),
    architecture: spec.architecture ?? 'amd64',
    os: 'linux',
    config: {
      User: spec.user ?? '',
      Env: spec.env ?? ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'],
      Cmd: spec.cmd ?? ['/bin/sh'],
      Labels: spec.label === undefined ? {} : { 'kata-ts.test': spec.label },
    },
    rootfs: { type: 'layers', diff_ids: diffIds },
    history: spec.layers.map(() => ({ created: FIXED_MTIME.toISOString(), created_by: 'kata-ts test image builder' })),
  };
  const config = blobOf(
    Buffer.from(JSON.stringify(configDoc)),
    flavour === 'oci' ? 'application/vnd.oci.image.config.v1+json' : 'application/vnd.docker.container.image.v1+json',
  );
  const manifestMediaType =
    flavour === 'oci' ? 'application/vnd.oci.image.manifest.v1+json' : 'application/vnd.docker.distribution.manifest.v2+json';
  const manifestDoc = {
    schemaVersion: 2,
    mediaType: manifestMediaType,
    config: { mediaType: config.mediaType, digest: config.digest, size: config.size },
    layers: layers.map((l) => ({ mediaType: l.mediaType, digest: l.digest, size: l.size })),
  };
  const manifest = blobOf(Buffer.from(JSON.stringify(manifestDoc)), manifestMediaType);
  return { manifest, config, layers, diffIds, id: config.digest };
}

/** An OCI image index (or Docker manifest list) over already-built images. */
export function buildIndex(
  entries: Array<{ image: BuiltImage; os: string; architecture: string; variant?: string }>,
  flavour: 'oci' | 'docker' = 'oci',
): Blob {
  const mediaType =
    flavour === 'oci' ? 'application/vnd.oci.image.index.v1+json' : 'application/vnd.docker.distribution.manifest.list.v2+json';
  const doc = {
    schemaVersion: 2,
    mediaType,
    manifests: entries.map((e) => ({
      mediaType: e.image.manifest.mediaType,
      digest: e.image.manifest.digest,
      size: e.image.manifest.size,
      platform: { os: e.os, architecture: e.architecture, ...(e.variant === undefined ? {} : { variant: e.variant }) },
    })),
  };
  return blobOf(Buffer.from(JSON.stringify(doc)), mediaType);
}

/** Tools busybox provides through symlinks in the test images. */
const BUSYBOX_APPLETS = ['sh', 'ls', 'cat', 'echo', 'id', 'true'];

/** A base layer: the static busybox binary from busybox-static as /bin/busybox plus applet links and /etc. */
export function busyboxBaseEntries(): TarEntrySpec[] {
  const busybox = readFileSync('/bin/busybox');
  return [
    { name: 'bin/', type: 'directory' },
    { name: 'bin/busybox', content: busybox, mode: 0o755 },
    ...BUSYBOX_APPLETS.map((a): TarEntrySpec => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' })),
    { name: 'etc/', type: 'directory' },
    { name: 'etc/passwd', content: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n' },
    { name: 'etc/group', content: 'root:x:0:\napp:x:1000:\n' },
    { name: 'tmp/', type: 'directory', mode: 0o1777 },
  ];
}

/** Pushes blobs and manifests through the distribution HTTP API, as `docker push` would. */
export class RegistryPusher {
  constructor(
    private readonly baseUrl: string,
    private readonly authorization: (repository: string) => Promise<string | undefined> = async () => undefined,
  ) {}

  private async headers(repository: string, extra: Record<string, string> = {}): Promise<Record<string, string>> {
    const auth = await this.authorization(repository);
    return auth === undefined ? extra : { ...extra, Authorization: auth };
  }

  /** Upload one blob: monolithic (POST + PUT with the body) or chunked (POST, PATCH per chunk, PUT). */
  async pushBlob(repository: string, blob: Blob, mode: 'monolithic' | 'chunked' = 'monolithic', chunkBytes = 64 * 1024): Promise<void> {
    const head = await fetch(`${this.baseUrl}/v2/${repository}/blobs/${blob.digest}`, {
      method: 'HEAD',
      headers: await this.headers(repository),
    });
    if (head.status === 200) return;
    const start = await fetch(`${this.baseUrl}/v2/${repository}/blobs/uploads/`, {
      method: 'POST',
      headers: await this.headers(repository),
    });
    await start.arrayBuffer();
    if (start.status !== 202) throw new Error(`upload start for ${repository} answered ${start.status}`);
    let location = new URL(start.headers.get('location') ?? '', this.baseUrl);
    if (mode === 'chunked') {
      for (let offset = 0; offset < blob.size; offset += chunkBytes) {
        const chunk = blob.bytes.subarray(offset, Math.min(offset + chunkBytes, blob.size));
        const res = await fetch(location, {
          method: 'PATCH',
          headers: await this.headers(repository, {
            'Content-Type': 'application/octet-stream',
            'Content-Range': `${offset}-${offset + chunk.length - 1}`,
            'Content-Length': String(chunk.length),
          }),
          body: chunk,
        });
        await res.arrayBuffer();
        if (res.status !== 202) throw new Error(`chunk upload to ${repository} answered ${res.status}`);
        location = new URL(res.headers.get('location') ?? '', this.baseUrl);
      }
      location.searchParams.set('digest', blob.digest);
      const done = await fetch(location, { method: 'PUT', headers: await this.headers(repository, { 'Content-Length': '0' }) });
      await done.arrayBuffer();
      if (done.status !== 201) throw new Error(`upload finish for ${repository} answered ${done.status}`);
      return;
    }
    location.searchParams.set('digest', blob.digest);
    const put = await fetch(location, {
      method: 'PUT',
      headers: await this.headers(repository, { 'Content-Type': 'application/octet-stream', 'Content-Length': String(blob.size) }),
      body: blob.bytes,
    });
    const text = await put.text();
    if (put.status !== 201) throw new Error(`monolithic upload to ${repository} answered ${put.status}: ${text}`);
  }

  async pushManifest(repository: string, reference: string, manifest: Blob): Promise<void> {
    const res = await fetch(`${this.baseUrl}/v2/${repository}/manifests/${reference}`, {
      method: 'PUT',
      headers: await this.headers(repository, { 'Content-Type': manifest.mediaType }),
      body: manifest.bytes,
    });
    const text = await res.text();
    if (res.status !== 201) throw new Error(`manifest push ${repository}:${reference} answered ${res.status}: ${text}`);
  }

  /** Push an image's blobs and its manifest under `tag`. */
  async pushImage(repository: string, tag: string, image: BuiltImage, mode: 'monolithic' | 'chunked' = 'monolithic'): Promise<void> {
    for (const layer of image.layers) await this.pushBlob(repository, layer, mode);
    await this.pushBlob(repository, image.config, mode);
    await this.pushManifest(repository, tag, image.manifest);
  }

  /** Push every image of an index by digest, then the index under `tag`. */
  async pushIndex(repository: string, tag: string, index: Blob, images: BuiltImage[]): Promise<void> {
    for (const image of images) await this.pushImage(repository, image.manifest.digest, image);
    await this.pushManifest(repository, tag, index);
  }
}
