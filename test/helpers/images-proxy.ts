import http from 'node:http';
import { freePort } from './images-registry.js';

export interface ProxyOptions {
  /** Flip one byte in the middle of every GET of this blob: a registry serving corrupt content. */
  corruptBlob?: string;
  /** Send only this many bytes of this blob, then hang: an interrupted transfer. */
  stallBlob?: { digest: string; afterBytes: number };
  /**
   * Answer blob GETs with a 307 to a second origin (as registries backed by object storage do);
   * that origin fetches the blob from the registry with `authorization` and records the headers
   * it was sent.
   */
  redirectBlobs?: { authorization: string | undefined };
  /** Send only this many bytes of every blob, then drop the connection: a registry that breaks off. */
  dropBlobs?: { afterBytes: number };
}

export interface ProxyHandle {
  /** `127.0.0.1:<port>` */
  host: string;
  /** GETs of each blob digest seen, to check downloads were shared or skipped. */
  blobGets: Map<string, number>;
  /** Resolves once the stalled blob has sent its bytes and hangs. */
  stalled: Promise<void>;
  /** Requests the redirect target received (with redirectBlobs). */
  storageRequests: Array<{ url: string; authorization: string | undefined }>;
  stop(): Promise<void>;
}

/**
 * A small HTTP proxy in front of a real registry that can damage or stall one blob. Everything
 * else (auth challenges, manifests, redirects) passes through unchanged.
 */
export async function startProxy(targetUrl: string, opts: ProxyOptions = {}): Promise<ProxyHandle> {
  const target = new URL(targetUrl);
  const blobGets = new Map<string, number>();
  let markStalled: () => void = () => undefined;
  const stalled = new Promise<void>((resolve) => (markStalled = resolve));
  const port = await freePort();
  const storageRequests: ProxyHandle['storageRequests'] = [];
  const storagePort = await freePort();
  const storage =
    opts.redirectBlobs === undefined
      ? undefined
      : http.createServer((req, res) => {
          storageRequests.push({ url: req.url ?? '', authorization: req.headers.authorization });
          const upstreamPath = (req.url ?? '').replace(/^\/storage/, '').replace(/\?.*$/, '');
          const headers: Record<string, string> = {};
          if (opts.redirectBlobs?.authorization !== undefined) headers.authorization = opts.redirectBlobs.authorization;
          const up = http.request({ host: target.hostname, port: target.port, path: upstreamPath, headers }, (u) => {
            res.writeHead(u.statusCode ?? 502, { 'content-length': u.headers['content-length'] ?? '' });
            u.pipe(res);
          });
          up.on('error', () => res.destroy());
          up.end();
        });
  if (storage !== undefined) await new Promise<void>((resolve) => storage.listen(storagePort, '127.0.0.1', resolve));
  const server = http.createServer((req, res) => {
    const blob = /\/blobs\/(sha256:[a-f0-9]{64})$/.exec(req.url ?? '')?.[1];
    if (blob !== undefined && req.method === 'GET') blobGets.set(blob, (blobGets.get(blob) ?? 0) + 1);
    if (blob !== undefined && req.method === 'GET' && storage !== undefined) {
      res.writeHead(307, { Location: `http://127.0.0.1:${storagePort}/storage${req.url ?? ''}?signature=abc` }).end();
      return;
    }
    const upstream = http.request(
      { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: { ...req.headers, host: target.host } },
      (up) => {
        const status = up.statusCode ?? 502;
        const headers = { ...up.headers };
        const location = headers.location;
        // The registry's absolute upload/redirect URLs must keep pointing at the proxy.
        if (location !== undefined) headers.location = location.replace(target.origin, `http://127.0.0.1:${port}`);
        const damage = blob !== undefined && status === 200 && blob === opts.corruptBlob;
        const stall = blob !== undefined && status === 200 && blob === opts.stallBlob?.digest;
        const drop = blob !== undefined && status === 200 && opts.dropBlobs !== undefined;
        if (!damage && !stall && !drop) {
          res.writeHead(status, headers);
          up.pipe(res);
          return;
        }
        const chunks: Buffer[] = [];
        up.on('data', (c: Buffer) => chunks.push(c));
        up.on('end', () => {
          const body = Buffer.concat(chunks);
          res.writeHead(status, headers);
          if (damage) {
            const at = Math.floor(body.length / 2);
            body[at] = (body[at] ?? 0) ^ 0x5a;
            res.end(body);
          } else if (drop) {
            res.write(body.subarray(0, opts.dropBlobs?.afterBytes ?? 0), () => res.socket?.destroy());
          } else {
            res.write(body.subarray(0, opts.stallBlob?.afterBytes ?? 0), () => markStalled());
            // ...and never end: the client sees a transfer that stops midway.
          }
        });
      },
    );
    upstream.on('error', () => {
      res.destroy();
    });
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return {
    host: `127.0.0.1:${port}`,
    blobGets,
    stalled,
    storageRequests,
    stop: async () => {
      await new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      });
      if (storage !== undefined) {
        await new Promise<void>((resolve) => {
          storage.closeAllConnections();
          storage.close(() => resolve());
        });
      }
    },
  };
}
