/**
 * Names of broker resources: `<repository>/<type>/<tag>`, the path under
 * `/kbs/v0/resource/` of trustee's KBS protocol, and the `kbs:///<repository>/<type>/<tag>` URIs
 * Confidential Containers' guest components use to name one in a pod's configuration.
 *
 * The grammar is trustee's (its resource storage's ResourceDesc): three segments, each made of
 * ASCII letters, digits, `_`, `-` and `.`, not starting with `.`. That alone rules out `.`, `..`
 * and empty segments; kata-ts adds a length cap so a name is a bounded file name in the broker's
 * state directory.
 */
import { invalid } from '../common/errors.js';
import './reasons.js';

/** One segment: trustee's character set; the first character is not a dot. */
const SEGMENT = /^[A-Za-z0-9_-][A-Za-z0-9_.-]*$/;
/** Longest segment kata-ts accepts, in characters (a file name in the broker's state dir). */
export const RESOURCE_SEGMENT_MAX_CHARS = 100;
/** Longest whole path: three segments and two slashes. */
export const RESOURCE_PATH_MAX_CHARS = 3 * RESOURCE_SEGMENT_MAX_CHARS + 2;
/** Longest `kbs://` URI accepted (host part included). */
export const RESOURCE_URI_MAX_CHARS = 1024;

/** The endpoint prefix resources are read from. */
export const KBS_RESOURCE_PREFIX = '/kbs/v0/resource/';

export interface ResourcePath {
  repository: string;
  type: string;
  tag: string;
}

const SEGMENT_NAMES = ['repository', 'type', 'tag'] as const;

/**
 * Parses `<repository>/<type>/<tag>`; throws ATTEST_RESOURCE_PATH_INVALID naming the segment.
 * `field` names where the path came from, for the message.
 */
export function parseResourcePath(text: string, field = 'resource path'): ResourcePath {
  if (typeof text !== 'string') throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} must be a string`);
  if (text.length > RESOURCE_PATH_MAX_CHARS)
    throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} is ${text.length} characters, over ${RESOURCE_PATH_MAX_CHARS}`);
  const parts = text.split('/');
  if (parts.length !== 3)
    throw invalid(
      'ATTEST_RESOURCE_PATH_INVALID',
      `${field} ${JSON.stringify(text)} must be <repository>/<type>/<tag> (3 segments, got ${parts.length})`,
    );
  parts.forEach((part, i) => {
    const name = SEGMENT_NAMES[i];
    if (part.length === 0) throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} ${JSON.stringify(text)} has an empty ${name}`);
    if (part.length > RESOURCE_SEGMENT_MAX_CHARS)
      throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field}'s ${name} is ${part.length} characters, over ${RESOURCE_SEGMENT_MAX_CHARS}`);
    if (!SEGMENT.test(part))
      throw invalid(
        'ATTEST_RESOURCE_PATH_INVALID',
        `${field}'s ${name} ${JSON.stringify(part)} must be letters, digits, '_', '-' or '.' and not start with '.'`,
      );
  });
  return { repository: parts[0] as string, type: parts[1] as string, tag: parts[2] as string };
}

/** Whether `text` is a valid resource path (no error). */
export function isResourcePath(text: string): boolean {
  try {
    parseResourcePath(text);
    return true;
  } catch {
    return false;
  }
}

/** The canonical text of a path. */
export function formatResourcePath(path: ResourcePath): string {
  return `${path.repository}/${path.type}/${path.tag}`;
}

/** The URL path a guest GETs for a resource. */
export function resourceUrlPath(path: ResourcePath): string {
  return `${KBS_RESOURCE_PREFIX}${formatResourcePath(path)}`;
}

/** A parsed `kbs://` URI: the path, and the authority it named (null for `kbs:///...`). */
export interface ResourceUri {
  /** `host:port` as written, or null. Informational: the broker a guest asks is its initdata's. */
  authority: string | null;
  path: ResourcePath;
}

// The authority of `kbs://host:port/...` as CoCo writes it: a DNS name, an IPv4 address or a
// bracketed IPv6 address, and an optional port.
const AUTHORITY = /^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$/;

/**
 * Parses `kbs:///<repository>/<type>/<tag>` or `kbs://<host>[:port]/<repository>/<type>/<tag>`;
 * throws ATTEST_RESOURCE_PATH_INVALID. No query, fragment or percent-encoding is accepted: a
 * resource name never needs one, and decoding would let `%2e%2e` through as `..`.
 */
export function parseResourceUri(text: string, field = 'resource URI'): ResourceUri {
  if (typeof text !== 'string') throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} must be a string`);
  if (text.length > RESOURCE_URI_MAX_CHARS)
    throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} is ${text.length} characters, over ${RESOURCE_URI_MAX_CHARS}`);
  if (!text.startsWith('kbs://')) throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} ${JSON.stringify(text)} must start with kbs://`);
  if (/[?#%]/.test(text)) throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} ${JSON.stringify(text)} must not carry '?', '#' or '%'`);
  const rest = text.slice('kbs://'.length);
  const slash = rest.indexOf('/');
  if (slash < 0) throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field} ${JSON.stringify(text)} names no resource`);
  const authorityText = rest.slice(0, slash);
  if (authorityText !== '') {
    const port = /:([0-9]+)$/.exec(authorityText)?.[1];
    if (!AUTHORITY.test(authorityText) || (port !== undefined && Number(port) > 65535))
      throw invalid('ATTEST_RESOURCE_PATH_INVALID', `${field}'s host ${JSON.stringify(authorityText)} is not host[:port]`);
  }
  return { authority: authorityText === '' ? null : authorityText, path: parseResourcePath(rest.slice(slash + 1), field) };
}

/** The `kbs:///...` URI of a path. */
export function formatResourceUri(path: ResourcePath): string {
  return `kbs:///${formatResourcePath(path)}`;
}
