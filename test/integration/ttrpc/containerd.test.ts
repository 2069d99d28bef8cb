/**
 * Our ttrpc client against containerd itself (Debian's containerd 1.6, scripts/setup.sh installs
 * it): the proof that the frames, the Request/Response envelopes and the status codes are the
 * ones containerd speaks, and that the shim's EventPublisher sends envelopes containerd takes.
 *
 * containerd runs as this test's own child with a private config: root, state and both sockets
 * in a temporary directory, and every plugin that could touch the host disabled (CRI, the
 * runtimes and thus every shim, the cgroups monitor, snapshotters, /opt/containerd). What is
 * left serves the events service on gRPC and ttrpc, which is all this test calls. It is killed by
 * its pid and its directory removed afterwards, also on failure.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Client, credentials, Metadata } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RpcCode } from '../../../src/common/status-codes.js';
import { epochNs } from '../../../src/common/time.js';
import { EventPublisher } from '../../../src/shim/events.js';
import { type AnyMessage, decodeAny, timestampOfNs } from '../../../src/shim/proto.js';
import { encodeFrame, encodeHeader, type Frame, FrameReader, MAX_DATA_BYTES, MessageType } from '../../../src/ttrpc/frames.js';
import { connectTtrpc, type TtrpcClient, TtrpcStatusError } from '../../../src/ttrpc/index.js';
import { decodeResponse, encodeRequest } from '../../../src/ttrpc/messages.js';
import { rejection } from '../../helpers/kata-error.js';
import { until } from '../../helpers/poll.js';

const HAVE_CONTAINERD = spawnSync('containerd', ['--version']).status === 0;
if (!HAVE_CONTAINERD) console.warn('ttrpc containerd proof skipped: containerd is not installed (scripts/setup.sh installs it)');

const EVENTS_TTRPC = 'containerd.services.events.ttrpc.v1.Events';
const NAMESPACE = 'kata-ts-test';
const TOPIC = '/kata-ts/ttrpc-proof';

/**
 * The messages of containerd 1.6's api/services/ttrpc/events/v1/events.proto, its gRPC twin's
 * SubscribeRequest, and api/events ContainerDelete (the event we forward), field for field.
 */
const schema = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } },
            Timestamp: { fields: { seconds: { type: 'int64', id: 1 }, nanos: { type: 'int32', id: 2 } } },
          },
        },
      },
    },
    events: {
      nested: {
        Envelope: {
          fields: {
            timestamp: { type: 'google.protobuf.Timestamp', id: 1 },
            namespace: { type: 'string', id: 2 },
            topic: { type: 'string', id: 3 },
            event: { type: 'google.protobuf.Any', id: 4 },
          },
        },
        ForwardRequest: { fields: { envelope: { type: 'Envelope', id: 1 } } },
        SubscribeRequest: { fields: { filters: { rule: 'repeated', type: 'string', id: 1 } } },
        ContainerDelete: { fields: { id: { type: 'string', id: 1 } } },
      },
    },
  },
});
const ForwardRequest = schema.lookupType('events.ForwardRequest');
const Envelope = schema.lookupType('events.Envelope');
const SubscribeRequest = schema.lookupType('events.SubscribeRequest');
const ContainerDelete = schema.lookupType('events.ContainerDelete');

function encode(type: protobuf.Type, value: Record<string, unknown>): Buffer {
  return Buffer.from(type.encode(type.fromObject(value)).finish());
}

function forwardRequest(containerId: string, withTimestamp = true): Buffer {
  const nowMs = Date.now();
  return encode(ForwardRequest, {
    envelope: {
      ...(withTimestamp ? { timestamp: { seconds: Math.floor(nowMs / 1000), nanos: (nowMs % 1000) * 1e6 } } : {}),
      namespace: NAMESPACE,
      topic: TOPIC,
      event: { type_url: 'containerd.events.ContainerDelete', value: encode(ContainerDelete, { id: containerId }) },
    },
  });
}

function configToml(dir: string): string {
  return [
    'version = 2',
    `root = "${dir}/root"`,
    `state = "${dir}/state"`,
    'plugin_dir = ""',
    // Only the event exchange and the events services are wanted. Disabling the snapshotters
    // also leaves the metadata store and what needs it unloaded (containerd logs a warning for
    // each and serves the rest), so nothing here mounts, runs a shim or creates a cgroup.
    'disabled_plugins = [',
    ...[
      'io.containerd.grpc.v1.cri',
      'io.containerd.internal.v1.opt',
      'io.containerd.internal.v1.restart',
      'io.containerd.monitor.v1.cgroups',
      'io.containerd.runtime.v1.linux',
      'io.containerd.runtime.v2.task',
      'io.containerd.snapshotter.v1.aufs',
      'io.containerd.snapshotter.v1.btrfs',
      'io.containerd.snapshotter.v1.devmapper',
      'io.containerd.snapshotter.v1.native',
      'io.containerd.snapshotter.v1.overlayfs',
      'io.containerd.snapshotter.v1.zfs',
    ].map((p) => `  "${p}",`),
    ']',
    '[grpc]',
    `  address = "${dir}/containerd.sock"`,
    '[ttrpc]',
    `  address = "${dir}/containerd.sock.ttrpc"`,
    '[debug]',
    '  address = ""',
    '[metrics]',
    '  address = ""',
    '',
  ].join('\n');
}

describe.skipIf(!HAVE_CONTAINERD)('our ttrpc client against containerd 1.6', () => {
  let dir: string | undefined;
  let child: ChildProcess | undefined;
  let ttrpcSocket = '';
  const killChild = (): void => {
    if (child?.pid !== undefined && child.exitCode === null) child.kill('SIGKILL');
  };
  let client: TtrpcClient | undefined;
  let grpc: Client | undefined;

  const log = (): string => {
    const file = path.join(dir ?? '', 'containerd.log');
    return dir !== undefined && existsSync(file) ? readFileSync(file, 'utf8') : '';
  };

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-containerd-'));
    writeFileSync(path.join(dir, 'config.toml'), configToml(dir));
    const out = openSync(path.join(dir, 'containerd.log'), 'a');
    child = spawn('containerd', ['--config', path.join(dir, 'config.toml')], { stdio: ['ignore', out, out] });
    // Should this test process die without its afterAll, its containerd goes with it.
    process.once('exit', killChild);
    ttrpcSocket = path.join(dir, 'containerd.sock.ttrpc');
    client = await until(
      'containerd serving ttrpc',
      async (note) => {
        note(log().split('\n').slice(-3).join('\n'));
        if (child?.exitCode !== null || child.signalCode !== null)
          throw new Error(`containerd exited (${child?.exitCode ?? child?.signalCode}):\n${log()}`);
        if (!existsSync(ttrpcSocket)) return undefined;
        return connectTtrpc(ttrpcSocket).catch(() => undefined);
      },
      30_000,
    );
    grpc = new Client(`unix://${path.join(dir, 'containerd.sock')}`, credentials.createInsecure());
  });

  afterAll(async () => {
    await client?.close();
    grpc?.close();
    if (child?.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child?.once('exit', resolve));
      process.kill(child.pid, 'SIGKILL');
      await exited;
    }
    process.off('exit', killChild);
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  it('Events/Forward answers OK, and the event arrives on the gRPC Events/Subscribe stream', async () => {
    // Subscribe first (gRPC, a server stream), so the forwarded event has somewhere to go.
    const stream = grpc!.makeServerStreamRequest(
      '/containerd.services.events.v1.Events/Subscribe',
      (v: Record<string, unknown>) => encode(SubscribeRequest, v),
      (bytes: Buffer) => Envelope.toObject(Envelope.decode(bytes), { longs: Number, defaults: true }),
      { filters: [`namespace==${NAMESPACE}`] },
      new Metadata(),
    );
    const received = new Promise<Record<string, unknown>>((resolve, reject) => {
      stream.on('data', (envelope: Record<string, unknown>) => resolve(envelope));
      stream.on('error', (err: Error & { code?: number }) => {
        if (err.code !== RpcCode.CANCELLED) reject(err);
      });
    });
    // The subscription is live once containerd has the stream; forwarding until an event
    // arrives covers the moment between (each Forward must still answer OK).
    const envelope = await until(
      'the forwarded event on Subscribe',
      async () => {
        const reply = await client!.call(EVENTS_TTRPC, 'Forward', forwardRequest('c-1'), { timeoutMs: 10_000 });
        expect(reply.length).toBe(0); // google.protobuf.Empty
        return Promise.race([received, new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 200))]);
      },
      30_000,
      0,
    );
    stream.cancel();
    expect([envelope.namespace, envelope.topic]).toEqual([NAMESPACE, TOPIC]);
    const event = envelope.event as { type_url: string; value: Uint8Array };
    expect(event.type_url).toBe('containerd.events.ContainerDelete');
    expect(ContainerDelete.toObject(ContainerDelete.decode(event.value))).toEqual({ id: 'c-1' });
  });

  it("the shim's EventPublisher: containerd takes its envelopes, in order, with the event's bare type url", async () => {
    const stream = grpc!.makeServerStreamRequest(
      '/containerd.services.events.v1.Events/Subscribe',
      (v: Record<string, unknown>) => encode(SubscribeRequest, v),
      (bytes: Buffer) => Envelope.toObject(Envelope.decode(bytes), { longs: Number, defaults: true }),
      { filters: [`namespace==${NAMESPACE}`] },
      new Metadata(),
    );
    const seen: Record<string, unknown>[] = [];
    stream.on('data', (envelope: Record<string, unknown>) => seen.push(envelope));
    stream.on('error', () => {});
    const publisher = new EventPublisher({ address: ttrpcSocket, namespace: NAMESPACE, maxAttempts: 1 });
    try {
      // The subscription goes live at a moment we cannot see: publish a probe until one arrives,
      // then publish the pair once, so both fall after that moment.
      await until(
        'a probe event on Subscribe',
        async () => {
          publisher.publish('/tasks/delete', { container_id: 'c-probe', id: 'c-probe', pid: 1 });
          await publisher.idle();
          await new Promise((resolve) => setTimeout(resolve, 100));
          return seen.find((e) => e.topic === '/tasks/delete');
        },
        30_000,
        0,
      );
      publisher.publish('/tasks/start', { container_id: 'c-shim', pid: 7 });
      publisher.publish('/tasks/exit', {
        container_id: 'c-shim',
        id: 'c-shim',
        pid: 7,
        exit_status: 3,
        exited_at: timestampOfNs(epochNs()),
      });
      await publisher.idle();
      const exit = await until('the TaskExit on Subscribe', async () => seen.find((e) => e.topic === '/tasks/exit'), 30_000);
      const index = seen.indexOf(exit);
      expect(seen[index - 1]?.topic).toBe('/tasks/start');
      const event = exit.event as AnyMessage;
      expect(event.type_url).toBe('containerd.events.TaskExit');
      expect(decodeAny(event, 'containerd.events.TaskExit')).toMatchObject({ container_id: 'c-shim', pid: 7, exit_status: 3 });
    } finally {
      stream.cancel();
      await publisher.close(1000);
    }
  });

  it('Events/Forward with an envelope lacking its timestamp is INVALID_ARGUMENT from containerd', async () => {
    const err = await rejection(client!.call(EVENTS_TTRPC, 'Forward', forwardRequest('c-2', false)));
    expect(err).toBeInstanceOf(TtrpcStatusError);
    expect([(err as TtrpcStatusError).code, err.kind]).toEqual([RpcCode.INVALID_ARGUMENT, 'invalid']);
    expect(err.message).toContain('timestamp');
  });

  it('an unknown method and an unknown service are UNIMPLEMENTED from containerd, and the connection stays usable', async () => {
    const noMethod = await rejection(client!.call(EVENTS_TTRPC, 'Publish', Buffer.alloc(0)));
    expect([(noMethod as TtrpcStatusError).code, noMethod.message]).toEqual([RpcCode.UNIMPLEMENTED, 'method Publish']);
    const noService = await rejection(client!.call('kata.ts.v1.Nowhere', 'Forward', Buffer.alloc(0)));
    expect([(noService as TtrpcStatusError).code, noService.message]).toEqual([RpcCode.UNIMPLEMENTED, 'service kata.ts.v1.Nowhere']);
    expect((await client!.call(EVENTS_TTRPC, 'Forward', forwardRequest('c-3'))).length).toBe(0);
  });

  it('many calls in flight on one connection are each answered on their own stream', async () => {
    const calls = Array.from({ length: 20 }, (_, i) =>
      i % 2 === 0
        ? client!.call(EVENTS_TTRPC, 'Forward', forwardRequest(`c-many-${i}`))
        : rejection(client!.call(EVENTS_TTRPC, 'Nope', Buffer.alloc(0))),
    );
    const results = await Promise.all(calls);
    expect(results.map((r) => (r instanceof TtrpcStatusError ? r.code : RpcCode.OK))).toEqual(
      Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? RpcCode.OK : RpcCode.UNIMPLEMENTED)),
    );
  });

  it('containerd refuses a frame over 4 MiB with RESOURCE_EXHAUSTED on its stream, and takes one of exactly 4 MiB', async () => {
    // Frame by frame on a raw connection: our client refuses to send an oversized request at all.
    const socket = net.connect(ttrpcSocket);
    const reader = new FrameReader();
    const frames: Frame[] = [];
    socket.on('data', (chunk: Buffer) => {
      for (const event of reader.push(chunk)) if (event.kind === 'frame') frames.push(event.frame);
    });
    try {
      await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject));
      socket.write(encodeHeader({ dataBytes: MAX_DATA_BYTES + 1, streamId: 1, type: MessageType.REQUEST, flags: 0 }));
      socket.write(Buffer.alloc(MAX_DATA_BYTES + 1));
      // A Request of exactly 4 MiB for a method containerd lacks: UNIMPLEMENTED means it was read.
      const sized = (n: number): Buffer =>
        encodeRequest({ service: EVENTS_TTRPC, method: 'Nope', payload: Buffer.alloc(n), timeoutNs: 0, metadata: [] });
      const exact = sized(MAX_DATA_BYTES - (sized(1 << 21).length - (1 << 21)));
      expect(exact.length).toBe(MAX_DATA_BYTES);
      socket.write(encodeFrame(3, MessageType.REQUEST, 0, exact));
      await until('two answers from containerd', async () => (frames.length >= 2 ? true : undefined), 30_000, 20);
      expect(frames.map((f) => [f.streamId, f.type, decodeResponse(f.data).status.code])).toEqual([
        [1, MessageType.RESPONSE, RpcCode.RESOURCE_EXHAUSTED],
        [3, MessageType.RESPONSE, RpcCode.UNIMPLEMENTED],
      ]);
    } finally {
      socket.destroy();
    }
  });
});
