import { Buffer } from 'node:buffer';
import { randomFillSync } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { AgentService } from '../../../guest/agent/server.js';
import { AGENT_PROTOCOL_VIOLATIONS_MAX, AgentClient, AgentConnection } from '../../../src/agent-client/index.js';
import { ChannelServer, connectSession } from '../../../src/channel/index.js';
import type { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { duplexPair } from '../channel/helpers.js';
import { FakeContainerBackend } from './fake-backend.js';

/** Junk that is no frame: random bytes with the resync marker's first byte taken out. */
function junk(bytes: number): Buffer {
  const b = randomFillSync(Buffer.alloc(bytes));
  for (let i = 0; i < b.length; i++) if (b[i] === 0xff) b[i] = 0;
  return b;
}

/** A guest end that writes junk in 16 KiB pieces, one per turn, until the host end goes. */
function flood(guest: Duplex): { sentBytes: () => number } {
  let sent = 0;
  const pump = (): void => {
    if (guest.destroyed) return;
    guest.write(junk(16 * 1024));
    sent += 16 * 1024;
    setImmediate(pump);
  };
  guest.on('error', () => undefined);
  setImmediate(pump);
  return { sentBytes: () => sent };
}

describe('a guest that floods the agent channel', () => {
  it('connecting: past helloFloodMaxBytes without a HELLO_ACK the attempt fails with CHANNEL_HELLO_FLOOD', async () => {
    const [host, guest] = duplexPair();
    const f = flood(guest);
    await expect(connectSession(host, { timeoutMs: 10_000, helloFloodMaxBytes: 256 * 1024 })).rejects.toMatchObject({
      reason: 'CHANNEL_HELLO_FLOOD',
    });
    // Given up at the bound, not at the timeout: the guest got little further.
    expect(f.sentBytes()).toBeLessThan(512 * 1024);
    expect(host.destroyed).toBe(true);
  });

  it(`a guest that floods every dial ends the connection after ${AGENT_PROTOCOL_VIOLATIONS_MAX} violations with AGENT_PROTOCOL_VIOLATION`, async () => {
    let dials = 0;
    const connection = new AgentConnection({
      socketPath: 'unused',
      logger: silentLogger(),
      hostVersion: 't',
      minBackoffMs: 1,
      helloFloodMaxBytes: 64 * 1024,
      dial: () => {
        dials += 1;
        const [host, guest] = duplexPair();
        flood(guest);
        return host;
      },
    });
    const seen: KataError[] = [];
    connection.onViolation((err) => seen.push(err));
    const err = (await connection.start(30_000).catch((e: unknown) => e)) as KataError;
    expect(err).toMatchObject({ reason: 'AGENT_PROTOCOL_VIOLATION' });
    expect(err.message).toContain('without answering HELLO');
    expect(seen.map((e) => e.reason)).toEqual(['AGENT_PROTOCOL_VIOLATION']);
    expect(dials).toBe(AGENT_PROTOCOL_VIOLATIONS_MAX);
    // It stays given up: no more dials, calls fail with the same reason, a late listener hears it at once.
    await new Promise((r) => setTimeout(r, 50));
    expect(dials).toBe(AGENT_PROTOCOL_VIOLATIONS_MAX);
    await expect(connection.ready(100)).rejects.toMatchObject({ reason: 'AGENT_PROTOCOL_VIOLATION' });
    let late = '';
    connection.onViolation((e) => (late = e.reason));
    expect(late).toBe('AGENT_PROTOCOL_VIOLATION');
  });

  it('an agent taken over after its session started: the broken session and the flooded re-dials fail the connection', async () => {
    let dials = 0;
    let hostile = false;
    const connection = new AgentConnection({
      socketPath: 'unused',
      logger: silentLogger(),
      hostVersion: 't',
      minBackoffMs: 1,
      keepaliveIntervalMs: 0,
      helloFloodMaxBytes: 64 * 1024,
      dial: () => {
        dials += 1;
        const [host, guest] = duplexPair();
        if (hostile) flood(guest);
        else serveHonestly(guest);
        return host;
      },
    });
    const client = new AgentClient(connection);
    await connection.start(5_000);
    expect(await client.listContainers([], { timeoutMs: 3_000 })).toEqual([]);
    const failed = new Promise<KataError>((resolve) => connection.onViolation(resolve));
    // The guest's root replaces the agent: junk on the live session, and on every new one.
    hostile = true;
    current?.write(junk(4096));
    const err = await failed;
    expect(err.reason).toBe('AGENT_PROTOCOL_VIOLATION');
    expect(err.message).toContain('(CHANNEL_DESYNC, CHANNEL_HELLO_FLOOD, CHANNEL_HELLO_FLOOD; last: the agent sent over');
    // One broken session, then re-dials until the bound.
    expect(dials).toBe(AGENT_PROTOCOL_VIOLATIONS_MAX);
    await expect(client.listContainers([], { timeoutMs: 200 })).rejects.toMatchObject({ reason: 'AGENT_PROTOCOL_VIOLATION' });
  });

  it('an honest agent that breaks framing once (it died mid-frame) is reconnected to, and the count starts over', async () => {
    let dials = 0;
    const connection = new AgentConnection({
      socketPath: 'unused',
      logger: silentLogger(),
      hostVersion: 't',
      minBackoffMs: 1,
      keepaliveIntervalMs: 0,
      dial: () => {
        dials += 1;
        const [host, guest] = duplexPair();
        serveHonestly(guest);
        return host;
      },
    });
    const client = new AgentClient(connection);
    let violated = false;
    connection.onViolation(() => (violated = true));
    await connection.start(5_000);
    // More broken sessions in all than the bound, but a Hello completes between each.
    for (let i = 1; i <= AGENT_PROTOCOL_VIOLATIONS_MAX + 2; i++) {
      const before = dials;
      current?.write(junk(64));
      await expect.poll(() => dials > before && connection.connected, { timeout: 3_000 }).toBe(true);
    }
    expect(violated).toBe(false);
    expect(await client.listContainers([], { timeoutMs: 3_000 })).toEqual([]);
    connection.close();
  });
});

/** The guest end of the latest dial: what a hostile guest writes on. */
let current: Duplex | undefined;

/** A real agent service (fake containers) on the guest end of one dial. */
function serveHonestly(guest: Duplex): void {
  current = guest;
  const service = new AgentService({ backend: new FakeContainerBackend(), agentVersion: 't', logger: silentLogger() });
  const server = new ChannelServer({ send: async (bytes) => void guest.write(bytes) }, (s) => service.attach(s));
  guest.on('data', (chunk: Buffer) => server.feed(chunk));
  guest.on('error', () => undefined);
  guest.once('close', () => server.linkLost());
}
