/**
 * The attester's HTTPS exchange (guest/agent/attest/http.ts) against a real node:https server on
 * 127.0.0.1 with self-signed certificates made by openssl, as `kata-ts broker init` makes its
 * own: the initdata's certificate is the only trust anchor (another one is refused, and not as
 * something to retry), the session cookie goes both ways, an answer over the bound is cut off,
 * a silent server times out and an absent one is worth retrying.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { httpsTransport, isRetryable, sessionIdFromSetCookie } from '../../../guest/agent/attest/http.js';
import { rejection } from '../../helpers/kata-error.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'attest-http-'));

let good: { cert: string; key: string };
let other: { cert: string; key: string };
let server: https.Server;
let url = '';
const seen: Array<{ method?: string; url?: string; cookie?: string; body: string }> = [];

beforeAll(async () => {
  // A self-signed EC P-256 certificate for 127.0.0.1, as the broker's init makes its own
  // (-subj and -addext in argv: openssl would otherwise prompt).
  const make = (name: string) => {
    const key = path.join(dir, `${name}.key`);
    const cert = path.join(dir, `${name}.pem`);
    execFileSync('openssl', [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      key,
      '-out',
      cert,
      '-days',
      '2',
      '-subj',
      `/CN=${name}`,
      '-addext',
      'subjectAltName=IP:127.0.0.1',
    ]);
    return { cert: readFileSync(cert, 'utf8'), key: readFileSync(key, 'utf8') };
  };
  good = make('broker');
  other = make('impostor');
  server = https.createServer({ cert: good.cert, key: good.key }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, cookie: req.headers.cookie, body: Buffer.concat(chunks).toString() });
      if (req.url === '/prefix/kbs/v0/auth') {
        res.writeHead(200, {
          'content-type': 'application/json',
          'set-cookie': ['other=1; Path=/', 'kbs-session-id=abc123; Secure; HttpOnly'],
        });
        res.end('{"nonce":"n","extra-params":{}}');
      } else if (req.url === '/prefix/big') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(Buffer.alloc(64 * 1024, 0x61));
      } else if (req.url === '/prefix/silent') {
        // Never answers: the client's timeout ends it.
      } else {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end('{"type":"t","detail":"d"}');
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `https://127.0.0.1:${(server.address() as AddressInfo).port}/prefix`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  rmSync(dir, { recursive: true, force: true });
});

describe('the attester over https', () => {
  it('trusts the initdata certificate, posts JSON under the base path, reads the session cookie and sends it back', async () => {
    const t = httpsTransport({ url, caPem: good.cert });
    const res = await t({ method: 'POST', path: '/kbs/v0/auth', body: { version: '0.4.0' } });
    expect(res.status).toBe(200);
    expect(res.setSessionId).toBe('abc123');
    expect(JSON.parse(res.body.toString())).toEqual({ nonce: 'n', 'extra-params': {} });
    const again = await t({ method: 'GET', path: '/kbs/v0/resource/a/b/c', sessionId: 'abc123' });
    expect(again.status).toBe(404);
    expect(seen.at(-2)).toMatchObject({ method: 'POST', url: '/prefix/kbs/v0/auth', body: '{"version":"0.4.0"}' });
    expect(seen.at(-1)).toMatchObject({ method: 'GET', url: '/prefix/kbs/v0/resource/a/b/c', cookie: 'kbs-session-id=abc123' });
  });

  it('refuses a broker whose certificate is not the initdata one, as an error not worth retrying', async () => {
    const e = await rejection(httpsTransport({ url, caPem: other.cert })({ method: 'GET', path: '/kbs/v0/auth' }));
    expect(e.reason).toBe('ATTEST_BROKER_UNREACHABLE');
    expect(isRetryable(e)).toBe(false);
  });

  it('cuts off an answer over the bound', async () => {
    const e = await rejection(httpsTransport({ url, caPem: good.cert, maxResponseBytes: 4096 })({ method: 'GET', path: '/big' }));
    expect(e.message).toContain('over 4096 bytes');
    expect(isRetryable(e)).toBe(false);
  });

  it('times out a silent broker, and a closed port, as errors worth retrying', async () => {
    const silent = await rejection(httpsTransport({ url, caPem: good.cert, timeoutMs: 300 })({ method: 'GET', path: '/silent' }));
    expect(silent.message).toContain('no answer within 300 ms');
    expect(isRetryable(silent)).toBe(true);
    // A port just closed: nothing listens there.
    const probe = https.createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const refused = await rejection(httpsTransport({ url: `https://127.0.0.1:${port}`, caPem: good.cert })({ method: 'GET', path: '/x' }));
    expect(refused.details?.code).toBe('ECONNREFUSED');
    expect(isRetryable(refused)).toBe(true);
  });

  it('never sends a cookie value that is not plain', async () => {
    const e = await rejection(httpsTransport({ url, caPem: good.cert })({ method: 'GET', path: '/x', sessionId: 'a;b\r\nX: y' }));
    expect(e.reason).toBe('ATTEST_BROKER_PROTOCOL');
  });

  it('finds kbs-session-id among Set-Cookie headers', () => {
    expect(sessionIdFromSetCookie(['a=1', 'kbs-session-id=xyz; Path=/'])).toBe('xyz');
    expect(sessionIdFromSetCookie(['kbs-session-idx=1'])).toBeUndefined();
    expect(sessionIdFromSetCookie(undefined)).toBeUndefined();
  });
});
