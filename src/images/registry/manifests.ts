import { invalid, notFound, unimplemented } from '../../common/errors.js';
import { compileOnce } from '../../common/schema.js';
import { type Digest, parseDigest } from '../digest.js';

/** Media types kata-ts understands, by role. */
export const MEDIA_TYPES = {
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  dockerManifestList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  dockerSchema1: 'application/vnd.docker.distribution.manifest.v1+json',
  dockerSchema1Signed: 'application/vnd.docker.distribution.manifest.v1+prettyjws',
  ociConfig: 'application/vnd.oci.image.config.v1+json',
  dockerConfig: 'application/vnd.docker.container.image.v1+json',
} as const;

/** The Accept header of a manifest GET: indexes and both manifest flavours, OCI first. */
export const MANIFEST_ACCEPT = [
  MEDIA_TYPES.ociIndex,
  MEDIA_TYPES.ociManifest,
  MEDIA_TYPES.dockerManifestList,
  MEDIA_TYPES.dockerManifest,
].join(', ');

const INDEX_TYPES = new Set<string>([MEDIA_TYPES.ociIndex, MEDIA_TYPES.dockerManifestList]);
const MANIFEST_TYPES = new Set<string>([MEDIA_TYPES.ociManifest, MEDIA_TYPES.dockerManifest]);
const CONFIG_TYPES = new Set<string>([MEDIA_TYPES.ociConfig, MEDIA_TYPES.dockerConfig]);
/** Filesystem layer media types: tar, optionally gzip or zstd compressed (Docker's are gzip). */
const LAYER_TYPE =
  /^application\/vnd\.(?:oci\.image\.layer(?:\.nondistributable)?\.v1\.tar(?:\+gzip|\+zstd)?|docker\.image\.rootfs\.(?:foreign\.)?diff\.tar(?:\.gzip)?)$/;

export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

export interface Descriptor {
  mediaType: string;
  digest: Digest;
  size: number;
  platform?: Platform;
}

export interface ImageManifest {
  mediaType: string;
  config: Descriptor;
  layers: Descriptor[];
}

export interface ImageIndex {
  mediaType: string;
  manifests: Descriptor[];
}

export type ManifestDocument = { kind: 'index'; index: ImageIndex } | { kind: 'manifest'; manifest: ImageManifest };

const descriptorSchema = {
  type: 'object',
  required: ['digest', 'size'],
  properties: {
    mediaType: { type: 'string' },
    digest: { type: 'string' },
    size: { type: 'integer', minimum: 0 },
    platform: {
      type: 'object',
      required: ['os', 'architecture'],
      properties: { os: { type: 'string' }, architecture: { type: 'string' }, variant: { type: 'string' } },
    },
  },
} as const;

// Remote documents may carry fields newer than this code (subject, artifactType, annotations):
// they are tolerated, only the fields used here are checked.
const manifestSchema = {
  $id: 'https://kata-ts.dev/schemas/oci-manifest.json',
  type: 'object',
  required: ['config', 'layers'],
  properties: {
    schemaVersion: { const: 2 },
    mediaType: { type: 'string' },
    config: descriptorSchema,
    layers: { type: 'array', items: descriptorSchema },
  },
} as const;

const indexSchema = {
  $id: 'https://kata-ts.dev/schemas/oci-index.json',
  type: 'object',
  required: ['manifests'],
  properties: {
    schemaVersion: { const: 2 },
    mediaType: { type: 'string' },
    manifests: { type: 'array', items: descriptorSchema },
  },
} as const;

const validateManifest = compileOnce<ImageManifest>(manifestSchema);
const validateIndex = compileOnce<ImageIndex>(indexSchema);

function parseJson(bytes: Uint8Array, what: string): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = JSON.parse(Buffer.from(bytes).toString('utf8'));
  } catch (err) {
    throw invalid('IMAGE_MANIFEST_INVALID', `${what} is not valid JSON`, { cause: err });
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) {
    throw invalid('IMAGE_MANIFEST_INVALID', `${what} is not a JSON object`);
  }
  return doc as Record<string, unknown>;
}

function checkDescriptor(d: Descriptor, field: string): Descriptor {
  return { ...d, mediaType: d.mediaType ?? '', digest: parseDigest(d.digest, `${field}.digest`) };
}

/**
 * Classify and check a manifest document fetched from a registry. The media type comes from
 * the document's own `mediaType` when present, else from the response's Content-Type.
 */
export function parseManifestDocument(bytes: Uint8Array, contentType: string, what: string): ManifestDocument {
  const doc = parseJson(bytes, what);
  const declared = typeof doc.mediaType === 'string' ? doc.mediaType : (contentType.split(';')[0]?.trim() ?? '');
  if (declared === MEDIA_TYPES.dockerSchema1 || declared === MEDIA_TYPES.dockerSchema1Signed || doc.schemaVersion === 1) {
    throw unimplemented('IMAGE_MANIFEST_UNSUPPORTED', `${what} is a Docker schema 1 manifest, which kata-ts does not pull`);
  }
  const looksLikeIndex = INDEX_TYPES.has(declared) || (declared === '' && Array.isArray(doc.manifests));
  if (looksLikeIndex) {
    const validate = validateIndex();
    if (!validate(doc))
      throw invalid(
        'IMAGE_MANIFEST_INVALID',
        `${what} is not a valid image index: ${validate.errors?.[0]?.instancePath ?? ''} ${validate.errors?.[0]?.message ?? ''}`,
      );
    return {
      kind: 'index',
      index: { mediaType: declared, manifests: doc.manifests.map((d, i) => checkDescriptor(d, `${what} manifests[${i}]`)) },
    };
  }
  if (!MANIFEST_TYPES.has(declared) && declared !== '') {
    throw invalid('IMAGE_MANIFEST_UNSUPPORTED', `${what} has media type ${declared}, which is not an image manifest or index`);
  }
  const validate = validateManifest();
  if (!validate(doc))
    throw invalid(
      'IMAGE_MANIFEST_INVALID',
      `${what} is not a valid image manifest: ${validate.errors?.[0]?.instancePath ?? ''} ${validate.errors?.[0]?.message ?? ''}`,
    );
  const config = checkDescriptor(doc.config, `${what} config`);
  if (config.mediaType !== '' && !CONFIG_TYPES.has(config.mediaType)) {
    throw invalid('IMAGE_NOT_A_CONTAINER_IMAGE', `${what} has config media type ${config.mediaType}, so it is not a container image`);
  }
  const layers = doc.layers.map((d, i) => {
    const layer = checkDescriptor(d, `${what} layers[${i}]`);
    if (!LAYER_TYPE.test(layer.mediaType)) {
      throw invalid(
        'IMAGE_LAYER_UNSUPPORTED',
        `${what} layers[${i}] has media type ${JSON.stringify(layer.mediaType)}, which is not a filesystem layer`,
      );
    }
    return layer;
  });
  return { kind: 'manifest', manifest: { mediaType: declared || MEDIA_TYPES.ociManifest, config, layers } };
}

/**
 * Pick the manifest for `want` from an index. Entries whose platform is missing or
 * `unknown/unknown` (build attestations) never match. NOT_FOUND lists what the index offers.
 */
export function selectPlatform(index: ImageIndex, want: Platform, what: string): Descriptor {
  const candidates = index.manifests.filter(
    (d) => d.platform !== undefined && d.platform.os === want.os && d.platform.architecture === want.architecture,
  );
  const exact = candidates.find((d) => want.variant === undefined || d.platform?.variant === want.variant);
  const chosen = exact ?? candidates[0];
  if (chosen === undefined) {
    const offered = index.manifests.map((d) => (d.platform === undefined ? '?' : `${d.platform.os}/${d.platform.architecture}`));
    throw notFound(
      'IMAGE_PLATFORM_NOT_FOUND',
      `${what} has no ${want.os}/${want.architecture} image (it offers ${offered.join(', ') || 'nothing'})`,
    );
  }
  return chosen;
}

/** The parts of an image config (OCI image-spec config.md) that kata-ts reads. */
export interface ImageConfigDocument {
  architecture?: string;
  os?: string;
  config?: {
    User?: string;
    Env?: string[] | null;
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
    WorkingDir?: string;
    StopSignal?: string;
  } | null;
  rootfs: { type: string; diff_ids: string[] };
}

const imageConfigSchema = {
  $id: 'https://kata-ts.dev/schemas/oci-image-config.json',
  type: 'object',
  required: ['rootfs'],
  properties: {
    architecture: { type: 'string' },
    os: { type: 'string' },
    config: { type: ['object', 'null'], properties: { User: { type: 'string' } } },
    rootfs: {
      type: 'object',
      required: ['type', 'diff_ids'],
      properties: { type: { const: 'layers' }, diff_ids: { type: 'array', items: { type: 'string' } } },
    },
  },
} as const;

const validateImageConfig = compileOnce<ImageConfigDocument>(imageConfigSchema);

/** Parse and check an image config blob against its manifest's layer count. */
export function parseImageConfig(bytes: Uint8Array, layerCount: number, what: string): { config: ImageConfigDocument; diffIds: Digest[] } {
  const doc = parseJson(bytes, what);
  const validate = validateImageConfig();
  if (!validate(doc)) {
    throw invalid(
      'IMAGE_CONFIG_INVALID',
      `${what} is not a valid image config: ${validate.errors?.[0]?.instancePath ?? ''} ${validate.errors?.[0]?.message ?? ''}`,
    );
  }
  const diffIds = doc.rootfs.diff_ids.map((d, i) => parseDigest(d, `${what} rootfs.diff_ids[${i}]`));
  if (diffIds.length !== layerCount) {
    throw invalid('IMAGE_CONFIG_INVALID', `${what} lists ${diffIds.length} diff_ids but the manifest has ${layerCount} layers`);
  }
  return { config: doc, diffIds };
}

/**
 * The CRI's view of the config's User: a numeric user (`1000`, `1000:1000`) is a uid, a name
 * (`nobody`, `app:app`) is a username; empty means neither (the runtime default, root).
 */
export function imageUser(config: ImageConfigDocument): { uid: number | null; username: string } {
  const user = config.config?.User ?? '';
  const name = user.split(':')[0] ?? '';
  if (name === '') return { uid: null, username: '' };
  if (/^[0-9]+$/.test(name)) return { uid: Number(name), username: '' };
  return { uid: null, username: name };
}
