import { createHash } from 'node:crypto';
import { v4 as uuidv4 } from 'uuid';

/**
 * A 64-hex-character object id, the shape containerd and CRI-O use for sandbox and container ids
 * (crictl shows the first 13 characters), built from two random UUIDs.
 */
export function newObjectId(): string {
  return (uuidv4() + uuidv4()).replace(/-/g, '');
}

const OBJECT_ID = /^[0-9a-f]{64}$/;

export function isObjectId(value: string): boolean {
  return OBJECT_ID.test(value);
}

/** The longest id containerd accepts (its `identifiers` package). */
export const CALLER_ID_MAX_LENGTH = 76;

/**
 * containerd's identifier rule (`pkg/identifiers`): letters and digits, in runs separated by one
 * `.`, `_` or `-` each, at most CALLER_ID_MAX_LENGTH characters. An object id is one; so is what
 * `ctr run` users type. Such an id is a single path component, a unit name and a file name as is.
 * As a JSON Schema pattern (records), with the length checked apart.
 */
export const CALLER_ID_PATTERN = '^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$';
const CALLER_ID = new RegExp(CALLER_ID_PATTERN);

/** Whether a caller-chosen id (a face passing containerd's) follows containerd's identifier rule. */
export function isCallerId(value: string): boolean {
  return value.length <= CALLER_ID_MAX_LENGTH && CALLER_ID.test(value);
}

/**
 * Sixteen hex digits that stand for an id where there is little room (a work dir under which unix
 * sockets must fit sun_path's 108 bytes, a network namespace name): an object id's own first 16
 * (random, so as unique as 64 random bits), any other id's sha256's first 16 (a caller's ids may
 * share long prefixes: `pod-sandbox-0001`, `pod-sandbox-0002`).
 */
export function shortIdKey(id: string): string {
  return isObjectId(id) ? id.slice(0, 16) : createHash('sha256').update(id).digest('hex').slice(0, 16);
}

/**
 * Resolve a possibly truncated id (as crictl accepts) against known ids: an exact match wins,
 * otherwise a unique prefix. Returns undefined when nothing or more than one id matches.
 */
export function resolveIdPrefix(prefix: string, known: Iterable<string>): string | undefined {
  if (prefix === '') return undefined;
  let found: string | undefined;
  for (const id of known) {
    if (id === prefix) return id;
    if (id.startsWith(prefix)) {
      if (found !== undefined) return undefined;
      found = id;
    }
  }
  return found;
}
