import { invalid } from '../common/errors.js';
import { type Digest, parseDigest } from './digest.js';

/**
 * A parsed image reference, following the Docker/OCI distribution grammar:
 * `[domain[:port]/]path[:tag][@digest]`.
 */
export interface ImageReference {
  /** Registry as users name it: `docker.io`, `quay.io`, `localhost:5000`, `[::1]:5000`. */
  domain: string;
  /** Repository path inside the registry: `library/busybox`. */
  path: string;
  /** The tag; `latest` when neither a tag nor a digest was written. */
  tag: string | undefined;
  digest: Digest | undefined;
}

export const DEFAULT_DOMAIN = 'docker.io';
const LEGACY_DEFAULT_DOMAIN = 'index.docker.io';
/** Docker Hub's API host: `docker.io` itself serves no registry API. */
const DOCKER_HUB_API_HOST = 'registry-1.docker.io';
const OFFICIAL_NAMESPACE = 'library';
export const DEFAULT_TAG = 'latest';

// One path component: lowercase alphanumerics joined by `.`, `_`, `__` or runs of `-`.
const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[\w][\w.-]{0,127}$/;
// A domain: DNS labels joined by dots (or a bracketed IPv6 address), with an optional port.
const DOMAIN =
  /^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?$/;
const MAX_NAME_LENGTH = 255;
const HEX64 = /^[a-f0-9]{64}$/;

/**
 * Parse an image reference the way containerd and CRI-O do (Docker's normalisation): a first
 * component without `.` or `:` that is not `localhost` is a Docker Hub path; single-component Hub
 * paths gain `library/`; no tag and no digest means `:latest`. With both a tag and a digest the
 * digest decides what is pulled and the tag is dropped, as containerd's CRI plugin does.
 *
 * Throws INVALID (reason IMAGE_REFERENCE_INVALID) naming `field` and the offending part.
 */
export function parseReference(input: string, field = 'image'): ImageReference {
  const bad = (why: string): never => {
    throw invalid('IMAGE_REFERENCE_INVALID', `${field} ${JSON.stringify(input.slice(0, 300))} is not a valid image reference: ${why}`);
  };
  if (input === '') bad('it is empty');
  if (input !== input.trim() || /\s/.test(input)) bad('it contains whitespace');
  if (HEX64.test(input)) bad('a 64-hex string is an image id, not a name');

  let rest = input;
  let digest: Digest | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    const digestText = rest.slice(at + 1);
    rest = rest.slice(0, at);
    try {
      digest = parseDigest(digestText, `${field} digest`);
    } catch (err) {
      throw invalid(
        'IMAGE_REFERENCE_INVALID',
        `${field} ${JSON.stringify(input)} has an invalid digest ${JSON.stringify(digestText.slice(0, 80))}`,
        { cause: err },
      );
    }
  }

  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const lastColon = rest.lastIndexOf(':');
  if (lastColon > lastSlash) {
    tag = rest.slice(lastColon + 1);
    rest = rest.slice(0, lastColon);
    if (!TAG.test(tag)) bad(`tag ${JSON.stringify(tag.slice(0, 140))} must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`);
  }
  if (rest === '') bad('the repository name is empty');

  let domain: string = DEFAULT_DOMAIN;
  let path = rest;
  const firstSlash = rest.indexOf('/');
  if (firstSlash >= 0) {
    const first = rest.slice(0, firstSlash);
    if (first.includes('.') || first.includes(':') || first === 'localhost' || first !== first.toLowerCase()) {
      domain = first;
      path = rest.slice(firstSlash + 1);
      if (!DOMAIN.test(domain)) bad(`registry ${JSON.stringify(domain)} is not a host[:port]`);
    }
  }
  if (domain === LEGACY_DEFAULT_DOMAIN) domain = DEFAULT_DOMAIN;
  if (domain === DEFAULT_DOMAIN && !path.includes('/')) path = `${OFFICIAL_NAMESPACE}/${path}`;

  for (const component of path.split('/')) {
    if (!PATH_COMPONENT.test(component)) {
      bad(`path component ${JSON.stringify(component)} must be lowercase letters and digits joined by '.', '_', '__' or '-'`);
    }
  }
  if (domain.length + 1 + path.length > MAX_NAME_LENGTH) bad(`the name is longer than ${MAX_NAME_LENGTH} characters`);

  if (digest !== undefined) tag = undefined;
  else if (tag === undefined) tag = DEFAULT_TAG;
  return { domain, path, tag, digest };
}

/** `docker.io/library/busybox`: the repository as CRI runtimes report it. */
export function repositoryOf(ref: ImageReference): string {
  return `${ref.domain}/${ref.path}`;
}

/** `docker.io/library/busybox:latest`, or undefined for a digest-only reference. */
export function repoTagOf(ref: ImageReference): string | undefined {
  return ref.tag === undefined ? undefined : `${repositoryOf(ref)}:${ref.tag}`;
}

/** `docker.io/library/busybox@sha256:...` for the given manifest (or index) digest. */
export function repoDigestOf(ref: ImageReference, digest: Digest): string {
  return `${repositoryOf(ref)}@${digest}`;
}

/** The full normalised reference: `repo:tag` or `repo@digest`. */
export function formatReference(ref: ImageReference): string {
  if (ref.digest !== undefined) return repoDigestOf(ref, ref.digest);
  return `${repositoryOf(ref)}:${ref.tag ?? DEFAULT_TAG}`;
}

/** What to ask the registry's manifest endpoint for: the digest when known, else the tag. */
export function manifestReferenceOf(ref: ImageReference): string {
  return ref.digest ?? ref.tag ?? DEFAULT_TAG;
}

/** The host (with port) that serves the distribution API for `domain`. */
export function registryApiHost(domain: string): string {
  return domain === DEFAULT_DOMAIN ? DOCKER_HUB_API_HOST : domain;
}

/**
 * True when `input` names a repository without a tag or digest (`busybox`, `quay.io/x/y`), which
 * ListImages filters treat as "every tag of that repository".
 */
export function isBareRepository(input: string): boolean {
  if (input.includes('@')) return false;
  const lastSlash = input.lastIndexOf('/');
  return input.lastIndexOf(':') <= lastSlash;
}
