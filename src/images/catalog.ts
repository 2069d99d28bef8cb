import { resolveIdPrefix } from '../common/ids.js';
import type { ImageMessage } from './cri-types.js';
import { isDigest } from './digest.js';
import { type ImageReference, isBareRepository, parseReference, repoDigestOf, repositoryOf, repoTagOf } from './reference.js';
import type { ImageRecord, LayerRecord } from './store/records.js';

/** How a lookup string matched, for logs and for untagging. */
export type ImageMatch =
  | { by: 'id'; record: ImageRecord }
  | { by: 'tag'; record: ImageRecord; name: string }
  | { by: 'digest'; record: ImageRecord; name: string };

function tryParse(input: string): ImageReference | undefined {
  try {
    return parseReference(input);
  } catch {
    return undefined;
  }
}

/**
 * Find the image `input` names, the ways crictl and the kubelet name images: a full id
 * (`sha256:<hex>` or bare hex), a repo tag (`busybox`, `docker.io/library/busybox:latest`), a
 * repo digest (`busybox@sha256:...`), or a unique id prefix (`3f57d9401f8d`, as crictl prints).
 * A name wins over an id prefix that would also match.
 */
export function lookupImage(records: readonly ImageRecord[], input: string): ImageMatch | undefined {
  const text = input.trim();
  if (text === '') return undefined;
  const fullId = isDigest(text) ? text : /^[a-f0-9]{64}$/.test(text) ? `sha256:${text}` : undefined;
  if (fullId !== undefined) {
    const record = records.find((r) => r.id === fullId);
    if (record !== undefined) return { by: 'id', record };
  }
  const ref = tryParse(text);
  if (ref !== undefined) {
    if (ref.digest !== undefined) {
      const name = repoDigestOf(ref, ref.digest);
      const record = records.find((r) => r.repoDigests.includes(name));
      if (record !== undefined) return { by: 'digest', record, name };
    } else {
      const name = repoTagOf(ref) as string;
      const record = records.find((r) => r.repoTags.includes(name));
      if (record !== undefined) return { by: 'tag', record, name };
    }
  }
  const prefix = /^(?:sha256:)?([a-f0-9]{1,64})$/.exec(text)?.[1];
  if (prefix !== undefined) {
    const id = resolveIdPrefix(
      prefix,
      records.map((r) => r.id.slice('sha256:'.length)),
    );
    const record = id === undefined ? undefined : records.find((r) => r.id === `sha256:${id}`);
    if (record !== undefined) return { by: 'id', record };
  }
  return undefined;
}

/**
 * ListImages' filter: empty lists everything; a bare repository (`busybox`, no tag or digest
 * written) lists every tag of it, as `docker images busybox` does; anything else lists the one
 * image it names, if any.
 */
export function filterImages(records: readonly ImageRecord[], filter: string): ImageRecord[] {
  const text = filter.trim();
  if (text === '') return [...records];
  if (isBareRepository(text)) {
    const ref = tryParse(text);
    if (ref !== undefined) {
      const prefix = `${repositoryOf(ref)}:`;
      const tagged = records.filter(
        (r) => r.repoTags.some((t) => t.startsWith(prefix)) || r.repoDigests.some((d) => d.startsWith(`${repositoryOf(ref)}@`)),
      );
      if (tagged.length > 0) return tagged;
    }
  }
  const match = lookupImage(records, text);
  return match === undefined ? [] : [match.record];
}

/** The CRI Image message for a record (size and uid as decimal strings, as proto-loader expects). */
export function toImageMessage(record: ImageRecord): ImageMessage {
  return {
    id: record.id,
    repo_tags: [...record.repoTags],
    repo_digests: [...record.repoDigests],
    size: String(record.sizeBytes),
    uid: record.uid === null ? null : { value: String(record.uid) },
    username: record.username,
    spec: { image: record.id, annotations: { ...record.annotations }, user_specified_image: '', runtime_handler: '', image_ref: '' },
    pinned: record.pinned,
  };
}

/** The names a pull of `ref` adds: its repo tag (unless pulled by digest) and its repo digest. */
export function namesFromPull(ref: ImageReference, topDigest: string): { tag: string | undefined; digest: string } {
  return { tag: repoTagOf(ref), digest: repoDigestOf(ref, topDigest as `sha256:${string}`) };
}

/** What a finished fetch contributes to the index (a subset of the pull's FetchedImage). */
export interface PulledImageFacts {
  id: `sha256:${string}`;
  manifestDigest: `sha256:${string}`;
  manifestMediaType: string;
  layers: LayerRecord[];
  sizeBytes: number;
  uid: number | null;
  username: string;
  /** How this pull unpacked it (a re-pull in overlay mode turns a flat image into a layered one). */
  unpacked: ImageRecord['unpacked'];
}

/**
 * The image list after a pull (pure): the image's record is added or updated, the pulled tag
 * moves to it from whichever image held it (a tag names one image), its repo digest is added,
 * and `pinned` is recomputed from the pinned references.
 */
export function recordsAfterPull(
  current: readonly ImageRecord[],
  pulled: PulledImageFacts,
  names: { tag: string | undefined; digest: string },
  annotations: Record<string, string>,
  pinnedRefs: ReadonlySet<string>,
  now: Date,
): { records: ImageRecord[]; record: ImageRecord } {
  const records = current.map((r) => ({ ...r, repoTags: [...r.repoTags], repoDigests: [...r.repoDigests] }));
  let record = records.find((r) => r.id === pulled.id);
  if (record === undefined) {
    record = {
      id: pulled.id,
      repoTags: [],
      repoDigests: [],
      manifestDigest: pulled.manifestDigest,
      manifestMediaType: pulled.manifestMediaType,
      layers: pulled.layers,
      sizeBytes: pulled.sizeBytes,
      uid: pulled.uid,
      username: pulled.username,
      pinned: false,
      annotations,
      pulledAt: now.toISOString(),
      unpacked: pulled.unpacked,
    };
    records.push(record);
  } else {
    if (Object.keys(annotations).length > 0) record.annotations = annotations;
    record.unpacked = pulled.unpacked;
  }
  const tag = names.tag;
  if (tag !== undefined) {
    for (const other of records) if (other !== record) other.repoTags = other.repoTags.filter((t) => t !== tag);
    if (!record.repoTags.includes(tag)) record.repoTags.push(tag);
  }
  if (!record.repoDigests.includes(names.digest)) record.repoDigests.push(names.digest);
  for (const r of records) r.pinned = r.repoTags.some((t) => pinnedRefs.has(t)) || r.repoDigests.some((d) => pinnedRefs.has(d));
  return { records, record };
}
