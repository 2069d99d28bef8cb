/**
 * The typed CRI test client against a small grpc-js server of the real CRI service definitions:
 * requests and responses go through the .proto encoding, and the compiler holds the rpc names
 * and fields (the @ts-expect-error lines fail `tsc` if a wrong name or field ever compiles).
 */
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Server, ServerCredentials, type ServerUnaryCall, type ServerWritableStream, type sendUnaryData, status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCriPackage } from '../../../src/cri/proto.js';
import { type CriClient, criClient, DEFAULT_RPC_DEADLINE_MS } from '../../helpers/cri-client.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { scaledMs } from '../../helpers/time-scale.js';

describe('criClient', () => {
  let dir: string;
  let server: Server;
  let cri: CriClient;
  const seenDeadlines: number[] = [];

  beforeAll(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-cri-client-'));
    const socketPath = path.join(dir, 'cri.sock');
    const pkg = loadCriPackage();
    server = new Server();
    server.addService(pkg.runtimeService, {
      Version: (call: ServerUnaryCall<{ version: string }, unknown>, done: sendUnaryData<unknown>) => {
        seenDeadlines.push(Number(call.getDeadline()));
        done(null, { version: call.request.version, runtime_name: 'fake', runtime_api_version: 'v1' });
      },
      RunPodSandbox: (call: ServerUnaryCall<{ config: { metadata: { name: string } } | null }, unknown>, done: sendUnaryData<unknown>) => {
        if (call.request.config === null) done({ code: status.INVALID_ARGUMENT, details: 'no config' });
        else done(null, { pod_sandbox_id: `id-of-${call.request.config.metadata.name}` });
      },
      GetContainerEvents: (call: ServerWritableStream<unknown, unknown>) => {
        call.write({ container_id: 'c1', container_event_type: 'CONTAINER_STARTED_EVENT', created_at: '7' });
        call.end();
      },
    });
    server.addService(pkg.imageService, {
      ListImages: (_call: ServerUnaryCall<unknown, unknown>, done: sendUnaryData<unknown>) => done(null, { images: [{ id: 'sha256:1' }] }),
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix://${socketPath}`, ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())),
    );
    cri = criClient(socketPath);
  });

  afterAll(async () => {
    cri?.close();
    await new Promise<void>((resolve) => (server === undefined ? resolve() : server.tryShutdown(() => resolve())));
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('calls a unary rpc by its method and decodes the response with the loader defaults', async () => {
    const res = await cri.runtime.Version({ version: 'v1' });
    expect(res).toEqual({ version: 'v1', runtime_name: 'fake', runtime_version: '', runtime_api_version: 'v1' });
    expect(await cri.runtime.RunPodSandbox({ config: { metadata: { name: 'web' } } })).toEqual({ pod_sandbox_id: 'id-of-web' });
    expect(await cri.image.ListImages({})).toMatchObject({ images: [{ id: 'sha256:1' }] });
  });

  it('rejects with the server status', async () => {
    await expectGrpcError(cri.runtime.RunPodSandbox({}), status.INVALID_ARGUMENT);
  });

  it('sends a deadline by default, and the one the options give', async () => {
    seenDeadlines.length = 0;
    const before = Date.now();
    await cri.runtime.Version({});
    const mine = before + 5_000;
    await cri.runtime.Version({}, { deadline: mine });
    expect(seenDeadlines).toHaveLength(2);
    expect(seenDeadlines[0]).toBeGreaterThanOrEqual(before + scaledMs(DEFAULT_RPC_DEADLINE_MS) - 1_000);
    expect(Math.abs(seenDeadlines[1]! - mine)).toBeLessThan(1_000);
  });

  it('streams a server-streaming rpc', async () => {
    const events: Array<{ container_id: string; created_at: string }> = [];
    const stream = cri.runtime.GetContainerEvents({});
    stream.on('data', (e: { container_id: string; created_at: string }) => events.push(e));
    await new Promise((resolve, reject) => {
      stream.on('end', resolve);
      stream.on('error', reject);
    });
    expect(events).toMatchObject([{ container_id: 'c1', created_at: '7' }]);
  });

  it('holds rpc names and fields at compile time', () => {
    // Never called: these lines are checked by tsc, not run.
    const typeChecks = (c: CriClient) => {
      // @ts-expect-error a misspelled rpc is not a method
      void c.runtime.RunPodSandboxx({});
      // @ts-expect-error an rpc of the other service is not a method
      void c.runtime.PullImage({});
      // @ts-expect-error a request field the .proto does not have
      void c.runtime.StopPodSandbox({ pod_sandbox: 'x' });
      // @ts-expect-error a field of the wrong type
      void c.runtime.StopContainer({ container_id: 7, timeout: 2 });
      // @ts-expect-error a field the response does not have
      void c.runtime.RunPodSandbox({}).then((r) => r.sandbox_id);
      // The right names compile, and the response type flows through.
      void c.runtime.StopPodSandbox({ pod_sandbox_id: 'x' }).then((r) => r satisfies object);
      void c.image.PullImage({ image: { image: 'busybox' } }).then((r) => r.image_ref.length);
    };
    expect(typeof typeChecks).toBe('function');
    expect(Object.keys(cri.runtime)).toContain('RunPodSandbox');
    expect(Object.keys(cri.runtime)).not.toContain('runPodSandbox');
  });
});
