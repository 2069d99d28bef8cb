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
