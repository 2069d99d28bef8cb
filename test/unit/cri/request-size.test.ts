/**
 * The CRI server's request size cap (MAX_REQUEST_BYTES): a body one byte over it is answered
 * RESOURCE_EXHAUSTED by grpc-js and never reaches decoding nor a handler; a body exactly at it is
 * read and decoded (here: junk, so the tolerant decoder answers INVALID_ARGUMENT), which shows the
 * cap is where it says. A real server on a unix socket in a temp folder.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Client, status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { loadCriPackage } from '../../../src/cri/proto.js';
import type { ImageRpcHandlers } from '../../../src/cri/rpcs.js';
import { type CriServer, MAX_REQUEST_BYTES, startCriServer } from '../../../src/cri/server.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { rawCall, rawClient } from '../../helpers/cri-fuzz.js';

const PULL = '/runtime.v1.ImageService/PullImage';

describe('the CRI server reads no request larger than MAX_REQUEST_BYTES', () => {
  let dir: string;
  let server: CriServer;
  let client: Client;
  const handled: number[] = [];

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-request-size-'));
    server = await startCriServer({
      socketPath: path.join(dir, 'cri.sock'),
      logger: silentLogger(),
      metrics: new RuntimeMetrics(),
      services: [
        {
          name: 'runtime.v1.ImageService',
          definition: loadCriPackage().imageService,
          handlers: {
            PullImage: async (req: { image: { image: string } | null }) => {
              handled.push(req.image?.image.length ?? 0);
              return { image_ref: 'sha256:0' };
            },
          } as unknown as ImageRpcHandlers,
        },
      ],
    });
    client = rawClient(server.socketPath);
  });
  afterAll(async () => {
    client?.close();
    await server?.close(1000);
    await rm(dir, { recursive: true, force: true });
  });

  it('is the kubelet’s 16 MiB', () => {
    expect(MAX_REQUEST_BYTES).toBe(16 * 1024 * 1024);
  });

  it('one byte over: RESOURCE_EXHAUSTED, no handler ran', async () => {
    const out = await rawCall(client, PULL, Buffer.alloc(MAX_REQUEST_BYTES + 1, 0xff), 60_000);
    expect(status[out.code]).toBe('RESOURCE_EXHAUSTED');
    expect(out.details).toContain('larger than max');
    expect(handled).toEqual([]);
  });

  it('exactly at the cap: read and decoded (junk here, so INVALID_ARGUMENT from the decoder)', async () => {
    const out = await rawCall(client, PULL, Buffer.alloc(MAX_REQUEST_BYTES, 0xff), 60_000);
    expect([status[out.code], out.reason]).toEqual(['INVALID_ARGUMENT', 'REQUEST_UNDECODABLE']);
  });

  it('a well-formed request under the cap reaches its handler', async () => {
    // PullImageRequest { image: ImageSpec { image: "x" * 1 MiB } }, encoded by hand.
    const name = Buffer.alloc(1024 * 1024, 'x');
    const spec = Buffer.concat([Buffer.from([0x0a]), varint(name.length), name]);
    const body = Buffer.concat([Buffer.from([0x0a]), varint(spec.length), spec]);
    const out = await rawCall(client, PULL, body, 60_000);
    expect(status[out.code]).toBe('OK');
    expect(handled).toEqual([name.length]);
  });
});

function varint(n: number): Buffer {
  const out: number[] = [];
  let v = n;
  while (v >= 0x80) {
    out.push((v & 0x7f) | 0x80);
    v >>>= 7;
  }
  out.push(v);
  return Buffer.from(out);
}
