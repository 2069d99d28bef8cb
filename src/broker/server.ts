/**
 * `kata-ts broker serve`: the KBS endpoints over HTTPS (node:https, the state directory's
 * certificate). This file is the network edge: it bounds what a client can make the broker hold
 * (headers, body size checked against Content-Length and while reading, time), and hands each
 * complete request to BrokerService, which decides. A client's misbehaviour ends its own
 * connection, never the process.
 */
import { promises as fsp } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { errorInformation } from '../attest/kbs-protocol.js';
import type { EvidenceVerifier } from '../attest/verifier.js';
import { errorMessage, invalid, unavailable } from '../common/errors.js';
import { readTpmCa } from '../tpm/ca.js';
import type { DecisionSink } from './decisions.js';
import { BODY_LIMITS, BrokerService } from './service.js';
import { DEFAULT_SESSION_LIMITS, type SessionLimits, SessionTable } from './sessions.js';
import type { BrokerPaths } from './state.js';
import { LiveConfig } from './store.js';
import { TokenSigner } from './token.js';
import { builtinVerifiers, type VerifierTable, verifierTable } from './verifiers.js';
import './reasons.js';

/** The address `serve` listens on without --listen (trustee's port). */
export const DEFAULT_BROKER_LISTEN = '0.0.0.0:8080';
/** A body past this many bytes is not even drained: the connection is closed. */
const DRAIN_MAX_BYTES = 8 * 1024 * 1024;
/** Time bounds of one request (slow clients cannot hold sockets). */
const REQUEST_TIMEOUT_MS = 30_000;
const HEADERS_TIMEOUT_MS = 10_000;
const MAX_HEADER_BYTES = 16 * 1024;

export interface ListenAddress {
  host: string;
  port: number;
}

/** Pure: `HOST:PORT` or `[IPv6]:PORT`; port 0 lets the kernel choose. Throws BROKER_LISTEN_INVALID. */
export function parseListen(text: string): ListenAddress {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]+)):([0-9]{1,5})$/.exec(text);
  const host = m?.[1] ?? m?.[2];
  const port = Number(m?.[3]);
  const hostOk = host !== undefined && (net.isIP(host) !== 0 || /^[A-Za-z0-9.-]{1,253}$/.test(host));
  if (m === null || !hostOk || !Number.isInteger(port) || port > 65535)
    throw invalid('BROKER_LISTEN_INVALID', `--listen ${JSON.stringify(text)} must be HOST:PORT or [IPv6]:PORT with a port 0-65535`, {
      details: { field: 'listen', value: text },
    });
  return { host: host as string, port };
}

export interface ServeOptions {
  paths: BrokerPaths;
  listen: ListenAddress;
  log: DecisionSink;
  limits?: Partial<SessionLimits>;
  /** Explicit EK CA bundle (PEM text); else <dir>/tpm-ca-bundle.pem, else the node's tpm-ca dir. */
  tpmCaBundlePem?: string | null;
  /** The node's tpm-ca dir to read the bundle from when no other was given. */
  tpmCaDir?: string;
  /** AMD certificates (PEM) for the snp verifier; none: snp is not verified. */
  snpAmdCertsPem?: string | null;
  /** Intel SGX root CA (PEM) for the tdx verifier; none: tdx is not verified. */
  tdxIntelRootCaPem?: string | null;
  /** Verifiers to register instead of the built-in ones (tests). */
  verifiers?: readonly EvidenceVerifier[];
}

export interface RunningBroker {
  address: ListenAddress;
  verifiers: VerifierTable;
  close(): Promise<void>;
}

async function findTpmCaBundle(opts: ServeOptions): Promise<string | null> {
  if (opts.tpmCaBundlePem !== undefined) return opts.tpmCaBundlePem;
  const own = await fsp.readFile(opts.paths.tpmCaBundle, 'utf8').catch(() => undefined);
  if (own !== undefined) return own;
  if (opts.tpmCaDir === undefined) return null;
  try {
    return (await readTpmCa(opts.tpmCaDir)).bundlePem;
  } catch {
    return null;
  }
}

function send(res: ServerResponse, status: number, headers: Record<string, string>, body: string): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { ...headers, 'content-length': String(Buffer.byteLength(body)), 'cache-control': 'no-store' });
  res.end(body);
}

/** Reads a body up to `cap` bytes: the bytes, or 'too-large' (the rest is drained up to a bound, then the socket closed). */
function readBody(req: IncomingMessage, cap: number): Promise<Buffer | 'too-large' | 'aborted'> {
  return new Promise((resolve) => {
    // A body declared over the cap but within what is drained is read and dropped before the 413:
    // a client still writing it when the answer came and the connection closed would see EPIPE
    // instead of the answer. Past the drain bound the answer comes at once.
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > DRAIN_MAX_BYTES) {
      resolve('too-large');
      return;
    }
    const chunks: Buffer[] = [];
    let total = 0;
    let over = false;
    req.on('data', (chunk: Buffer) => {
      total += chunk.byteLength;
      if (total > cap) {
        over = true;
        if (total > DRAIN_MAX_BYTES) req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(over ? 'too-large' : Buffer.concat(chunks)));
    req.on('error', () => resolve(over ? 'too-large' : 'aborted'));
    req.on('close', () => {
      if (over) resolve('too-large');
      else if (!req.complete) resolve('aborted');
    });
  });
}

/** Starts the broker; resolves once it listens. */
export async function startBroker(opts: ServeOptions): Promise<RunningBroker> {
  const [key, cert, tokenPem] = await Promise.all([
    fsp.readFile(opts.paths.tlsKey, 'utf8'),
    fsp.readFile(opts.paths.tlsCert, 'utf8'),
    fsp.readFile(opts.paths.tokenKey, 'utf8'),
  ]);
  const signer = TokenSigner.fromPem(tokenPem);
  const config = await LiveConfig.load(opts.paths, opts.log);
  let verifiers: VerifierTable;
  if (opts.verifiers !== undefined) verifiers = verifierTable(opts.verifiers);
  else {
    const builtin = builtinVerifiers({
      tpmCaBundlePem: await findTpmCaBundle(opts),
      snpAmdCertsPem: opts.snpAmdCertsPem ?? null,
      tdxIntelRootCaPem: opts.tdxIntelRootCaPem ?? null,
    });
    verifiers = verifierTable(builtin.verifiers);
    for (const note of builtin.notes) opts.log.record({ event: 'serve', outcome: 'note', note });
  }
  const sessions = new SessionTable({ ...DEFAULT_SESSION_LIMITS, ...opts.limits });
  const service = new BrokerService({ verifiers, config, signer, sessions, log: opts.log });
  const sweep = setInterval(() => sessions.sweep(), 30_000);
  sweep.unref();

  const server = https.createServer(
    {
      key,
      cert,
      minVersion: 'TLSv1.2',
      requestTimeout: REQUEST_TIMEOUT_MS,
      headersTimeout: HEADERS_TIMEOUT_MS,
      maxHeaderSize: MAX_HEADER_BYTES,
    },
    (req, res) => {
      void (async () => {
        try {
          const url = req.url ?? '';
          const isAttest = url.split('?')[0] === '/kbs/v0/attest';
          const cap = isAttest ? BODY_LIMITS.attestBytes : BODY_LIMITS.authBytes;
          const body = req.method === 'GET' || req.method === 'HEAD' ? Buffer.alloc(0) : await readBody(req, cap);
          if (body === 'aborted') return;
          if (body === 'too-large') {
            opts.log.record({ event: 'error', outcome: 'refused', status: 413, url: url.slice(0, 200), reason: `body over ${cap} bytes` });
            res.setHeader('connection', 'close');
            send(
              res,
              413,
              { 'content-type': 'application/json' },
              JSON.stringify(errorInformation('payloadTooLarge', `the body must be at most ${cap} bytes`)),
            );
            return;
          }
          const answer = await service.handle({
            method: req.method ?? '',
            url,
            contentType: req.headers['content-type'],
            cookie: req.headers.cookie,
            body,
          });
          send(res, answer.status, answer.headers, answer.body);
        } catch (err) {
          // BrokerService.handle does not throw; this is the edge's own bug, kept to one request.
          opts.log.record({ event: 'error', outcome: 'failed', what: 'request', error: errorMessage(err) });
          send(
            res,
            500,
            { 'content-type': 'application/json' },
            JSON.stringify(errorInformation('internal', 'the broker failed on this request')),
          );
        }
      })();
    },
  );
  server.on('clientError', (err: Error & { code?: string }, socket) => {
    // Not HTTP, or headers past MAX_HEADER_BYTES: answered on that connection, which is closed.
    const status = err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : '400 Bad Request';
    if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
    else socket.destroy();
  });
  server.on('tlsClientError', () => {
    // A client that fails the handshake (wrong CA, plain HTTP) only loses its connection.
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error) =>
      reject(
        unavailable('BROKER_LISTEN_FAILED', `cannot listen on ${opts.listen.host}:${opts.listen.port}: ${err.message}`, { cause: err }),
      );
    server.once('error', onError);
    server.listen(opts.listen.port, opts.listen.host, () => {
      server.off('error', onError);
      resolve();
    });
  });
  server.on('error', (err) => opts.log.record({ event: 'error', outcome: 'failed', what: 'server', error: errorMessage(err) }));
  const addr = server.address() as net.AddressInfo;
  const address = { host: opts.listen.host, port: addr.port };
  opts.log.record({ event: 'serve', outcome: 'listening', host: address.host, port: address.port, tees: [...verifiers.keys()] });
  return {
    address,
    verifiers,
    close: () =>
      new Promise<void>((resolve) => {
        clearInterval(sweep);
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
