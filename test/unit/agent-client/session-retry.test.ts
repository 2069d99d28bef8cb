import type { Buffer } from 'node:buffer';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AgentService } from '../../../guest/agent/server.js';
import { AgentClient, retryableAfterSessionEnd } from '../../../src/agent-client/index.js';
import { ChannelServer } from '../../../src/channel/index.js';
import { isKataError } from '../../../src/common/errors.js';
import { createLogger, type Logger } from '../../../src/common/logger.js';
import { FakeContainerBackend } from './fake-backend.js';

/**
 * The guest's side of QEMU's agent socket, over a real unix socket: the client under test dials
 * `socketPath` with its own code (connectUnixNoFollow), one agent (AgentService + ChannelServer)
 * serves every connection in turn, as the guest's port outlives the host's connections.
 * `stall()` makes the guest stop taking bytes from the connection of that moment (its vCPUs not
 * scheduled on a loaded host): nothing it is sent is read, so PINGs go unanswered, until
 * `unstall()` feeds what queued. A new connection is never stalled.
 */
class GuestPort {
  readonly backend = new GatedBackend();
  readonly service = new AgentService({ backend: this.backend, agentVersion: 't', logger: createLogger({ level: 'silent' }) });
  private current: net.Socket | undefined;
  private stalled: Buffer[] | undefined;
  private readonly server: net.Server;
  private readonly agent: ChannelServer;
  connections = 0;

  constructor(readonly socketPath: string) {
    this.agent = new ChannelServer(
      {
        send: async (bytes: Buffer) => {
          this.current?.write(bytes);
        },
      },
      (s) => this.service.attach(s),
    );
    this.server = net.createServer((socket) => {
      this.connections += 1;
      this.current?.destroy();
      this.current = socket;
      this.stalled = undefined;
      socket.on('data', (chunk: Buffer) => {
        if (socket !== this.current) return;
        if (this.stalled !== undefined) this.stalled.push(chunk);
        else this.agent.feed(chunk);
      });
      socket.on('error', () => {});
      socket.once('close', () => {
        if (socket !== this.current) return;
        this.current = undefined;
        this.stalled = undefined;
        this.agent.linkLost();
      });
    });
  }

  listen(): Promise<void> {
    return new Promise((resolve) => this.server.listen(this.socketPath, resolve));
  }

  stall(): void {
    this.stalled ??= [];
  }

  unstall(): void {
    const queued = this.stalled ?? [];
    this.stalled = undefined;
    for (const chunk of queued) this.agent.feed(chunk);
  }

  /** Close the connection of this moment from the guest's side (QEMU's socket lost its peer). */
  dropConnection(): void {
    this.current?.destroy();
  }

  /** No more connections (an agent that is gone for good); the current one is closed. */
  async shut(): Promise<void> {
    this.current?.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/**
 * A fake backend (nothing runs) whose signal and exec calls can be held open: `holdNext` makes
 * the next such call stall the guest (the call reached the agent and is in progress when the
 * guest stops answering) and wait until released.
 */
class GatedBackend extends FakeContainerBackend {
  readonly signals: number[] = [];
  execCalls = 0;
  private hold: { onCall: () => void; released: Promise<void> } | undefined;

  holdNext(onCall: () => void): () => void {
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    this.hold = { onCall, released };
    return release;
  }

  private async gate(): Promise<void> {
    const hold = this.hold;
    this.hold = undefined;
    if (hold === undefined) return;
    hold.onCall();
    await hold.released;
  }

  override signalContainer = async (id: string, signal: number) => {
    this.container(id);
    this.signals.push(signal);
    await this.gate();
  };

  constructor() {
    super();
    const base = this.execProcess;
    this.execProcess = async (req: { containerId: string; execId: string }) => {
      this.execCalls += 1;
      await this.gate();
      return base(req);
    };
  }
}

/** A logger whose warnings the test can wait on (the keepalive's misses, the retry). */
function recordingLogger(): { logger: Logger; lines: Array<{ msg: string }> } {
  const lines: Array<{ msg: string }> = [];
  const logger = createLogger({ level: 'warn', destination: { write: (line: string) => void lines.push(JSON.parse(line)) } });
  return { logger, lines };
}

let dir: string;
let port: GuestPort;
let client: AgentClient | undefined;
const releases: Array<() => void> = [];

beforeEach(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kata-ts-retry-'));
  port = new GuestPort(path.join(dir, 'agent.sock'));
  await port.listen();
});

afterEach(async () => {
  for (const r of releases.splice(0)) r();
  client?.close();
  client = undefined;
  await port.shut();
  fs.rmSync(dir, { recursive: true, force: true });
});

async function connect(logger: Logger, keepalive: { keepaliveIntervalMs: number; keepaliveMisses?: number }): Promise<AgentClient> {
  client = await AgentClient.connect(
    { socketPath: port.socketPath, logger, hostVersion: 't', minBackoffMs: 10, maxBackoffMs: 50, ...keepalive },
    10_000,
  );
  await client.createContainer({ containerId: 'c1' }, { timeoutMs: 10_000 });
  return client;
}

/** The next held backend call stalls the guest's connection of that moment. */
function stallOnNextCall(): void {
  releases.push(port.backend.holdNext(() => port.stall()));
}

describe('a call in flight when the agent session ends', () => {
  it('an idempotent kill (SIGKILL) cut off by a missed keepalive is sent again on the next session and succeeds', async () => {
    const { logger, lines } = recordingLogger();
    const c = await connect(logger, { keepaliveIntervalMs: 200 });
    const firstSession = c.connection.currentSession;
    stallOnNextCall();
    // Without the retry this rejects with the keepalive's AGENT_KEEPALIVE_FAILED.
    await c.signalContainer('c1', 9, true, { timeoutMs: 20_000 });
    expect(port.backend.signals).toEqual([9, 9]);
    expect(c.connection.currentSession).not.toBe(firstSession);
    expect(port.connections).toBeGreaterThanOrEqual(2);
    // The same agent answered both sessions: the agent was fine, only the session ended.
    expect(c.connection.hello?.agentInstanceId).toBe(port.service.instanceId);
    expect(lines.map((l) => l.msg)).toContain('the agent session ended under an idempotent call; sending it again on the next session');
  });

  it('a non-idempotent call (exec) is not sent again: it fails with AGENT_SESSION_ENDED, saying the session ended', async () => {
    const c = await connect(recordingLogger().logger, { keepaliveIntervalMs: 200 });
    stallOnNextCall();
    const err = await c.execProcess({ containerId: 'c1', execId: 'e1', ociProcessJson: '{"args":["true"]}' }, { timeoutMs: 20_000 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isKataError(err) && err.reason).toBe('AGENT_SESSION_ENDED');
    expect(isKataError(err) && err.kind).toBe('unavailable');
    expect((err as Error).message).toMatch(/^ExecProcess was in flight when the agent session ended \(.*ping/);
    expect(port.backend.execCalls).toBe(1);
  });

  it('a catchable signal (SIGTERM) is not sent twice', async () => {
    const c = await connect(recordingLogger().logger, { keepaliveIntervalMs: 200 });
    stallOnNextCall();
    const err = await c.signalContainer('c1', 15, false, { timeoutMs: 20_000 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isKataError(err) && err.reason).toBe('AGENT_SESSION_ENDED');
    expect(port.backend.signals).toEqual([15]);
  });

  it('a link that drops under the call (the socket closes) is retried the same way', async () => {
    const c = await connect(recordingLogger().logger, { keepaliveIntervalMs: 0 });
    releases.push(
      port.backend.holdNext(() => {
        // The guest's side of the socket goes away while the agent is still working on the call.
        setImmediate(() => port.dropConnection());
      }),
    );
    await c.signalContainer('c1', 9, false, { timeoutMs: 20_000 });
    expect(port.backend.signals).toEqual([9, 9]);
  });

  it('an idempotent call with no new session within its deadline fails with a timeout naming why', async () => {
    const c = await connect(recordingLogger().logger, { keepaliveIntervalMs: 200 });
    releases.push(
      port.backend.holdNext(() => {
        port.stall();
        // The guest never takes a connection again.
        void port.shut();
      }),
    );
    const err = await c.signalContainer('c1', 9, false, { timeoutMs: 1500 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isKataError(err) && err.reason).toBe('AGENT_SESSION_ENDED');
    expect(isKataError(err) && err.kind).toBe('timeout');
    expect((err as Error).message).toMatch(/no new session came within its 1500 ms deadline/);
    port = new GuestPort(path.join(dir, 'agent2.sock'));
    await port.listen();
  });

  it("the caller's own deadline is not a session end: nothing is sent again", async () => {
    const c = await connect(recordingLogger().logger, { keepaliveIntervalMs: 0 });
    releases.push(port.backend.holdNext(() => {}));
    const err = await c.signalContainer('c1', 9, false, { timeoutMs: 300 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isKataError(err) && err.reason).toBe('CHANNEL_CALL_TIMEOUT');
    expect(port.backend.signals).toEqual([9]);
    expect(port.connections).toBe(1);
  });
});

describe('keepalive miss tolerance', () => {
  it('with misses > 1, a guest that misses fewer pings in a row keeps its session', async () => {
    const { logger, lines } = recordingLogger();
    const c = await connect(logger, { keepaliveIntervalMs: 30, keepaliveMisses: 1000 });
    const session = c.connection.currentSession;
    port.stall();
    const missed = () => lines.filter((l) => l.msg === 'the agent did not answer a ping in time; waiting for the next').length;
    await expect.poll(missed, { timeout: 20_000 }).toBeGreaterThanOrEqual(3);
    port.unstall();
    expect(await c.listContainers([], { timeoutMs: 10_000 })).toHaveLength(1);
    expect(c.connection.currentSession).toBe(session);
    expect(port.connections).toBe(1);
  });

  it('with the default of one miss, the first unanswered ping ends the session', async () => {
    const c = await connect(recordingLogger().logger, { keepaliveIntervalMs: 30 });
    const session = c.connection.currentSession;
    port.stall();
    await expect.poll(() => session?.closed, { timeout: 20_000 }).toBe(true);
    expect(session?.closeError && isKataError(session.closeError) && session.closeError.reason).toBe('AGENT_KEEPALIVE_FAILED');
    await expect.poll(() => c.connection.connected, { timeout: 20_000 }).toBe(true);
    expect(port.connections).toBeGreaterThanOrEqual(2);
  });
});

describe('which calls are sent again', () => {
  it('reads, waits and repeatable signals are; create, start, exec, delete and catchable signals are not', () => {
    expect(retryableAfterSessionEnd('ListContainers', {})).toBe(true);
    expect(retryableAfterSessionEnd('WaitContainer', { containerId: 'c' })).toBe(true);
    expect(retryableAfterSessionEnd('SignalContainer', { containerId: 'c', signal: 9 })).toBe(true);
    expect(retryableAfterSessionEnd('SignalProcess', { containerId: 'c', execId: 'e', signal: 9 })).toBe(true);
    expect(retryableAfterSessionEnd('SignalContainer', { containerId: 'c', signal: 15 })).toBe(false);
    expect(retryableAfterSessionEnd('CreateContainer', { containerId: 'c' })).toBe(false);
    expect(retryableAfterSessionEnd('StartContainer', { containerId: 'c' })).toBe(false);
    expect(retryableAfterSessionEnd('ExecProcess', { containerId: 'c', execId: 'e' })).toBe(false);
    expect(retryableAfterSessionEnd('DeleteContainer', { containerId: 'c' })).toBe(false);
  });
});
