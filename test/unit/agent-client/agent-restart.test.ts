import type { Buffer } from 'node:buffer';
import type { Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { AgentService } from '../../../guest/agent/server.js';
import { AgentClient } from '../../../src/agent-client/index.js';
import { ChannelServer } from '../../../src/channel/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { duplexPair } from '../channel/helpers.js';
import { FakeContainerBackend } from './fake-backend.js';

/**
 * The guest's port outlives both the host's connections and the agent: `dial` is the host
 * connecting to QEMU's socket, `restartAgent` a new agent process on the same port, `hang` a
 * guest that stops reading.
 */
function port() {
  let current: Duplex | undefined;
  let agent: ChannelServer | undefined;
  const link = {
    send: async (bytes: Buffer) => {
      current?.write(bytes);
    },
  };
  const startAgent = () => {
    const service = new AgentService({ backend: new FakeContainerBackend(), agentVersion: 't', logger: silentLogger() });
    agent = new ChannelServer(link, (s) => service.attach(s));
    agent.announce();
    return service;
  };
  return {
    startAgent,
    hang: () => {
      agent = undefined;
    },
    dial: (): Duplex => {
      const [host, guest] = duplexPair();
      current = guest;
      guest.on('data', (chunk: Buffer) => agent?.feed(chunk));
      guest.once('close', () => agent?.linkLost());
      return host;
    },
  };
}

const T = { timeoutMs: 3000 };

describe('agent restarts and hangs', () => {
  it('a restarted agent announces itself and the host moves to a session with it', async () => {
    const p = port();
    const first = p.startAgent();
    const client = await AgentClient.connect(
      { socketPath: 'unused', logger: silentLogger(), hostVersion: 't', dial: p.dial, minBackoffMs: 10 },
      3000,
    );
    try {
      expect(client.connection.hello?.agentInstanceId).toBe(first.instanceId);
      const second = p.startAgent();
      await expect.poll(() => client.connection.hello?.agentInstanceId).toBe(second.instanceId);
      expect(await client.listContainers([], T)).toEqual([]);
    } finally {
      client.close();
    }
  });

  it('a guest that stops answering fails the keepalive; the host reconnects when it is back', async () => {
    const p = port();
    p.startAgent();
    const client = await AgentClient.connect(
      { socketPath: 'unused', logger: silentLogger(), hostVersion: 't', dial: p.dial, minBackoffMs: 10, keepaliveIntervalMs: 50 },
      3000,
    );
    try {
      p.hang();
      await expect.poll(() => client.connection.connected).toBe(false);
      const back = p.startAgent();
      await expect.poll(() => client.connection.hello?.agentInstanceId, { timeout: 5000 }).toBe(back.instanceId);
      expect(await client.listContainers([], T)).toEqual([]);
    } finally {
      client.close();
    }
  });
});
