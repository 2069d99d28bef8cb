/**
 * The EventPublisher against a scripted containerd: a TtrpcServer (src/ttrpc) serving the events
 * service's Forward on a unix socket, recording what arrives and answering as each test scripts
 * it. Checks the envelope, the namespace, order under concurrent publishing and failures,
 * retries across a server restart, dropping, and close()'s bound.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { internal, invalid } from '../../../src/common/errors.js';
import { createLogger } from '../../../src/common/logger.js';
import { EventPublisher, type EventPublisherOptions } from '../../../src/shim/events.js';
import {
  decodeAny,
  decodeMessage,
  EVENTS_FORWARD,
  EVENTS_SERVICE,
  type Message,
  NAMESPACE_METADATA_KEY,
  timestampOfNs,
} from '../../../src/shim/proto.js';
import { type TtrpcCall, TtrpcServer } from '../../../src/ttrpc/index.js';
import { until } from '../../helpers/poll.js';
import { deferred, socketDir } from '../ttrpc/helpers.js';

type Envelope = Message<'containerd.services.events.ttrpc.v1.Envelope'>;

interface Received {
  envelope: Envelope;
  metadata: ReadonlyMap<string, readonly string[]>;
}

/** containerd's events service as far as a shim sees it, with a script for each Forward. */
class FakeContainerd {
  readonly received: Received[] = [];
  /** Every Forward call, answered or not, by topic. */
  readonly attempts: string[] = [];
  inFlight = 0;
  maxInFlight = 0;
  /** Decides each call's fate; the default accepts it. */
  script: (envelope: Envelope, call: TtrpcCall) => Promise<void> | void = () => {};
  private server: TtrpcServer | undefined;

  constructor(private readonly socketPath: string) {}

  async start(): Promise<void> {
    const server = new TtrpcServer();
    server.register(EVENTS_SERVICE, {
      [EVENTS_FORWARD]: async (bytes, call) => {
        const { envelope } = decodeMessage('containerd.services.events.ttrpc.v1.ForwardRequest', bytes);
        if (envelope === null) throw invalid('SHIM_PROTO_BAD_MESSAGE', 'no envelope');
        this.attempts.push(envelope.topic);
        this.inFlight += 1;
        this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
        try {
          await this.script(envelope, call);
        } finally {
          this.inFlight -= 1;
        }
        this.received.push({ envelope, metadata: call.metadata });
        return new Uint8Array(0);
      },
    });
    await server.listen(this.socketPath);
    this.server = server;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    server?.destroy();
    await server?.close();
  }

  topics(): string[] {
    return this.received.map((r) => r.envelope.topic);
  }

  containerIds(): string[] {
    return this.received.map((r) => (decodeAny(r.envelope.event!, 'containerd.events.TaskOOM') as { container_id: string }).container_id);
  }
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

describe('EventPublisher', () => {
  let dir: ReturnType<typeof socketDir>;
  let containerd: FakeContainerd;
  let publisher: EventPublisher | undefined;
  let address: string;

  const open = (options: Partial<EventPublisherOptions> = {}): EventPublisher => {
    publisher = new EventPublisher({ address, namespace: 'k8s.io', initialBackoffMs: 10, maxBackoffMs: 40, ...options });
    return publisher;
  };

  beforeEach(async () => {
    dir = socketDir();
    address = dir.socket('containerd.sock.ttrpc');
    containerd = new FakeContainerd(address);
    await containerd.start();
  });

  afterEach(async () => {
    await publisher?.close(200);
    publisher = undefined;
    await containerd.stop();
    dir.remove();
  });

  it('forwards an Envelope: publish time, namespace, topic, the event as a containerd.events Any; the namespace in the metadata too', async () => {
    const nowNs = 1_700_000_000_123_456_789n;
    const p = open({ nowNs: () => nowNs, address: `unix://${address}` });
    p.publish('/tasks/exit', { container_id: 'c1', id: 'c1', pid: 42, exit_status: 137, exited_at: timestampOfNs(nowNs - 5n) });
    await p.idle();
    expect(containerd.received).toHaveLength(1);
    const { envelope, metadata } = containerd.received[0]!;
    expect(envelope.timestamp).toEqual(timestampOfNs(nowNs));
    expect(envelope.namespace).toBe('k8s.io');
    expect(envelope.topic).toBe('/tasks/exit');
    expect(envelope.event?.type_url).toBe('containerd.events.TaskExit');
    expect(decodeAny(envelope.event!, 'containerd.events.TaskExit')).toEqual({
      container_id: 'c1',
      id: 'c1',
      pid: 42,
      exit_status: 137,
      exited_at: timestampOfNs(nowNs - 5n),
    });
    expect(metadata.get(NAMESPACE_METADATA_KEY)).toEqual(['k8s.io']);
  });

  it('stamps each envelope when it is published, not when it is sent', async () => {
    let now = 1_000_000_000n;
    const p = open({ nowNs: () => now });
    const gate = deferred();
    containerd.script = () => gate.promise;
    p.publish('/tasks/start', { container_id: 'a', pid: 1 });
    now = 2_000_000_000n;
    p.publish('/tasks/start', { container_id: 'b', pid: 2 });
    now = 9_000_000_000n;
    gate.resolve();
    await p.idle();
    expect(containerd.received.map((r) => r.envelope.timestamp?.seconds)).toEqual(['1', '2']);
  });

  it('keeps publish order, one Forward at a time, under concurrent publishing and slow answers', async () => {
    const p = open();
    containerd.script = () => sleep(Math.floor(Math.random() * 3));
    const published: string[] = [];
    await Promise.all(
      Array.from({ length: 40 }, async (_, i) => {
        await sleep(Math.floor(Math.random() * 5));
        published.push(`c${i}`);
        p.publish('/tasks/oom', { container_id: `c${i}` });
      }),
    );
    await p.idle();
    expect(containerd.containerIds()).toEqual(published);
    expect(containerd.maxInFlight).toBe(1);
  });

  it('retries a failed event before sending the next, so order holds across failures', async () => {
    const p = open();
    let failures = 2;
    containerd.script = (envelope) => {
      const id = (decodeAny(envelope.event!, 'containerd.events.TaskOOM') as { container_id: string }).container_id;
      if (id === 'c2' && failures-- > 0) throw internal('SHIM_PROTO_ENCODE', 'scripted failure');
    };
    for (let i = 0; i < 5; i++) p.publish('/tasks/oom', { container_id: `c${i}` });
    await p.idle();
    expect(containerd.containerIds()).toEqual(['c0', 'c1', 'c2', 'c3', 'c4']);
    expect(containerd.attempts).toHaveLength(7);
  });

  it('reconnects and delivers once containerd is back after a restart', async () => {
    const p = open({ maxAttempts: 1000 });
    p.publish('/tasks/create', { container_id: 'c0', pid: 1 });
    await p.idle();
    await containerd.stop();
    p.publish('/tasks/start', { container_id: 'c0', pid: 1 });
    p.publish('/tasks/exit', { container_id: 'c0', id: 'c0', pid: 1, exit_status: 0 });
    // It tries, fails (no socket), and keeps trying with its pause.
    await sleep(60);
    expect(p.queued).toBe(2);
    const restarted = new FakeContainerd(address);
    await restarted.start();
    const old = containerd;
    containerd = restarted;
    await p.idle();
    expect(old.topics()).toEqual(['/tasks/create']);
    expect(restarted.topics()).toEqual(['/tasks/start', '/tasks/exit']);
  });

  it('drops an event after maxAttempts failures, and at once when containerd refuses the envelope itself', async () => {
    const p = open({ maxAttempts: 3 });
    containerd.script = (envelope) => {
      if (envelope.topic === '/tasks/paused') throw internal('SHIM_PROTO_ENCODE', 'scripted failure');
      if (envelope.topic === '/tasks/resumed') throw invalid('SHIM_PROTO_BAD_MESSAGE', 'scripted refusal');
    };
    p.publish('/tasks/paused', { container_id: 'c' });
    p.publish('/tasks/resumed', { container_id: 'c' });
    p.publish('/tasks/delete', { container_id: 'c', pid: 1, exit_status: 0 });
    await p.idle();
    expect(containerd.attempts).toEqual(['/tasks/paused', '/tasks/paused', '/tasks/paused', '/tasks/resumed', '/tasks/delete']);
    expect(containerd.topics()).toEqual(['/tasks/delete']);
  });

  it('close() sends what is queued, then takes no more events', async () => {
    const p = open();
    containerd.script = () => sleep(10);
    p.publish('/tasks/exec-added', { container_id: 'c', exec_id: 'e' });
    p.publish('/tasks/exec-started', { container_id: 'c', exec_id: 'e', pid: 3 });
    p.publish('/tasks/exit', { container_id: 'c', id: 'e', pid: 3, exit_status: 1 });
    await p.close(2000);
    expect(containerd.topics()).toEqual(['/tasks/exec-added', '/tasks/exec-started', '/tasks/exit']);
    p.publish('/tasks/oom', { container_id: 'c' });
    await p.idle();
    expect(containerd.attempts).toHaveLength(3);
  });

  it('close() returns within its bound when containerd never answers, dropping what is left', async () => {
    const p = open();
    containerd.script = () => new Promise<void>(() => {});
    p.publish('/tasks/oom', { container_id: 'a' });
    p.publish('/tasks/oom', { container_id: 'b' });
    await until('the first Forward arrives', async () => (containerd.attempts.length === 1 ? true : undefined), 5000, 5);
    const started = Date.now();
    await p.close(150);
    expect(Date.now() - started).toBeLessThan(1000);
    expect(p.queued).toBe(0);
    expect(containerd.received).toEqual([]);
  });

  it('close() returns within its bound when containerd is not there at all', async () => {
    await containerd.stop();
    const p = open({ maxAttempts: 1000 });
    p.publish('/tasks/oom', { container_id: 'a' });
    const started = Date.now();
    await p.close(100);
    expect(Date.now() - started).toBeLessThan(1000);
    expect(p.queued).toBe(0);
  });

  it('with no address (CRI-O starts the shim with TTRPC_ADDRESS empty) drops every event at once, said once in the log', async () => {
    const lines: Array<{ level: string; msg: string }> = [];
    const logger = createLogger({ level: 'debug', destination: { write: (line: string) => lines.push(JSON.parse(line)) } });
    for (const empty of ['', 'unix://']) {
      const p = open({ address: empty, logger, maxAttempts: 1000 });
      for (let i = 0; i < 20; i++) p.publish('/tasks/exit', { container_id: `c${i}`, id: `c${i}`, pid: 1, exit_status: 0 });
      expect(p.queued).toBe(0);
      await p.idle();
      const started = Date.now();
      await p.close(5000);
      expect(Date.now() - started).toBeLessThan(500);
    }
    // One line per publisher, at info: no warning, no retry, no error, nothing sent.
    expect(lines.map((l) => l.level)).toEqual(['info', 'info']);
    expect(lines[0]!.msg).toContain('TTRPC_ADDRESS is empty');
    expect(containerd.attempts).toEqual([]);
  });

  it('pairs each topic with its event type at compile time', () => {
    const p = open();
    // @ts-expect-error a TaskOOM carries no exit_status
    p.publish('/tasks/oom', { container_id: 'c', exit_status: 1 });
    // @ts-expect-error no such topic (and at run time no event type to encode)
    expect(() => p.publish('/tasks/bogus', { container_id: 'c' })).toThrow();
    expect(p.queued).toBeLessThanOrEqual(1);
  });
});
