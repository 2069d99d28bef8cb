import http, { type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import https from 'node:https';
import { exhausted, isKataError, unavailable } from '../../common/errors.js';
import { abortReason } from '../abort.js';

/** A response whose body has not been read yet. */
export interface HttpResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: IncomingMessage;
  /** The URL this response came from (after redirects, when the caller followed them). */
  url: URL;
}

export interface HttpRequestInit {
  method?: 'GET' | 'HEAD' | 'POST';
  headers?: Record<string, string>;
  body?: string;
  signal: AbortSignal;
  /** Accept any certificate (registries marked skipTlsVerify). */
  skipTlsVerify: boolean;
}

/** Idle time after which a registry connection counts as dead: no bytes for this long. */
export const SOCKET_IDLE_TIMEOUT_MS = 60_000;

/**
 * Keep-alive agents for one client, one per (protocol, TLS verification) pair, so a pull reuses
 * its connections for the manifest, config and layers; `destroy()` closes them all.
 */
export class AgentPool {
  private readonly httpAgent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  private readonly httpsAgent = new https.Agent({ keepAlive: true, maxSockets: 8 });
  private readonly httpsInsecureAgent = new https.Agent({ keepAlive: true, maxSockets: 8, rejectUnauthorized: false });

  agentFor(url: URL, skipTlsVerify: boolean): http.Agent {
    if (url.protocol === 'http:') return this.httpAgent;
    return skipTlsVerify ? this.httpsInsecureAgent : this.httpsAgent;
  }

  destroy(): void {
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
    this.httpsInsecureAgent.destroy();
  }
}

/**
 * Send one HTTP request and resolve once the response headers arrive. A connection failure
 * (refused, reset, DNS, TLS, idle timeout) becomes UNAVAILABLE naming the host; an abort of
 * `init.signal` rejects with the signal's KataError reason and tears the socket down.
 */
export function sendRequest(url: URL, init: HttpRequestInit, agents: AgentPool): Promise<HttpResponse> {
  if (init.signal.aborted) return Promise.reject(abortReason(init.signal));
  const transport = url.protocol === 'http:' ? http : https;
  return new Promise<HttpResponse>((resolve, reject) => {
    const req = transport.request(url, {
      method: init.method ?? 'GET',
      headers: init.headers,
      agent: agents.agentFor(url, init.skipTlsVerify),
      signal: init.signal,
      timeout: SOCKET_IDLE_TIMEOUT_MS,
    });
    req.on('timeout', () => {
      req.destroy(new Error(`no data from ${url.host} for ${SOCKET_IDLE_TIMEOUT_MS} ms`));
    });
    req.on('error', (err) => {
      if (init.signal.aborted) reject(abortReason(init.signal));
      else reject(unavailable('IMAGE_REGISTRY_UNREACHABLE', `registry ${url.host} cannot be reached`, { cause: err }));
    });
    req.on('response', (res) => {
      resolve({ status: res.statusCode ?? 0, headers: res.headers, body: res, url });
    });
    req.end(init.body);
  });
}

/** Read a whole (small) body, refusing more than `limitBytes`. */
export async function readBody(res: HttpResponse, limitBytes: number, what: string, signal: AbortSignal): Promise<Buffer> {
  const declared = Number(res.headers['content-length'] ?? NaN);
  if (Number.isFinite(declared) && declared > limitBytes) {
    res.body.destroy();
    throw exhausted('IMAGE_DOCUMENT_TOO_LARGE', `${what} is ${declared} bytes, more than the ${limitBytes}-byte limit`);
  }
  const chunks: Buffer[] = [];
  let total = 0;
  try {
    for await (const chunk of res.body) {
      const buf = chunk as Buffer;
      total += buf.length;
      if (total > limitBytes) {
        res.body.destroy();
        throw exhausted('IMAGE_DOCUMENT_TOO_LARGE', `${what} is more than the ${limitBytes}-byte limit`);
      }
      chunks.push(buf);
    }
  } catch (err) {
    if (signal.aborted) throw abortReason(signal);
    if (isKataError(err)) throw err;
    throw unavailable('IMAGE_REGISTRY_UNREACHABLE', `registry ${res.url.host} broke off while sending ${what}`, { cause: err });
  }
  return Buffer.concat(chunks);
}

/** Throw away a body we do not need, so its keep-alive connection can be reused. */
export function discardBody(res: HttpResponse): void {
  res.body.resume();
  res.body.on('error', () => undefined);
}
