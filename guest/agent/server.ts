/**
 * The agent's side of the API: every call of proto/agent/agent.proto, served on each channel
 * session the host starts. State that must survive a host reconnect (containers' output
 * journals, stdin pipes, exec'd processes) lives here, not in a session.
 */
import { Buffer } from 'node:buffer';
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import type { Readable, Writable } from 'node:stream';
import { protobufCodec, type ServerHandlers, type Session, serveRpc } from '../../src/channel/index.js';
import { readChunks } from '../../src/channel/records.js';
import { alreadyExists, invalid, isKataError, notFound, precondition, unavailable, unimplemented } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';
import {
  AGENT_API_VERSION,
  AGENT_DESCRIPTOR,
  AGENT_METHODS,
  type AgentMethods,
  type CreateContainerRequest,
  type GuestEvent,
} from '../../src/generated/agent/agent.js';
import type { BackendEvent, ContainerBackend, ProcessStdio } from './backend.js';
import type { TrimNotice } from './idle-trim.js';
import type { GuestNetwork } from './network.js';
import { OutputJournal } from './output-journal.js';
import { spoolJournal } from './output-spool.js';
import type { PodService } from './pods.js';
import type { GuestReseed } from './reseed.js';
import type { SecretVolumes } from './secret-volumes.js';
import { TpmClient, type TpmTransport } from './tpm.js';

export interface AgentServiceOptions {
  backend: ContainerBackend;
  agentVersion: string;
  logger: Logger;
  /** Unacknowledged output kept per container before the container is throttled. */
  outputLimitBytes?: number;
  /** Events kept for a GuestEvents reader that falls behind; older ones are dropped (they are hints). */
  eventQueueLength?: number;
  /** CreatePod, DestroyPod, StatSharedPath; absent: those calls answer UNIMPLEMENTED (unit tests). */
  pods?: PodService;
  /** ConfigureNetwork; absent: that call answers UNIMPLEMENTED (unit tests). */
  network?: GuestNetwork;
  /** Told after ConfigureNetwork succeeded (the attester retries a broker it could not reach yet). */
  onNetworkConfigured?: () => void;
  /** How PortForward reaches a port; the guest's loopback by default. */
  connectPort?: (port: number) => net.Socket;
  /**
   * Told when each piece of container work begins and ends (the pod created or destroyed, a
   * container created, started or deleted, an exec started or deleted): the guest's memory trim
   * (guest/agent/idle-trim.ts) runs once none is in flight and the guest has been quiet a while.
   */
  idleTrim?: TrimNotice;
  /** Opens the guest's TPM for GetTpmQuote (guest/agent/tpm-device.ts); absent: the call answers TPM_UNAVAILABLE. */
  openTpm?: () => Promise<TpmTransport>;
  /**
   * Containers' secrets (CreateContainerRequest.secrets, guest/agent/secret-volumes.ts); absent:
   * a container that asks for any is refused (AGENT_NO_SECRET_SERVICE).
   */
  secrets?: SecretVolumes;
  /** ReseedGuest after a template restore (guest/agent/reseed.ts); absent: that call answers UNIMPLEMENTED. */
  reseed?: GuestReseed;
}

interface ContainerIo {
  journal: OutputJournal;
  stdin: Writable | undefined;
  stdinOnce: boolean;
}

const codec = protobufCodec(AGENT_DESCRIPTOR);

/** Write and wait for the pipe to take it, so the host's stdin stream is paced by the process. */
function writeAll(target: Writable, data: Uint8Array): Promise<void> {
  return new Promise((resolve, reject) => {
    if (target.destroyed || target.writableEnded) return reject(precondition('STDIN_CLOSED', 'the process stdin is closed.'));
    target.write(data, (err) => (err ? reject(err) : resolve()));
  });
}

export class AgentService {
  readonly instanceId = randomUUID();
  private readonly containers = new Map<string, ContainerIo>();
  private readonly processes = new Map<string, { stdio: ProcessStdio; reading: Set<string> }>();
  private readonly outputLimitBytes: number;

  constructor(private readonly options: AgentServiceOptions) {
    this.outputLimitBytes = options.outputLimitBytes ?? 1024 * 1024;
  }

  /** Serve the API on a new session (the old one, if any, has ended). */
  attach(session: Session): void {
    serveRpc(session, AGENT_METHODS, this.handlers(), codec, this.options.logger);
  }

  handlers(): ServerHandlers<AgentMethods> {
    const { backend } = this.options;
    return {
      Hello: async (req) => {
        this.options.logger.info({ hostApiVersion: req.apiVersion, hostVersion: req.hostVersion }, 'host session started');
        return {
          apiVersion: AGENT_API_VERSION,
          agentVersion: this.options.agentVersion,
          facts: await backend.guestFacts(),
          agentInstanceId: this.instanceId,
        };
      },
      GetGuestFacts: () => backend.guestFacts(),
      CreateContainer: (req) =>
        this.thenTrim(async () => {
          if (req.containerId === '') throw invalid('CONTAINER_ID_MISSING', 'container_id is empty.');
          if (this.containers.has(req.containerId)) throw alreadyExists('CONTAINER_EXISTS', `container ${req.containerId} exists.`);
          const created = await this.createWithSecrets(req);
          const journal =
            created.stdio.spool !== undefined
              ? spoolJournal(created.stdio.spool, this.outputLimitBytes)
              : new OutputJournal(
                  [
                    { stream: 'OUTPUT_STREAM_STDOUT', readable: created.stdio.stdout },
                    { stream: 'OUTPUT_STREAM_STDERR', readable: created.stdio.stderr },
                  ],
                  this.outputLimitBytes,
                );
          this.containers.set(req.containerId, { journal, stdin: created.stdio.stdin, stdinOnce: req.stdinOnce });
          return { pid: created.pid };
        }),
      StartContainer: (req) => this.thenTrim(async () => ({ startedAt: (await backend.startContainer(req.containerId)).startedAt })),
      SignalContainer: async (req) => {
        await backend.signalContainer(req.containerId, req.signal, req.all);
        return {};
      },
      PauseContainer: async (req) => {
        await backend.freezeContainer(req.containerId, true);
        return {};
      },
      ResumeContainer: async (req) => {
        await backend.freezeContainer(req.containerId, false);
        return {};
      },
      GetTpmQuote: async (req) => {
        const open = this.options.openTpm;
        if (open === undefined) throw unavailable('TPM_UNAVAILABLE', 'this guest has no TPM to quote with.');
        // A fresh open per quote: the kernel's resource manager flushes what a closed file left.
        const tpm = new TpmClient(await open());
        try {
          const q = await tpm.quote(Buffer.from(req.nonce), req.pcrs);
          return {
            attest: q.attest,
            signature: q.signature,
            akPublic: q.akPublic,
            pcrValues: Object.entries(q.pcrValues).map(([index, sha256]) => ({ index: Number(index), sha256 })),
          };
        } finally {
          await tpm.close();
        }
      },
      ReseedGuest: (req) => {
        const reseed = this.options.reseed;
        if (reseed === undefined) throw unimplemented('AGENT_NO_RESEED_SERVICE', 'this agent build cannot reseed the guest.');
        return reseed.reseed(req);
      },
      UpdateContainer: async (req) => {
        await backend.updateContainer(req.containerId, req.ociResourcesJson);
        return {};
      },
      WaitContainer: (req, ctx) => backend.waitContainer(req.containerId, ctx.signal),
      DeleteContainer: (req) =>
        this.thenTrim(async () => {
          // A forced delete removes the bundle whatever runs: stop the output spool's writes into it first.
          if (req.force) this.containers.get(req.containerId)?.journal.close();
          try {
            await backend.deleteContainer(req.containerId, req.force);
          } catch (err) {
            // A container that never got created (its create failed) may still have a volume.
            if (isKataError(err) && err.kind === 'not_found') await this.options.secrets?.remove(req.containerId);
            throw err;
          }
          // Only once no process of the container can read them any more.
          await this.options.secrets?.remove(req.containerId);
          this.containers.get(req.containerId)?.journal.close();
          this.containers.delete(req.containerId);
          for (const key of [...this.processes.keys()]) if (key.startsWith(`${req.containerId}/`)) this.processes.delete(key);
          return {};
        }),
      ListContainers: async (req) => ({
        containers: (await backend.listContainers(req.containerIds)).map((c) => ({
          ...c,
          outputOffset: this.known(c.containerId)?.journal.produced ?? 0,
          outputAckedOffset: this.known(c.containerId)?.journal.acked ?? 0,
        })),
      }),
      ContainerStats: async (req) => ({ stats: await backend.containerStats(req.containerIds) }),
      GuestStats: () => backend.guestStats(),
      StreamOutput: (req, ctx) => this.io(req.containerId).journal.read(req.fromOffset, ctx.signal),
      AckOutput: async (req) => {
        this.io(req.containerId).journal.ack(req.offset);
        return {};
      },
      ExecProcess: (req) =>
        this.thenTrim(async () => {
          if (req.execId === '') throw invalid('EXEC_ID_MISSING', 'exec_id is empty.');
          // A container found again after an agent restart has no output journal yet: the
          // backend, not the journal, decides whether it exists.
          if (this.known(req.containerId) === undefined && (await backend.listContainers([req.containerId])).length === 0)
            this.io(req.containerId);
          const key = `${req.containerId}/${req.execId}`;
          if (this.processes.has(key)) throw alreadyExists('EXEC_EXISTS', `exec ${req.execId} exists in container ${req.containerId}.`);
          const started = await backend.execProcess(req);
          this.processes.set(key, { stdio: started.stdio, reading: new Set() });
          return { pid: started.pid };
        }),
      WriteStdin: async (requests) => {
        let target: Writable | undefined;
        let closeAtEnd = true;
        for await (const req of requests) {
          if (target === undefined) {
            ({ target, closeAtEnd } = this.stdinOf(req.containerId, req.execId));
          }
          if (req.data.length > 0) await writeAll(target, req.data);
        }
        if (target !== undefined && closeAtEnd) target.end();
        return {};
      },
      ReadProcessOutput: (req) => this.processOutput(req.containerId, req.execId, req.stream),
      SignalProcess: async (req) => {
        await backend.signalProcess(req.containerId, req.execId, req.signal);
        return {};
      },
      ResizeTty: async (req) => {
        await backend.resizeTty(req.containerId, req.execId, req.rows, req.columns);
        return {};
      },
      WaitProcess: (req, ctx) => backend.waitProcess(req.containerId, req.execId, ctx.signal),
      DeleteProcess: (req) =>
        this.thenTrim(async () => {
          await backend.deleteProcess(req.containerId, req.execId);
          this.processes.delete(`${req.containerId}/${req.execId}`);
          return {};
        }),
      PortForward: (requests, ctx) => this.portForward(requests, ctx.signal),
      GuestEvents: (_req, ctx) => this.events(ctx.signal),
      CreatePod: (req) => this.thenTrim(() => this.pods().createPod(req)),
      DestroyPod: (req) =>
        this.thenTrim(async () => {
          await this.pods().destroyPod(req.podId);
          await this.options.secrets?.removeAll();
          return {};
        }),
      StatSharedPath: (req) => this.pods().statSharedPath(req),
      ConfigureNetwork: (req) => {
        if (this.options.network === undefined)
          throw unimplemented('AGENT_NO_NETWORK_SERVICE', 'this agent build cannot configure networks.');
        return this.options.network.configure(req).then((res) => {
          this.options.onNetworkConfigured?.();
          return res;
        });
      },
    };
  }

  /**
   * The backend's create, with the container's secrets fetched and mounted first (their bind
   * mounts added to the spec); a failed create takes its secret volume away again.
   */
  private async createWithSecrets(req: CreateContainerRequest): ReturnType<ContainerBackend['createContainer']> {
    const { backend } = this.options;
    // Absent, not only empty, from a host that predates the field (decoded) or a test's literal.
    const secrets = req.secrets ?? [];
    if (secrets.length === 0) return backend.createContainer(req);
    const volumes = this.options.secrets;
    if (volumes === undefined) throw unimplemented('AGENT_NO_SECRET_SERVICE', 'this agent build cannot place secrets in containers.');
    let spec: Record<string, unknown>;
    try {
      spec = JSON.parse(req.ociConfigJson) as Record<string, unknown>;
      if (typeof spec !== 'object' || spec === null || Array.isArray(spec)) throw new Error('not an object');
    } catch (cause) {
      throw invalid('AGENT_JSON_INVALID', 'oci_config_json is not a JSON object.', { cause });
    }
    const withSecrets = await volumes.prepare(req.containerId, secrets, spec);
    try {
      return await backend.createContainer({ ...req, ociConfigJson: JSON.stringify(withSecrets) });
    } catch (err) {
      await volumes
        .remove(req.containerId)
        .catch((e: unknown) =>
          this.options.logger.warn({ err: String(e), containerId: req.containerId }, 'secret volume left after a failed create'),
        );
      throw err;
    }
  }

  /**
   * Run container work with the idle trim held off while it runs, then tell it (also when the
   * work failed: it may have left garbage). A trim in the middle of a container's create, start
   * or exec drops the page cache that call and the next ones read again.
   */
  private async thenTrim<T>(work: () => Promise<T>): Promise<T> {
    const end = this.options.idleTrim?.begin();
    try {
      return await work();
    } finally {
      end?.();
    }
  }

  private pods(): PodService {
    if (this.options.pods === undefined) throw unimplemented('AGENT_NO_POD_SERVICE', 'this agent build cannot manage pods.');
    return this.options.pods;
  }

  private io(containerId: string): ContainerIo {
    const io = this.known(containerId);
    if (io === undefined) throw notFound('CONTAINER_NOT_FOUND', `container ${containerId} is not known to the agent.`);
    return io;
  }

  /** The container's io; after an agent restart built on first use from the reaper's spool. */
  private known(containerId: string): ContainerIo | undefined {
    const io = this.containers.get(containerId);
    if (io !== undefined) return io;
    const spool = this.options.backend.outputSpool?.(containerId);
    if (spool === undefined) return undefined;
    const recovered: ContainerIo = { journal: spoolJournal(spool, this.outputLimitBytes), stdin: undefined, stdinOnce: false };
    this.containers.set(containerId, recovered);
    return recovered;
  }

  private stdinOf(containerId: string, execId: string): { target: Writable; closeAtEnd: boolean } {
    if (execId === '') {
      const io = this.io(containerId);
      if (io.stdin === undefined) throw precondition('STDIN_NOT_OPEN', `container ${containerId} was created without stdin.`);
      return { target: io.stdin, closeAtEnd: io.stdinOnce };
    }
    const proc = this.processes.get(`${containerId}/${execId}`);
    if (proc === undefined) throw notFound('EXEC_NOT_FOUND', `exec ${execId} is not known in container ${containerId}.`);
    if (proc.stdio.stdin === undefined) throw precondition('STDIN_NOT_OPEN', `exec ${execId} was started without stdin.`);
    return { target: proc.stdio.stdin, closeAtEnd: true };
  }

  private async *processOutput(containerId: string, execId: string, stream: string) {
    const proc = this.processes.get(`${containerId}/${execId}`);
    if (proc === undefined) throw notFound('EXEC_NOT_FOUND', `exec ${execId} is not known in container ${containerId}.`);
    const which = stream === 'OUTPUT_STREAM_STDERR' ? 'OUTPUT_STREAM_STDERR' : 'OUTPUT_STREAM_STDOUT';
    const readable: Readable | undefined = which === 'OUTPUT_STREAM_STDERR' ? proc.stdio.stderr : proc.stdio.stdout;
    if (readable === undefined) throw precondition('OUTPUT_NOT_PIPED', `exec ${execId} has no ${which}.`);
    if (proc.reading.has(which)) throw precondition('OUTPUT_ALREADY_READ', `${which} of exec ${execId} already has a reader.`);
    proc.reading.add(which);
    for await (const data of readChunks(readable)) yield { stream: which, data } as const;
    yield { stream: which, data: Buffer.alloc(0), eof: true } as const;
  }

  private async *portForward(requests: AsyncIterable<{ port: number; data: Uint8Array }>, signal: AbortSignal) {
    const it = requests[Symbol.asyncIterator]();
    const first = await it.next();
    if (first.done) return;
    const port = first.value.port;
    if (port < 1 || port > 65535) throw invalid('PORT_INVALID', `port ${port} is not a TCP port.`);
    const socket = (this.options.connectPort ?? ((p) => net.createConnection({ host: '127.0.0.1', port: p })))(port);
    socket.on('error', () => {});
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', (err) =>
        reject(unavailable('PORT_CONNECT_FAILED', `port ${port} did not accept a connection.`, { cause: err })),
      );
    });
    const abort = (): void => {
      socket.destroy();
    };
    signal.addEventListener('abort', abort, { once: true });
    const upstream = (async () => {
      if (first.value.data.length > 0) await writeAll(socket, first.value.data);
      for (let r = await it.next(); !r.done; r = await it.next()) if (r.value.data.length > 0) await writeAll(socket, r.value.data);
      socket.end();
    })();
    upstream.catch(() => socket.destroy());
    try {
      for await (const data of readChunks(socket)) yield { data };
    } finally {
      signal.removeEventListener('abort', abort);
    }
  }

  private async *events(signal: AbortSignal): AsyncGenerator<Partial<GuestEvent>> {
    const limit = this.options.eventQueueLength ?? 1024;
    const queue: BackendEvent[] = [];
    let wake: (() => void) | undefined;
    const off = this.options.backend.onEvent((event) => {
      if (queue.length >= limit) queue.shift();
      queue.push(event);
      wake?.();
    });
    const onAbort = (): void => wake?.();
    signal.addEventListener('abort', onAbort);
    try {
      for (;;) {
        while (queue.length > 0) yield toGuestEvent(queue.shift()!);
        if (signal.aborted) return;
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
        wake = undefined;
      }
    } finally {
      off();
      signal.removeEventListener('abort', onAbort);
    }
  }
}

function nowTimestamp() {
  const ms = Date.now();
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 };
}

function toGuestEvent(e: BackendEvent): Partial<GuestEvent> {
  switch (e.kind) {
    case 'container-started':
      return { kind: 'GUEST_EVENT_KIND_CONTAINER_STARTED', at: e.at, containerId: e.containerId };
    case 'container-exited':
      return {
        kind: 'GUEST_EVENT_KIND_CONTAINER_EXITED',
        at: e.exit.finishedAt ?? nowTimestamp(),
        containerId: e.containerId,
        exit: e.exit,
      };
    case 'process-exited':
      return {
        kind: 'GUEST_EVENT_KIND_PROCESS_EXITED',
        at: e.exit.finishedAt ?? nowTimestamp(),
        containerId: e.containerId,
        execId: e.execId,
        exit: e.exit,
      };
    case 'oom':
      return { kind: 'GUEST_EVENT_KIND_OOM', at: e.at, containerId: e.containerId };
    case 'facts-changed':
      return { kind: 'GUEST_EVENT_KIND_FACTS_CHANGED', at: nowTimestamp(), facts: e.facts };
  }
}
