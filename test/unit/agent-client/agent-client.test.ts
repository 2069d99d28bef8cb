import { Buffer } from 'node:buffer';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AgentService } from '../../../guest/agent/server.js';
import { codec } from '../../../src/agent-client/connection.js';
import { AgentClient } from '../../../src/agent-client/index.js';
import { type ServerHandlers, serveDuplex, serveRpc } from '../../../src/channel/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { AGENT_API_VERSION, AGENT_METHODS, type AgentMethods } from '../../../src/generated/agent/agent.js';
import { FakeContainerBackend } from './fake-backend.js';

const T = { timeoutMs: 5000 };
let dir: string;
let socketPath: string;
let guestSockets: Set<net.Socket>;
let server: net.Server;
let backend: FakeContainerBackend;
let service: AgentService;
const clients: AgentClient[] = [];

/** The guest agent behind a unix socket, as QEMU's chardev would carry it. */
async function startGuest(outputLimitBytes = 1024 * 1024): Promise<void> {
  backend = new FakeContainerBackend();
  service = new AgentService({ backend, agentVersion: 'test', logger: silentLogger(), outputLimitBytes });
  guestSockets = new Set();
  server = net.createServer((socket) => {
    guestSockets.add(socket);
    socket.once('close', () => guestSockets.delete(socket));
    serveDuplex(socket, (session) => service.attach(session));
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
}

async function connect(): Promise<AgentClient> {
  const client = await AgentClient.connect(
    { socketPath, logger: silentLogger(), hostVersion: 'test', minBackoffMs: 20, maxBackoffMs: 100 },
    5000,
  );
  clients.push(client);
  return client;
}

async function collect(gen: AsyncGenerator<{ offset: number; data: Uint8Array; eof: boolean; stream: string }>, bytes: number) {
  const chunks: { offset: number; text: string; stream: string; eof: boolean }[] = [];
  let got = 0;
  for await (const c of gen) {
    chunks.push({ offset: c.offset, text: Buffer.from(c.data).toString(), stream: c.stream, eof: c.eof });
    got += c.data.length;
    if (got >= bytes || c.eof) break;
  }
  return chunks;
}

beforeEach(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'agent-client-'));
  socketPath = path.join(dir, 'agent.sock');
  await startGuest();
});

afterEach(async () => {
  for (const c of clients.splice(0)) c.close();
  for (const s of guestSockets) s.destroy();
  await new Promise((resolve) => server.close(resolve));
  rmSync(dir, { recursive: true, force: true });
});

describe('AgentClient against the guest server (FakeContainerBackend)', () => {
  it('says Hello and reports the guest facts and API version', async () => {
    const client = await connect();
    expect(client.connection.hello?.apiVersion).toBe(AGENT_API_VERSION);
    expect(client.connection.hello?.facts?.cgroupControllers).toEqual(['cpu', 'memory']);
    expect(client.connection.hello?.agentInstanceId).toBe(service.instanceId);
    expect((await client.guestFacts(T)).onlineVcpus).toBe(2);
  });

  it('runs a container lifecycle and maps agent errors to KataErrors', async () => {
    const client = await connect();
    expect(await client.createContainer({ containerId: 'c1', ociConfigJson: '{}', stdio: 'STDIO_MODE_PIPES' }, T)).toEqual({ pid: 101 });
    await expect(client.createContainer({ containerId: 'c1' }, T)).rejects.toMatchObject({ kind: 'exists', reason: 'CONTAINER_EXISTS' });
    expect((await client.startContainer('c1', T)).startedAt).toEqual({ seconds: 5, nanos: 6 });
    const waiting = client.waitContainer('c1', { timeoutMs: 10_000 });
    await client.signalContainer('c1', 9, false, T);
    expect(await waiting).toMatchObject({ exitCode: 137, finishedAt: { seconds: 1, nanos: 2 } });
    expect((await client.listContainers([], T)).map((c) => c.containerId)).toEqual(['c1']);
    await client.deleteContainer('c1', false, T);
    await expect(client.startContainer('c1', T)).rejects.toMatchObject({ kind: 'not_found' });
  });

  it('carries the container devices to the agent as typed messages, every field decoded', async () => {
    const client = await connect();
    const devices = [
      {
        containerPath: '/dev/vfio/12',
        access: 'rw',
        kind: 'GUEST_DEVICE_KIND_VFIO_GROUP',
        pciPaths: ['08.0/00.0', '08.1/00.0'],
        guestPath: '',
      },
      { containerPath: '/dev/fuse', access: 'rwm', kind: 'GUEST_DEVICE_KIND_GUEST_NODE', pciPaths: [], guestPath: '/dev/fuse' },
    ] as const;
    await client.createContainer(
      { containerId: 'd1', ociConfigJson: '{}', devices: devices.map((d) => ({ ...d, pciPaths: [...d.pciPaths] })) },
      T,
    );
    await client.createContainer({ containerId: 'd2', ociConfigJson: '{}' }, T);
    expect(backend.createRequests.map((r) => [r.containerId, r.devices])).toEqual([
      ['d1', devices],
      ['d2', []],
    ]);
  });

  it('resumes container output after a daemon restart at the acknowledged offset, nothing lost or repeated', async () => {
    const first = await connect();
    await first.createContainer({ containerId: 'c1' }, T);
    const c = backend.container('c1');
    c.stdio.stdout.write('line1\n');
    await new Promise((r) => setTimeout(r, 10));
    c.stdio.stderr.write('err1\n');
    const seen = await collect(first.streamOutput('c1', 0), 11);
    expect(seen.map((s) => [s.offset, s.stream, s.text])).toEqual([
      [0, 'OUTPUT_STREAM_STDOUT', 'line1\n'],
      [6, 'OUTPUT_STREAM_STDERR', 'err1\n'],
    ]);
    await first.ackOutput('c1', 6, T);
    first.close();

    const second = await connect();
    c.stdio.stdout.write('line2\n');
    await expect(collect(second.streamOutput('c1', 0), 1)).rejects.toMatchObject({ reason: 'OUTPUT_OFFSET_GONE' });
    const resumed = second.streamOutput('c1', 6);
    const again = await collect(resumed, 11);
    expect(again.map((s) => s.text).join('')).toBe('err1\nline2\n');
    expect(again[0]!.offset).toBe(6);
    const [state] = await second.listContainers(['c1'], T);
    expect(state).toMatchObject({ outputOffset: 17, outputAckedOffset: 6 });
    backend.exitContainer('c1', 0);
    const tail = await collect(second.streamOutput('c1', 17), 1);
    expect(tail).toEqual([{ offset: 17, text: '', stream: 'OUTPUT_STREAM_STDOUT', eof: true }]);
  });

  it('throttles a container whose output is not acknowledged, and lets it go on after the ack', async () => {
    for (const s of guestSockets) s.destroy();
    await new Promise((resolve) => server.close(resolve));
    await startGuest(64 * 1024);
    const client = await connect();
    await client.createContainer({ containerId: 'c1' }, T);
    const { stdout } = backend.container('c1').stdio;
    let written = 0;
    while (stdout.write(Buffer.alloc(8192, 'x'))) written += 8192;
    written += 8192;
    await new Promise((r) => setTimeout(r, 50));
    const [before] = await client.listContainers(['c1'], T);
    // The journal stopped reading at its bound: the rest waits in the pipe (the writer blocks).
    expect(before!.outputOffset).toBeGreaterThanOrEqual(64 * 1024);
    expect(before!.outputOffset).toBeLessThan(written);
    expect(stdout.writableLength).toBeGreaterThan(0);
    await client.ackOutput('c1', before!.outputOffset, T);
    await expect.poll(async () => (await client.listContainers(['c1'], T))[0]!.outputOffset).toBe(written);
  });

  it('execs a process with stdin, stdout and stderr streams and its exit status', async () => {
    const client = await connect();
    await client.createContainer({ containerId: 'c1' }, T);
    expect(await client.execProcess({ containerId: 'c1', execId: 'e1', ociProcessJson: '{}', stdin: true }, T)).toEqual({ pid: 4242 });
    const out = collect(client.readProcessOutput('c1', 'e1', 'OUTPUT_STREAM_STDOUT'), 1 << 30);
    const err = collect(client.readProcessOutput('c1', 'e1', 'OUTPUT_STREAM_STDERR'), 1 << 30);
    const stdin = client.writeStdin('c1', 'e1');
    const big = Buffer.alloc(700_000, 'a');
    await stdin.write(Buffer.from('hello '));
    await stdin.write(big);
    stdin.end();
    await stdin.done;
    const outText = (await out).map((c) => c.text).join('');
    expect(outText.length).toBe(6 + big.length);
    expect((await out).at(-1)!.eof).toBe(true);
    expect((await err).map((c) => c.text).join('')).toBe('bye\n');
    expect((await client.waitProcess('c1', 'e1', T)).exitCode).toBe(3);
    await client.deleteProcess('c1', 'e1', T);
  });

  it('forwards a port through the agent (a loopback echo server)', async () => {
    const echo = net.createServer((s) => s.pipe(s));
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    try {
      const client = await connect();
      const pf = client.portForward((echo.address() as net.AddressInfo).port);
      await pf.write(Buffer.from('ping'));
      const first = await pf.data.next();
      expect(Buffer.from(first.value as Uint8Array).toString()).toBe('ping');
      pf.end();
      const rest = [];
      for await (const d of pf.data) rest.push(d);
      expect(rest).toEqual([]);
    } finally {
      echo.close();
    }
  });

  it('delivers guest events', async () => {
    const client = await connect();
    await client.createContainer({ containerId: 'c1' }, T);
    const events = client.guestEvents();
    const next = events.next();
    await new Promise((r) => setTimeout(r, 50));
    backend.exitContainer('c1', 2);
    const e = await next;
    expect(e.value).toMatchObject({ kind: 'GUEST_EVENT_KIND_CONTAINER_EXITED', containerId: 'c1', exit: { exitCode: 2 } });
    await events.return(undefined);
  });

  it('reconnects by itself when the link drops; streams open at the time fail cleanly', async () => {
    const client = await connect();
    await client.createContainer({ containerId: 'c1' }, T);
    const stream = client.streamOutput('c1', 0);
    const pending = stream.next();
    const firstInstance = client.connection.hello?.agentInstanceId;
    let sessions = 0;
    client.connection.onSession(() => {
      sessions += 1;
    });
    for (const s of guestSockets) s.destroy();
    await expect(pending).rejects.toMatchObject({ kind: 'unavailable' });
    // The next call waits for the new session within its deadline.
    expect((await client.listContainers([], T)).map((c) => c.containerId)).toEqual(['c1']);
    expect(sessions).toBe(1);
    expect(client.connection.hello?.agentInstanceId).toBe(firstInstance);
  });

  it('refuses an agent that speaks another API version, and says so', async () => {
    const handlers: ServerHandlers<AgentMethods> = { ...service.handlers(), Hello: async () => ({ apiVersion: 99 }) };
    const other = net.createServer((socket) => {
      guestSockets.add(socket);
      serveDuplex(socket, (session) => serveRpc(session, AGENT_METHODS, handlers, codec));
    });
    const otherPath = path.join(dir, 'other.sock');
    await new Promise<void>((resolve) => other.listen(otherPath, resolve));
    try {
      const err = await AgentClient.connect(
        { socketPath: otherPath, logger: silentLogger(), hostVersion: 'test', minBackoffMs: 20 },
        300,
      ).catch((e: unknown) => e);
      expect(err).toMatchObject({ kind: 'timeout', reason: 'AGENT_NOT_CONNECTED' });
      expect((err as Error).cause).toMatchObject({ reason: 'AGENT_API_MISMATCH' });
    } finally {
      other.close();
    }
  });
});
