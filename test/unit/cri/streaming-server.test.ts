/**
 * The streaming server end to end on loopback, with a stand-in agent that runs commands as local
 * processes and port-forwards to a local TCP server: SPDY (as client-go) and WebSocket clients,
 * exit codes through the error stream, stdin, resize reaching the agent, single-use tokens,
 * refusals, a client that leaves mid-stream (its process is killed), and close() ending streams.
 * Also the token store and the kubelet's request checks.
 */
import { Buffer } from 'node:buffer';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentClient } from '../../../src/agent-client/index.js';
import { decodeAttachRequest, decodeExecRequest, decodePortForwardRequest } from '../../../src/cri/streaming/requests.js';
import { StreamingServer } from '../../../src/cri/streaming/server.js';
import { TokenStore } from '../../../src/cri/streaming/tokens.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import { exitCodeOf, SpdyClient, spdyCommand, spdyPortForward, wsCommand, wsPortForward } from '../../helpers/streaming-client.js';

/** A stand-in agent: exec = a local process; port-forward = a local TCP connection. */
function fakeAgent() {
  const procs = new Map<string, { child: ChildProcess; exit: Promise<number> }>();
  const resizes: [number, number][] = [];
  const agent = {
    resizes,
    procs,
    async execProcess(req: { execId: string; ociProcessJson: string }) {
      const args = (JSON.parse(req.ociProcessJson) as { args: string[] }).args;
      const child = spawn(args[0]!, args.slice(1), { stdio: 'pipe' });
      const exit = new Promise<number>((resolve) => child.on('exit', (code, sig) => resolve(code ?? 128 + (sig === 'SIGKILL' ? 9 : 15))));
      procs.set(req.execId, { child, exit });
      return { pid: child.pid ?? 0 };
    },
    async *readProcessOutput(_c: string, execId: string, stream: string) {
      const child = procs.get(execId)!.child;
      const readable = stream === 'OUTPUT_STREAM_STDERR' ? child.stderr! : child.stdout!;
      for await (const data of readable) yield { stream, data: data as Buffer, offset: 0, eof: false };
      yield { stream, data: Buffer.alloc(0), offset: 0, eof: true };
    },
    writeStdin(_c: string, execId: string) {
      if (execId === '') {
        return {
          write: async (d: Buffer) => void agent.attachStdin.push(d.toString()),
          end: () => agent.attachStdin.push('<end>'),
          cancel: () => {},
          done: Promise.resolve(),
        };
      }
      const stdin = procs.get(execId)!.child.stdin!;
      return {
        write: (d: Buffer) => new Promise<void>((resolve, reject) => stdin.write(d, (e) => (e ? reject(e) : resolve()))),
        end: () => stdin.end(),
        cancel: () => stdin.destroy(),
        done: Promise.resolve(),
      };
    },
    async waitProcess(_c: string, execId: string) {
      return { exitCode: await procs.get(execId)!.exit, signal: 0, oomKilled: false, finishedAt: null };
    },
    async signalProcess(_c: string, execId: string, signal: number) {
      procs.get(execId)?.child.kill(signal === 9 ? 'SIGKILL' : 'SIGTERM');
    },
    async resizeTty(_c: string, _e: string, rows: number, cols: number) {
      resizes.push([rows, cols]);
    },
    async deleteProcess(_c: string, execId: string) {
      procs.delete(execId);
    },
    /** The container's own output and stdin (attach): what `attachOutput` holds, then end of file. */
    attachOutput: [] as string[],
    attachStdin: [] as string[],
    async listContainers() {
      return [{ containerId: 'c1', outputOffset: 0 }];
    },
    async *streamOutput() {
      // A container answering what it reads: output comes once input did (or after half a second).
      for (let i = 0; i < 25 && agent.attachStdin.length === 0; i++) await new Promise((res) => setTimeout(res, 20));
      for (const text of agent.attachOutput) yield { stream: 'OUTPUT_STREAM_STDOUT', data: Buffer.from(text), offset: 0, eof: false };
      yield { stream: 'OUTPUT_STREAM_STDOUT', data: Buffer.alloc(0), offset: 0, eof: true };
    },
    portForward(port: number) {
      const socket = net.createConnection({ host: '127.0.0.1', port });
      socket.on('error', () => {});
      return {
        write: (d: Buffer) => new Promise<void>((resolve) => socket.write(d, () => resolve())),
        end: () => socket.end(),
        cancel: () => socket.destroy(),
        data: (async function* () {
          for await (const d of socket) yield d as Uint8Array;
        })(),
      };
    },
  };
  return agent;
}

const record = {
  id: 'c1',
  sandboxId: 's1',
  spec: { stdin: false, tty: false },
  guest: { ociSpec: { process: { cwd: '/' } } },
} as unknown as ContainerRecord;

describe('the streaming server (stand-in agent, real protocols on loopback)', () => {
  let server: StreamingServer;
  let echo: net.Server;
  let echoPort: number;
  const agent = fakeAgent();
  /** A streaming server on loopback with the stand-in agent; `overrides` for one test's needs. */
  function startServer(overrides: { record?: ContainerRecord; streamIdleTimeoutMs?: number } = {}): Promise<StreamingServer> {
    const target = overrides.record ?? record;
    return StreamingServer.start({
      address: '127.0.0.1:0',
      tlsCertPath: null,
      tlsKeyPath: null,
      tokenTtlMs: 60_000,
      maxTokensInFlight: 10,
      streamCreationTimeoutMs: 2000,
      streamIdleTimeoutMs: overrides.streamIdleTimeoutMs ?? 60_000,
      logger: pino({ level: 'silent' }),
      targets: {
        container: () => ({ agent: agent as unknown as AgentClient, record: target }),
        sandboxAgent: () => agent as unknown as AgentClient,
      },
    });
  }
  const exec = (cmd: string[], extra: Partial<{ stdin: boolean; tty: boolean; stderr: boolean }> = {}) =>
    server.urlFor(decodeExecRequest({ container_id: 'c1', cmd, stdout: true, stderr: !extra.tty, ...extra }));

  beforeAll(async () => {
    server = await startServer();
    echo = net.createServer((s) => s.on('data', (d) => s.end(`HTTP/1.0 200 OK\r\n\r\nyou said ${d.toString().trim()}`)));
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
    echoPort = (echo.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await server.close();
    echo.close();
  });

  it('SPDY: stdout, stderr and exit codes through a v4+ Status, newest protocol negotiated', async () => {
    const r = await spdyCommand(exec(['sh', '-c', 'echo out; echo err >&2; exit 3']), { stderr: true });
    expect(r.protocol).toBe('v5.channel.k8s.io');
    expect(r.stdout.toString()).toBe('out\n');
    expect(r.stderr.toString()).toBe('err\n');
    expect(exitCodeOf(r.status)).toBe(3);
    expect(JSON.parse(r.status)).toMatchObject({ reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '3' }] } });
    const ok = await spdyCommand(exec(['true']), { protocols: ['v4.channel.k8s.io'] });
    expect([ok.protocol, exitCodeOf(ok.status)]).toEqual(['v4.channel.k8s.io', 0]);
  });

  it('SPDY before v4: success writes nothing, failure is plain text', async () => {
    const ok = await spdyCommand(exec(['true']), { protocols: ['v2.channel.k8s.io'] });
    expect(ok.status).toBe('');
    const bad = await spdyCommand(exec(['sh', '-c', 'exit 2']), { protocols: ['v3.channel.k8s.io'] });
    expect(bad.status).toMatch(/non-zero exit code.*exit code 2/);
  });

  it('SPDY: stdin reaches the process and its end closes it; 1 MiB of output arrives whole with or without windows', async () => {
    const r = await spdyCommand(exec(['cat'], { stdin: true }), { stdin: Buffer.from('hello\n') });
    expect(r.stdout.toString()).toBe('hello\n');
    for (const flowControl of [false, true]) {
      const big = await spdyCommand(exec(['head', '-c', '1048576', '/dev/zero']), { flowControl });
      expect(big.stdout.length).toBe(1048576);
    }
  });

  it('WebSocket v5 and v4: output, stdin with the v5 close signal, exit code', async () => {
    const r = await wsCommand(exec(['sh', '-c', 'cat; echo e >&2; exit 4'], { stdin: true }), { stdin: Buffer.from('abc') });
    expect(r.protocol).toBe('v5.channel.k8s.io');
    expect([r.stdout.toString(), r.stderr.toString(), exitCodeOf(r.status)]).toEqual(['abc', 'e\n', 4]);
    const v4 = await wsCommand(exec(['echo', 'hi']), { protocols: ['v4.channel.k8s.io'] });
    expect([v4.protocol, v4.stdout.toString(), exitCodeOf(v4.status)]).toEqual(['v4.channel.k8s.io', 'hi\n', 0]);
  });

  it('tty: the resize stream (SPDY) and channel 4 (WebSocket) reach the agent as rows and columns', async () => {
    agent.resizes.length = 0;
    const r = await spdyCommand(exec(['sh', '-c', 'sleep 0.3; echo t'], { tty: true }), { tty: true, resize: { Width: 100, Height: 31 } });
    expect(r.stdout.toString()).toBe('t\n');
    expect(agent.resizes).toEqual([[31, 100]]);
    agent.resizes.length = 0;
    const w = await wsCommand(exec(['sh', '-c', 'sleep 0.3; echo w'], { tty: true }), { resize: { Width: 90, Height: 20 } });
    expect(w.stdout.toString()).toBe('w\n');
    expect(agent.resizes).toEqual([[20, 90]]);
  });

  it('attach: the container output from now on, stdin to the container (ended when the client ends it), Success', async () => {
    agent.attachOutput = ['one\n', 'two\n'];
    agent.attachStdin.length = 0;
    const attached = { ...record, spec: { stdin: true, tty: false } } as unknown as ContainerRecord;
    const other = await startServer({ record: attached });
    try {
      const url = () => other.urlFor(decodeAttachRequest({ container_id: 'c1', stdin: true, stdout: true, stderr: true }));
      const r = await spdyCommand(url(), { stdin: Buffer.from('typed\n') });
      expect([r.stdout.toString(), exitCodeOf(r.status)]).toEqual(['one\ntwo\n', 0]);
      const w = await wsCommand(url(), { stdin: Buffer.alloc(0) });
      expect([w.stdout.toString(), exitCodeOf(w.status)]).toEqual(['one\ntwo\n', 0]);
      for (let i = 0; i < 50 && !agent.attachStdin.includes('<end>'); i++) await new Promise((res) => setTimeout(res, 20));
      expect(agent.attachStdin[0]).toBe('typed\n');
      expect(agent.attachStdin).toContain('<end>');
    } finally {
      await other.close();
    }
  });

  it('a token works once, an unknown one is 404, a plain GET is told to upgrade', async () => {
    const url = exec(['true']);
    await spdyCommand(url);
    await expect(SpdyClient.connect(url, ['v4.channel.k8s.io'])).rejects.toMatchObject({ statusCode: 404 });
    const res = await fetch(exec(['true']));
    expect(res.status).toBe(400);
    await expect(SpdyClient.connect(exec(['true']), ['v9.channel.k8s.io'])).rejects.toMatchObject({ statusCode: 403 });
  });

  it('a client that leaves mid-stream: the process is killed and forgotten', async () => {
    const client = await SpdyClient.connect(exec(['sleep', '30']), ['v4.channel.k8s.io']);
    await client.open({ streamType: 'error' });
    await client.open({ streamType: 'stdout' });
    await client.open({ streamType: 'stderr' });
    const until = async (cond: () => boolean) => {
      for (let i = 0; i < 100 && !cond(); i++) await new Promise((r) => setTimeout(r, 50));
    };
    await until(() => [...agent.procs.values()].some((p) => p.child.exitCode === null));
    const running = [...agent.procs.values()].find((p) => p.child.exitCode === null)!;
    client.close();
    expect(await running.exit).toBe(137);
    await until(() => agent.procs.size === 0);
    expect(agent.procs.size).toBe(0);
    expect(server.openStreams).toBe(0);
  });

  it('a connection idle for streamIdleTimeoutMs is closed like a client that left: its process is killed', async () => {
    const idleServer = await startServer({ streamIdleTimeoutMs: 400 });
    try {
      const url = idleServer.urlFor(decodeExecRequest({ container_id: 'c1', cmd: ['sleep', '30'], stdout: true, stderr: true }));
      const client = await SpdyClient.connect(url, ['v4.channel.k8s.io']);
      const closed = new Promise<void>((resolve) => client.socket.once('close', () => resolve()));
      await client.open({ streamType: 'error' });
      await client.open({ streamType: 'stdout' });
      await client.open({ streamType: 'stderr' });
      let running: (typeof agent.procs extends Map<unknown, infer P> ? P : never) | undefined;
      for (let i = 0; i < 100 && running === undefined; i++) {
        running = [...agent.procs.values()].find((p) => p.child.exitCode === null);
        if (running === undefined) await new Promise((r) => setTimeout(r, 20));
      }
      // `sleep` prints nothing and the client sends nothing: the connection goes quiet.
      expect(await running!.exit).toBe(137);
      await closed;
      for (let i = 0; i < 100 && idleServer.openStreams > 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect(idleServer.openStreams).toBe(0);
    } finally {
      await idleServer.close();
    }
  });

  it('port-forward over SPDY (data + error pair), WebSocket channels and SPDY tunnelled in a WebSocket', async () => {
    const pf = () => server.urlFor(decodePortForwardRequest({ pod_sandbox_id: 's1', port: [echoPort] }));
    const spdy = await spdyPortForward(pf(), echoPort, Buffer.from('ping\n'));
    expect(spdy.data.toString()).toMatch(/you said ping$/);
    expect(spdy.error).toBe('');
    const ws = await wsPortForward(pf(), echoPort, Buffer.from('pong\n'), 'you said pong');
    expect(ws.data.toString()).toMatch(/you said pong$/);
    const tunnelled = await spdyPortForward(pf(), echoPort, Buffer.from('tunnel\n'), { tunnel: true });
    expect(tunnelled.data.toString()).toMatch(/you said tunnel$/);
    const refused = await spdyPortForward(pf(), echoPort + 1, Buffer.from('x'));
    expect(refused.error).toMatch(/not forwarded/);
  });

  it('close() ends an open stream with an error status', async () => {
    const other = await startServer();
    const url = other.urlFor(decodeExecRequest({ container_id: 'c1', cmd: ['sleep', '30'], stdout: true }));
    const pending = spdyCommand(url);
    for (let i = 0; i < 100 && other.openStreams === 0; i++) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 200));
    await other.close();
    const r = await pending;
    expect(JSON.parse(r.status)).toMatchObject({ status: 'Failure', message: expect.stringMatching(/shutting down/) });
  });
});

describe('the streaming server over TLS', () => {
  it('serves https URLs with the configured certificate and key; a half-configured TLS is refused', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-stream-tls-'));
    try {
      const cert = path.join(dir, 'cert.pem');
      const key = path.join(dir, 'key.pem');
      execFileSync(
        'openssl',
        [
          'req',
          '-x509',
          '-newkey',
          'rsa:2048',
          '-nodes',
          '-keyout',
          key,
          '-out',
          cert,
          '-days',
          '1',
          '-subj',
          '/CN=127.0.0.1',
          '-addext',
          'subjectAltName=IP:127.0.0.1',
        ],
        {
          stdio: 'ignore',
        },
      );
      const base = {
        address: '127.0.0.1:0',
        tokenTtlMs: 60_000,
        maxTokensInFlight: 10,
        streamCreationTimeoutMs: 2000,
        streamIdleTimeoutMs: 60_000,
        logger: pino({ level: 'silent' }),
        targets: {
          container: () => ({ agent: fakeAgent() as unknown as AgentClient, record }),
          sandboxAgent: () => fakeAgent() as unknown as AgentClient,
        },
      };
      await expect(StreamingServer.start({ ...base, tlsCertPath: cert, tlsKeyPath: null })).rejects.toMatchObject({
        reason: 'STREAM_TLS_FILES',
      });
      const tls = await StreamingServer.start({ ...base, tlsCertPath: cert, tlsKeyPath: key });
      try {
        const url = tls.urlFor(decodeExecRequest({ container_id: 'c1', cmd: ['true'], stdout: true }));
        expect(url).toMatch(/^https:\/\/127\.0\.0\.1:\d+\/exec\//);
        // A plain GET over TLS (trusting this certificate) reaches the server, which asks for an upgrade.
        const status = await new Promise<number>((resolve, reject) => {
          https.get(url, { ca: readFileSync(cert) }, (res) => resolve(res.statusCode ?? 0)).on('error', reject);
        });
        expect(status).toBe(400);
      } finally {
        await tls.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('tokens and request checks', () => {
  it('a token is single use, expires, and the store is bounded', () => {
    let now = 0;
    const store = new TokenStore<string>({ ttlMs: 60_000, maxInFlight: 2, nowMs: () => now });
    const a = store.issue('a');
    const b = store.issue('b');
    expect(a).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect(() => store.issue('c')).toThrow(expect.objectContaining({ kind: 'exhausted', reason: 'STREAM_TOKENS_EXHAUSTED' }));
    expect(store.consume(a)).toBe('a');
    expect(store.consume(a)).toBeUndefined();
    now = 60_000;
    expect(store.consume(b)).toBeUndefined();
    expect(store.size).toBe(0);
    store.issue('d');
    now = 120_001;
    expect(store.size).toBe(0);
  });

  it('Exec/Attach/PortForward requests are checked as the kubelet checks them', () => {
    const e = (raw: object) => () => decodeExecRequest(raw);
    expect(e({ cmd: ['x'], stdout: true })).toThrow(
      expect.objectContaining({ kind: 'invalid', message: expect.stringMatching(/container_id/) }),
    );
    expect(e({ container_id: 'c', cmd: ['x'], tty: true, stderr: true })).toThrow(/tty and stderr/);
    expect(e({ container_id: 'c', cmd: ['x'] })).toThrow(/stdin, stdout, or stderr/);
    expect(e({ container_id: 'c', cmd: [], stdout: true })).toThrow(/cmd is empty/);
    expect(decodeAttachRequest({ container_id: 'c', stdin: true, tty: true })).toMatchObject({ kind: 'attach', stdin: true, tty: true });
    expect(() => decodePortForwardRequest({ port: [80] })).toThrow(/pod_sandbox_id/);
    expect(() => decodePortForwardRequest({ pod_sandbox_id: 's', port: [70000] })).toThrow(/70000/);
  });
});
