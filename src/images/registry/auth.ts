import { invalid } from '../../common/errors.js';
import type { AuthConfigInput } from '../cri-types.js';
import { DEFAULT_DOMAIN } from '../reference.js';

/** Credentials for one pull, decoded from the CRI AuthConfig. */
export interface Credentials {
  basic: { username: string; password: string } | undefined;
  /** OAuth2 refresh token to exchange at the token endpoint (docker's identitytoken). */
  identityToken: string | undefined;
  /** A bearer token to send to the registry directly. */
  registryToken: string | undefined;
  /** Registry host these credentials belong to (normalised), or undefined for "the image's registry". */
  serverHost: string | undefined;
}

/**
 * Decode a CRI AuthConfig. `auth` (base64 `user:password`) is used when username/password are
 * empty, as docker does. Returns undefined when the config carries no credential at all.
 */
export function credentialsFromAuthConfig(auth: AuthConfigInput | null | undefined): Credentials | undefined {
  if (auth === null || auth === undefined) return undefined;
  let basic: Credentials['basic'];
  if ((auth.username ?? '') !== '' || (auth.password ?? '') !== '') {
    basic = { username: auth.username ?? '', password: auth.password ?? '' };
  } else if ((auth.auth ?? '') !== '') {
    const text = auth.auth ?? '';
    const decoded = /^[A-Za-z0-9+/]*={0,2}$/.test(text) ? Buffer.from(text, 'base64').toString('utf8') : '';
    const colon = decoded.indexOf(':');
    if (colon <= 0) {
      throw invalid('IMAGE_AUTH_INVALID', 'auth.auth must be base64 of "username:password"');
    }
    basic = { username: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
  }
  const identityToken = token(auth.identity_token, 'auth.identity_token');
  const registryToken = token(auth.registry_token, 'auth.registry_token');
  if (basic === undefined && identityToken === undefined && registryToken === undefined) return undefined;
  return { basic, identityToken, registryToken, serverHost: normaliseServerAddress(auth.server_address ?? '') };
}

/**
 * A token travels in an HTTP header (`Bearer <token>`) or form: only visible ASCII can, and a
 * CR/LF must never reach a header. Refused here rather than as an INTERNAL from node's http.
 */
function token(v: string | undefined, field: string): string | undefined {
  if (v === undefined || v === '') return undefined;
  if (!/^[\x21-\x7e]+$/.test(v)) throw invalid('IMAGE_AUTH_INVALID', `${field} must be visible ASCII characters only`);
  return v;
}

/**
 * `https://index.docker.io/v1/` -> `docker.io`, `http://127.0.0.1:5000/` -> `127.0.0.1:5000`:
 * kubelet and docker config files name registries in several spellings.
 */
export function normaliseServerAddress(address: string): string | undefined {
  if (address === '') return undefined;
  let host = address.replace(/^[a-z]+:\/\//i, '');
  const slash = host.indexOf('/');
  if (slash >= 0) host = host.slice(0, slash);
  host = host.toLowerCase();
  if (host === 'index.docker.io' || host === 'registry-1.docker.io' || host === 'registry.hub.docker.com') return DEFAULT_DOMAIN;
  return host;
}

/** One challenge of a WWW-Authenticate header. */
export interface AuthChallenge {
  /** Lower-cased: `bearer`, `basic`. */
  scheme: string;
  params: Record<string, string>;
}

/**
 * Parse a WWW-Authenticate header (RFC 7235): challenges are `scheme param=value, ...` where a
 * value is a token or a quoted string with backslash escapes; a new challenge starts where a bare
 * token is not followed by `=`.
 */
export function parseWwwAuthenticate(header: string): AuthChallenge[] {
  const out: AuthChallenge[] = [];
  let i = 0;
  const n = header.length;
  const skipSpace = (): void => {
    while (i < n && (header[i] === ' ' || header[i] === '\t')) i++;
  };
  const readToken = (): string => {
    const start = i;
    while (i < n && !/[\s,=]/.test(header[i] ?? '')) i++;
    return header.slice(start, i);
  };
  let current: AuthChallenge | undefined;
  while (i < n) {
    skipSpace();
    if (header[i] === ',') {
      i++;
      continue;
    }
    const token = readToken();
    if (token === '') {
      i++;
      continue;
    }
    skipSpace();
    if (header[i] === '=' && current !== undefined) {
      i++;
      skipSpace();
      let value = '';
      if (header[i] === '"') {
        i++;
        while (i < n && header[i] !== '"') {
          if (header[i] === '\\' && i + 1 < n) i++;
          value += header[i];
          i++;
        }
        i++;
      } else {
        value = readToken();
      }
      current.params[token.toLowerCase()] = value;
    } else {
      current = { scheme: token.toLowerCase(), params: {} };
      out.push(current);
    }
  }
  return out;
}

export function basicHeader(username: string, password: string): string {
  return `Basic ${Buffer.from(`${username}:${password}`, 'utf8').toString('base64')}`;
}
