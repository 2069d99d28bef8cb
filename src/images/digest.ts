import { createHash } from 'node:crypto';
import { invalid } from '../common/errors.js';

/** A content digest in the only algorithm kata-ts stores: `sha256:<64 lowercase hex>`. */
export type Digest = `sha256:${string}`;

const SHA256_DIGEST = /^sha256:[a-f0-9]{64}$/;
/** The OCI digest grammar (algorithm ":" encoded), to tell "unsupported" from "malformed". */
const ANY_DIGEST = /^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$/;

export function isDigest(value: string): value is Digest {
  return SHA256_DIGEST.test(value);
}

/**
 * Check a digest read from a manifest, an index or a request. Other algorithms (sha512) are
 * valid OCI but refused: the store addresses blobs by sha256 only.
 */
export function parseDigest(value: string, field: string): Digest {
  if (isDigest(value)) return value;
  if (ANY_DIGEST.test(value) && !value.startsWith('sha256:')) {
    throw invalid('IMAGE_DIGEST_UNSUPPORTED', `${field} uses digest algorithm ${value.split(':')[0]}, only sha256 is supported`);
  }
  throw invalid('IMAGE_DIGEST_INVALID', `${field} is not a sha256 digest: ${JSON.stringify(value.slice(0, 80))}`);
}

/** The hex part of a sha256 digest. */
export function digestHex(digest: Digest): string {
  return digest.slice('sha256:'.length);
}

export function sha256Digest(data: Uint8Array | string): Digest {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}
