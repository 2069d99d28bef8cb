import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { internal } from '../../common/errors.js';
import { readFileIfExists, writeFileAtomic } from '../../common/fsutil.js';
import { compileOnce, describeSchemaErrors } from '../../common/schema.js';
import type { Digest } from '../digest.js';

/** One filesystem layer of a stored image. */
export interface LayerRecord {
  digest: Digest;
  /** Compressed size as stored. */
  sizeBytes: number;
  mediaType: string;
  /** sha256 of the uncompressed tar (the config's rootfs.diff_ids entry). */
  diffId: Digest;
}

/** A pulled image as persisted in `<stateDir>/images/index.json`. */
export interface ImageRecord {
  /** The config digest: Image.id, PullImageResponse.image_ref, Container.image_id. */
  id: Digest;
  /** `docker.io/library/busybox:latest`, ... */
  repoTags: string[];
  /** `docker.io/library/busybox@sha256:<index or manifest digest>`, ... */
  repoDigests: string[];
  /** The platform manifest this image was built from. */
  manifestDigest: Digest;
  manifestMediaType: string;
  layers: LayerRecord[];
  /** Manifest + config + compressed layers, as containerd reports Image.size. */
  sizeBytes: number;
  /** From the config's User: a numeric user, or null. */
  uid: number | null;
  /** From the config's User: a user name, or "". */
  username: string;
  pinned: boolean;
  /** The ImageSpec annotations of the pull that stored this image. */
  annotations: Record<string, string>;
  /** ISO-8601 time of the first pull. */
  pulledAt: string;
  /**
   * How the image is unpacked: `layers`, each layer in its own shared directory
   * (`layers/<diff id hex>`, for overlay root filesystems); `flat`, one merged tree
   * (`rootfs/<id hex>`, copied per container: copy mode, and every image of an index of format 1).
   */
  unpacked: 'layers' | 'flat';
}

/** Format 2 added `unpacked`; format 1's images were all unpacked flat. */
export const IMAGE_INDEX_VERSION = 2;

export interface ImageIndexDocument {
  version: typeof IMAGE_INDEX_VERSION;
  images: ImageRecord[];
}

/**
 * An index document of an older format -> the current one (pure; anything that is not an older
 * format is returned as it is, for the schema to judge). 1 -> 2: every image was unpacked flat.
 */
export function migrateImageIndex(doc: unknown): unknown {
  if (typeof doc !== 'object' || doc === null) return doc;
  const d = doc as { version?: unknown; images?: unknown };
  if (d.version !== 1 || !Array.isArray(d.images)) return doc;
  return {
    ...d,
    version: IMAGE_INDEX_VERSION,
    images: d.images.map((i: unknown) => (typeof i === 'object' && i !== null ? { ...i, unpacked: 'flat' } : i)),
  };
}

const digest = { type: 'string', pattern: '^sha256:[a-f0-9]{64}$' } as const;

export const imageIndexSchema = {
  $id: 'https://kata-ts.dev/schemas/image-index.json',
  type: 'object',
  additionalProperties: false,
  required: ['version', 'images'],
  properties: {
    version: { const: IMAGE_INDEX_VERSION },
    images: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: [
          'id',
          'repoTags',
          'repoDigests',
          'manifestDigest',
          'manifestMediaType',
          'layers',
          'sizeBytes',
          'uid',
          'username',
          'pinned',
          'annotations',
          'pulledAt',
          'unpacked',
        ],
        properties: {
          id: digest,
          repoTags: { type: 'array', items: { type: 'string' } },
          repoDigests: { type: 'array', items: { type: 'string' } },
          manifestDigest: digest,
          manifestMediaType: { type: 'string' },
          layers: {
            type: 'array',
            items: {
              type: 'object',
              additionalProperties: false,
              required: ['digest', 'sizeBytes', 'mediaType', 'diffId'],
              properties: { digest, sizeBytes: { type: 'integer', minimum: 0 }, mediaType: { type: 'string' }, diffId: digest },
            },
          },
          sizeBytes: { type: 'integer', minimum: 0 },
          uid: { type: ['integer', 'null'], minimum: 0 },
          username: { type: 'string' },
          pinned: { type: 'boolean' },
          annotations: { type: 'object', additionalProperties: { type: 'string' } },
          pulledAt: { type: 'string' },
          unpacked: { enum: ['layers', 'flat'] },
        },
      },
    },
  },
} as const;

const validateIndex = compileOnce<ImageIndexDocument>(imageIndexSchema);

/**
 * The image index file. Every change rewrites it whole through writeFileAtomic, so after a crash
 * it holds either the old or the new list, never half of one; an image is visible only once its
 * blobs and root filesystem are complete, because the pull commits the record last.
 */
export class ImageRecordFile {
  readonly file: string;

  constructor(root: string) {
    this.file = path.join(root, 'index.json');
  }

  async load(): Promise<ImageRecord[]> {
    const text = await readFileIfExists(this.file);
    if (text === undefined) return [];
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch (err) {
      throw internal('IMAGE_INDEX_CORRUPT', `image index ${this.file} is not valid JSON`, { cause: err });
    }
    doc = migrateImageIndex(doc);
    const validate = validateIndex();
    if (!validate(doc)) {
      throw internal('IMAGE_INDEX_CORRUPT', `image index ${this.file} is invalid: ${describeSchemaErrors(validate.errors).join('; ')}`);
    }
    return doc.images;
  }

  async save(images: ImageRecord[]): Promise<void> {
    await fsp.mkdir(path.dirname(this.file), { recursive: true });
    const doc: ImageIndexDocument = { version: IMAGE_INDEX_VERSION, images };
    await writeFileAtomic(this.file, JSON.stringify(doc, null, 1));
  }
}

/** Every blob an image needs kept: config, manifest, layers, and the top-level digests it was pulled by. */
export function referencedBlobs(record: ImageRecord): Digest[] {
  const out: Digest[] = [record.id, record.manifestDigest, ...record.layers.map((l) => l.digest)];
  for (const rd of record.repoDigests) {
    const at = rd.lastIndexOf('@');
    if (at >= 0) out.push(rd.slice(at + 1) as Digest);
  }
  return out;
}
