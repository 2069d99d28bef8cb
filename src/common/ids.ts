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

/**
 * containerd's identifier rule (`identifiers.Validate`), which the ids of its containers and
 * sandboxes follow: letters and digits in runs joined by one `.`, `_` or `-`, at most
 * MAX_IDENTIFIER_LENGTH characters. Never `.` or `..`, never a `/`: safe as a path component.
 */
export const IDENTIFIER_PATTERN = '^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$';
export const MAX_IDENTIFIER_LENGTH = 76;
const IDENTIFIER = new RegExp(IDENTIFIER_PATTERN);

export function isIdentifier(value: string): boolean {
  return value.length <= MAX_IDENTIFIER_LENGTH && IDENTIFIER.test(value);
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
