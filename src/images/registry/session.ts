import { invalid, isKataError, type KataError, notFound, unauthenticated, unavailable } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { abortReason } from '../abort.js';
import type { ImageReason } from '../reasons.js';
import { type AuthChallenge, basicHeader, type Credentials, parseWwwAuthenticate } from './auth.js';
import { type AgentPool, discardBody, type HttpResponse, readBody, sendRequest } from './http.js';

/** One place a repository can be fetched from: a mirror or the registry itself. */
export interface Endpoint {
  /** `https://registry-1.docker.io` (origin only). */
  origin: URL;
  skipTlsVerify: boolean;
  mirror: boolean;
}

export interface SessionOptions {
  /** Mirrors first, the registry itself last. */
  endpoints: Endpoint[];
  /** Registry as users name it (`docker.io`), for messages and credential matching. */
  domain: string;
  /** Repository path (`library/busybox`). */
  repository: string;
  credentials: Credentials | undefined;
  agents: AgentPool;
  /** TLS verification setting for a token realm or redirect target on another host. */
  skipTlsVerifyFor: (host: string) => boolean;
  logger: Logger;
  userAgent: string;
}

export interface FetchInit {
  accept?: string;
  signal: AbortSignal;
  /** What is fetched, for messages: `manifest latest of docker.io/library/busybox`. */
  what: string;
  /** Reason code when the registry answers 404. */
  notFoundReason: ImageReason;
}

const MAX_REDIRECTS = 5;
/** Docker's token spec: a token without expires_in lives 60 s. */
const DEFAULT_TOKEN_LIFETIME_S = 60;
const TOKEN_RESPONSE_LIMIT_BYTES = 1024 * 1024;
const ERROR_BODY_LIMIT_BYTES = 64 * 1024;
const FALLBACK_KINDS = new Set<string>(['not_found', 'unavailable', 'unauthenticated']);

interface CachedAuth {
  header: string;
  expiresAtMs: number;
}

/**
 * Requests for one repository during one pull: endpoint fallback (mirrors, then the registry),
 * the distribution auth dance (401 -> WWW-Authenticate -> Bearer token or Basic), redirects (blob
 * storage backends), and registry error statuses turned into KataErrors.
 */
export class RegistrySession {
  private preferred = 0;
  private readonly authByOrigin = new Map<string, CachedAuth>();

  constructor(private readonly opts: SessionOptions) {}

  /** GET `/v2/<repository>/<subpath>` from the first endpoint that has it. */
  async get(subpath: string, init: FetchInit): Promise<HttpResponse> {
    const order = this.opts.endpoints.map((_, i) => i);
    order.splice(order.indexOf(this.preferred), 1);
    order.unshift(this.preferred);
    let upstreamError: unknown;
    let lastError: unknown;
    for (const index of order) {
      const endpoint = this.opts.endpoints[index];
      if (endpoint === undefined) continue;
      try {
        const res = await this.getFrom(endpoint, subpath, init);
        this.preferred = index;
        return res;
      } catch (err) {
        if (init.signal.aborted) throw abortReason(init.signal);
        // Only "this endpoint cannot help" errors move on; a corrupt or refused document does not.
        if (!isKataError(err) || !FALLBACK_KINDS.has(err.kind)) throw err;
        if (!endpoint.mirror) upstreamError = err;
        lastError = err;
        this.opts.logger.debug({ endpoint: endpoint.origin.host, err: err.message }, 'registry endpoint failed, trying the next one');
      }
    }
    // The registry's own answer explains best; a mirror's only when the registry was not asked.
    throw upstreamError ?? lastError ?? unavailable('IMAGE_REGISTRY_UNREACHABLE', `no endpoint serves ${this.opts.domain}`);
  }

  private credentialsFor(endpoint: Endpoint): Credentials | undefined {
    const c = this.opts.credentials;
    if (c === undefined) return undefined;
    // Credentials follow the registry they were issued for: a mirror only gets them when they
    // name the mirror itself, so a pull through a mirror never leaks the upstream password.
    if (c.serverHost === undefined) return endpoint.mirror ? undefined : c;
    if (c.serverHost === endpoint.origin.host) return c;
    if (!endpoint.mirror && c.serverHost === this.opts.domain) return c;
    return undefined;
  }

  private async getFrom(endpoint: Endpoint, subpath: string, init: FetchInit): Promise<HttpResponse> {
    const url = new URL(`/v2/${this.opts.repository}/${subpath}`, endpoint.origin);
    const headers: Record<string, string> = { 'User-Agent': this.opts.userAgent };
    if (init.accept !== undefined) headers.Accept = init.accept;
    const creds = this.credentialsFor(endpoint);
    let auth = this.cachedAuth(endpoint);
    if (auth === undefined && creds?.registryToken !== undefined) auth = `Bearer ${creds.registryToken}`;
    let res = await this.follow(url, endpoint, auth, headers, init.signal);
    if (res.status === 401) {
      const challenges = parseWwwAuthenticate(String(res.headers['www-authenticate'] ?? ''));
      discardBody(res);
      const fresh = await this.authorize(endpoint, challenges, creds, init);
      res = await this.follow(url, endpoint, fresh.header, headers, init.signal);
      if (res.status === 401) {
        discardBody(res);
        throw unauthenticated(
          'IMAGE_REGISTRY_UNAUTHORIZED',
          `registry ${endpoint.origin.host} refused ${fresh.withCredentials ? 'the credentials' : 'anonymous access'} for ${init.what}`,
        );
      }
      this.authByOrigin.set(endpoint.origin.origin, { header: fresh.header, expiresAtMs: fresh.expiresAtMs });
    }
    if (res.status >= 200 && res.status < 300) return res;
    throw await this.statusError(res, endpoint, init);
  }

  private cachedAuth(endpoint: Endpoint): string | undefined {
    const cached = this.authByOrigin.get(endpoint.origin.origin);
    if (cached === undefined || cached.expiresAtMs <= Date.now()) return undefined;
    return cached.header;
  }

  /** Send, following redirects; Authorization is dropped when a redirect leaves the origin. */
  private async follow(
    start: URL,
    endpoint: Endpoint,
    auth: string | undefined,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<HttpResponse> {
    let url = start;
    for (let hop = 0; hop <= MAX_REDIRECTS; hop++) {
      const sameOrigin = url.origin === endpoint.origin.origin;
      const h = { ...headers };
      if (auth !== undefined && sameOrigin) h.Authorization = auth;
      const skipTlsVerify = sameOrigin ? endpoint.skipTlsVerify : this.opts.skipTlsVerifyFor(url.host);
      const res = await sendRequest(url, { headers: h, signal, skipTlsVerify }, this.opts.agents);
      const location = res.headers.location;
      if ([301, 302, 303, 307, 308].includes(res.status) && location !== undefined) {
        discardBody(res);
        url = new URL(location, url);
        continue;
      }
      return res;
    }
    throw unavailable('IMAGE_REGISTRY_REDIRECT_LOOP', `registry ${endpoint.origin.host} redirected more than ${MAX_REDIRECTS} times`);
  }

  private async authorize(
    endpoint: Endpoint,
    challenges: AuthChallenge[],
    creds: Credentials | undefined,
    init: FetchInit,
  ): Promise<{ header: string; expiresAtMs: number; withCredentials: boolean }> {
    const bearer = challenges.find((c) => c.scheme === 'bearer' && c.params.realm !== undefined);
    if (bearer !== undefined) return this.fetchToken(endpoint, bearer, creds, init);
    const basic = challenges.find((c) => c.scheme === 'basic');
    if (basic !== undefined && creds?.basic !== undefined) {
      return {
        header: basicHeader(creds.basic.username, creds.basic.password),
        expiresAtMs: Number.MAX_SAFE_INTEGER,
        withCredentials: true,
      };
    }
    throw unauthenticated('IMAGE_REGISTRY_AUTH_REQUIRED', `registry ${endpoint.origin.host} requires credentials for ${init.what}`);
  }

  /** Docker token spec: GET realm?service&scope (Basic auth when we have a password) or OAuth2 POST with a refresh token. */
  private async fetchToken(
    endpoint: Endpoint,
    challenge: AuthChallenge,
    creds: Credentials | undefined,
    init: FetchInit,
  ): Promise<{ header: string; expiresAtMs: number; withCredentials: boolean }> {
    let realm: URL;
    try {
      realm = new URL(challenge.params.realm ?? '');
    } catch {
      throw unavailable('IMAGE_REGISTRY_AUTH_BROKEN', `registry ${endpoint.origin.host} announced an invalid token realm`);
    }
    const service = challenge.params.service;
    const scope = challenge.params.scope ?? `repository:${this.opts.repository}:pull`;
    const headers: Record<string, string> = { 'User-Agent': this.opts.userAgent, Accept: 'application/json' };
    const withCredentials = creds?.identityToken !== undefined || creds?.basic !== undefined;
    let body: string | undefined;
    if (creds?.identityToken !== undefined) {
      const form = new URLSearchParams({ grant_type: 'refresh_token', refresh_token: creds.identityToken, client_id: 'kata-ts', scope });
      if (service !== undefined) form.set('service', service);
      body = form.toString();
      headers['Content-Type'] = 'application/x-www-form-urlencoded';
    } else {
      if (service !== undefined) realm.searchParams.set('service', service);
      realm.searchParams.set('scope', scope);
      if (creds?.basic !== undefined) headers.Authorization = basicHeader(creds.basic.username, creds.basic.password);
    }
    const res = await sendRequest(
      realm,
      {
        method: body === undefined ? 'GET' : 'POST',
        headers,
        body,
        signal: init.signal,
        skipTlsVerify: this.opts.skipTlsVerifyFor(realm.host),
      },
      this.opts.agents,
    );
    if (res.status === 401 || res.status === 403) {
      discardBody(res);
      throw unauthenticated(
        'IMAGE_REGISTRY_UNAUTHORIZED',
        `token service ${realm.host} refused ${withCredentials ? 'the credentials' : 'anonymous access'} for ${init.what}`,
      );
    }
    if (res.status !== 200) {
      discardBody(res);
      throw unavailable('IMAGE_REGISTRY_AUTH_BROKEN', `token service ${realm.host} answered HTTP ${res.status} for ${init.what}`);
    }
    const text = (await readBody(res, TOKEN_RESPONSE_LIMIT_BYTES, 'token response', init.signal)).toString('utf8');
    let parsed: { token?: unknown; access_token?: unknown; expires_in?: unknown };
    try {
      parsed = JSON.parse(text) as typeof parsed;
    } catch (err) {
      throw unavailable('IMAGE_REGISTRY_AUTH_BROKEN', `token service ${realm.host} answered something that is not JSON`, { cause: err });
    }
    const token = typeof parsed.token === 'string' && parsed.token !== '' ? parsed.token : parsed.access_token;
    if (typeof token !== 'string' || token === '') {
      throw unavailable('IMAGE_REGISTRY_AUTH_BROKEN', `token service ${realm.host} answered without a token`);
    }
    const lifetimeS = typeof parsed.expires_in === 'number' && parsed.expires_in > 0 ? parsed.expires_in : DEFAULT_TOKEN_LIFETIME_S;
    // Renew a little early so a token never expires between check and use.
    return { header: `Bearer ${token}`, expiresAtMs: Date.now() + Math.max(lifetimeS - 5, 1) * 1000, withCredentials };
  }

  private async statusError(res: HttpResponse, endpoint: Endpoint, init: FetchInit): Promise<KataError> {
    let code = '';
    try {
      const body = await readBody(res, ERROR_BODY_LIMIT_BYTES, 'error body', init.signal);
      const parsed = JSON.parse(body.toString('utf8')) as { errors?: Array<{ code?: unknown }> };
      const first = parsed.errors?.[0]?.code;
      if (typeof first === 'string') code = ` (${first})`;
    } catch {
      discardBody(res);
    }
    const host = endpoint.origin.host;
    switch (res.status) {
      case 404:
        return notFound(init.notFoundReason, `${init.what} was not found on registry ${host}${code}`);
      case 403:
        return unauthenticated('IMAGE_REGISTRY_DENIED', `registry ${host} denied access to ${init.what}${code}`);
      case 429:
        return unavailable('IMAGE_REGISTRY_RATE_LIMITED', `registry ${host} is rate-limiting requests for ${init.what}${code}`);
      case 400:
        return invalid('IMAGE_REGISTRY_REJECTED', `registry ${host} rejected the request for ${init.what}${code}`);
      default:
        return unavailable('IMAGE_REGISTRY_ERROR', `registry ${host} answered HTTP ${res.status} for ${init.what}${code}`);
    }
  }
}
