/**
 * One HTTPS exchange with the broker: node:https, the initdata's certificate(s) as the only
 * trust anchors (the `ca` option replaces node's bundled roots), no connection reuse, a bound on
 * the answer's size and a timeout on the whole exchange. Whatever the broker answers is
 * untrusted: a body over the bound is cut off and refused, not buffered.
 */
import { unavailable } from '../../../src/common/errors.js';
import './reasons.js';

/** One request to the broker. */
export interface BrokerHttpRequest {
  method: 'GET' | 'POST';
  /** The path under the broker's base URL, `/kbs/v0/auth` and so on. */
  path: string;
  /** A JSON body (POST). */
  body?: unknown;
  /** The `kbs-session-id` cookie's value, when the session has one. */
  sessionId?: string;
}

/** The broker's answer: status, the session cookie it set (if any) and the body's bytes. */
export interface BrokerHttpResponse {
  status: number;
  contentType: string | undefined;
  /** The value of a `kbs-session-id` cookie the answer sets. */
  setSessionId: string | undefined;
  body: Buffer;
}

/** Sends one request; rejects with an error whose `retryable` says whether to try again. */
export type BrokerTransport = (req: BrokerHttpRequest) => Promise<BrokerHttpResponse>;

export interface HttpsTransportOptions {
  /** The broker's base URL (config.ts: https, no trailing slash). */
  url: string;
  /** The PEM certificates the broker's chain must end in. */
  caPem: string;
  /** The whole exchange, connect to last byte. */
  timeoutMs?: number;
  /** Largest answer read. */
  maxResponseBytes?: number;
}

/** 30 s: the broker checks a certificate chain, a quote and an event log; TCG guests are slow. */
export const BROKER_TIMEOUT_MS = 30_000;
/** A resource is at most 1 MiB (src/attest/jwe.ts); its JWE in JSON is under 1.5 MiB. */
export const BROKER_RESPONSE_MAX_BYTES = 2 * 1024 * 1024;
/** The session cookie of trustee's KBS protocol. */
export const KBS_SESSION_COOKIE = 'kbs-session-id';

/**
 * Errors before an answer arrived that may pass by themselves: the pod's network coming up after
 * the agent, a broker restarting. TLS failures (a wrong certificate) are not among them.
 */
const RETRYABLE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENETDOWN',
  'EHOSTDOWN',
  'ETIMEDOUT',
  'EAI_AGAIN',
  'ENOTFOUND',
  'EPIPE',
  'ECONNABORTED',
]);

/** Whether an error from a transport is worth another attempt. */
export function isRetryable(err: unknown): boolean {
  const details = (err as { details?: { retryable?: unknown } }).details;
  return details?.retryable === true;
}

/** The `kbs-session-id` value among Set-Cookie headers. */
export function sessionIdFromSetCookie(headers: readonly string[] | undefined): string | undefined {
  for (const h of headers ?? []) {
    const first = h.split(';')[0] ?? '';
    const eq = first.indexOf('=');
    if (eq < 0) continue;
    if (first.slice(0, eq).trim() === KBS_SESSION_COOKIE) return first.slice(eq + 1).trim();
  }
  return undefined;
}

/** How long the kept-alive connection to the broker may sit idle before it is closed. */
export const IDLE_CONNECTION_MS = 10_000;

/** A cookie value is sent back only when it is plain (RFC 6265 cookie-octets), never as given. */
const COOKIE_VALUE = /^[\x21\x23-\x2B\x2D-\x3A\x3C-\x5B\x5D-\x7E]{1,512}$/;

/** The transport over node:https to the broker of `o.url`. */
export function httpsTransport(o: HttpsTransportOptions): BrokerTransport {
  const base = new URL(o.url);
  const basePath = base.pathname.replace(/\/+$/, '');
  const timeoutMs = o.timeoutMs ?? BROKER_TIMEOUT_MS;
  const maxBytes = o.maxResponseBytes ?? BROKER_RESPONSE_MAX_BYTES;
  // One kept-alive connection for the exchanges of an attestation and the resources after it: a
  // TLS handshake costs about a second of guest CPU under TCG, and an attestation makes three or
  // more requests. It closes after IDLE_CONNECTION_MS without a request, so nothing lingers.
  let agent: import('node:https').Agent | undefined;
  return async (req) => {
    // Loaded on first use, not at import: the agent's start-up snapshot cannot hold node:https
    // (V8's snapshot builder aborts on the handles its TLS setup keeps). Not by import(): code
    // deserialized from a start-up snapshot has no dynamic import ("A dynamic import callback was
    // not specified"), which went unseen while the snapshot never loaded on a TCG vCPU.
    const https = process.getBuiltinModule('node:https');
    agent ??= new https.Agent({ keepAlive: true, maxSockets: 1, timeout: IDLE_CONNECTION_MS });
    return new Promise<BrokerHttpResponse>((resolve, reject) => {
      const body = req.body === undefined ? undefined : Buffer.from(JSON.stringify(req.body), 'utf8');
      const headers: Record<string, string> = { accept: 'application/json' };
      if (body !== undefined) {
        headers['content-type'] = 'application/json';
        headers['content-length'] = String(body.length);
      }
      if (req.sessionId !== undefined) {
        if (!COOKIE_VALUE.test(req.sessionId)) {
          reject(unavailable('ATTEST_BROKER_PROTOCOL', `the broker's ${KBS_SESSION_COOKIE} cookie is not a plain cookie value`));
          return;
        }
        headers.cookie = `${KBS_SESSION_COOKIE}=${req.sessionId}`;
      }
      let settled = false;
      const fail = (err: Error, retryable: boolean) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        request.destroy();
        const code = (err as NodeJS.ErrnoException).code;
        reject(
          unavailable('ATTEST_BROKER_UNREACHABLE', `broker ${o.url}: ${req.method} ${req.path}: ${err.message}`, {
            cause: err,
            details: { retryable, ...(code === undefined ? {} : { code }) },
          }),
        );
      };
      const request = https.request(
        {
          protocol: 'https:',
          hostname: base.hostname.replace(/^\[|\]$/g, ''),
          port: base.port === '' ? 443 : Number(base.port),
          path: `${basePath}${req.path}`,
          method: req.method,
          headers,
          ca: o.caPem,
          agent,
          rejectUnauthorized: true,
        },
        (res) => {
          const chunks: Buffer[] = [];
          let got = 0;
          res.on('data', (chunk: Buffer) => {
            got += chunk.length;
            if (got > maxBytes) {
              fail(new Error(`the answer is over ${maxBytes} bytes`), false);
              return;
            }
            chunks.push(chunk);
          });
          res.on('error', (err) => fail(err, true));
          res.on('end', () => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            const setCookie = res.headers['set-cookie'];
            resolve({
              status: res.statusCode ?? 0,
              contentType: res.headers['content-type'],
              setSessionId: sessionIdFromSetCookie(setCookie),
              body: Buffer.concat(chunks),
            });
          });
        },
      );
      const timer = setTimeout(
        () => fail(Object.assign(new Error(`no answer within ${timeoutMs} ms`), { code: 'ETIMEDOUT' }), true),
        timeoutMs,
      );
      request.on('error', (err: NodeJS.ErrnoException) => fail(err, err.code !== undefined && RETRYABLE_CODES.has(err.code)));
      request.end(body);
    });
  };
}
