import { Buffer } from 'node:buffer';
import type { CallOptions, CallWriter, Init, MethodsOfKind, Session, StreamCallOptions } from '../channel/index.js';
import { errorMessage, isReason, type KataError, timedOut, unavailable } from '../common/errors.js';
import type {
  AgentMethods,
  ConfigureNetworkRequest,
  ConfigureNetworkResponse,
  ContainerState,
  ContainerStatsEntry,
  CreateContainerRequest,
  CreatePodRequest,
  CreatePodResponse,
  ExecProcessRequest,
  ExitStatus,
  GuestEvent,
  GuestFacts,
  GuestStatsResponse,
  OutputChunk,
  OutputStream,
  StatSharedPathRequest,
  StatSharedPathResponse,
  Timestamp,
} from '../generated/agent/agent.js';
import { AgentConnection, type AgentConnectionOptions } from './connection.js';
import { retryableAfterSessionEnd } from './idempotence.js';

/**
 * Whether `err`, from a call sent on `session`, says the session ended under the call rather than
 * that the call finished: the channel fails every open stream with the session's own close error
 * (the keepalive's AGENT_KEEPALIVE_FAILED, a broken link) or with CHANNEL_SESSION_CLOSED. The
 * call's own deadline or cancel (CHANNEL_CALL_TIMEOUT, CHANNEL_CALL_CANCELLED) and the agent's
 * answers (decoded afresh from an ERROR record) are neither.
 */
function endedUnder(session: Session | undefined, err: unknown): session is Session {
  if (session === undefined || !session.closed) return false;
  return err === session.closeError || isReason(err, 'CHANNEL_SESSION_CLOSED');
}

/** Time left of a deadline that started at `startMs`, at least 1 ms. */
function remaining(options: CallOptions, startMs: number): CallOptions {
  return { ...options, timeoutMs: Math.max(1, options.timeoutMs - (Date.now() - startMs)) };
}

/**
 * The host's typed client for the guest agent: one method per call of proto/agent/agent.proto.
 * Unary calls take a deadline (`timeoutMs`, which also covers waiting for a reconnect) and an
 * optional AbortSignal. A unary call the session ended under (a missed keepalive, a restarted
 * agent) is sent once more on the next session, within the same deadline, when sending it twice
 * is the same as once (idempotence.ts); any other fails with AGENT_SESSION_ENDED, since the agent
 * may or may not have done it. Streaming calls run until they end, are cancelled, or the session goes
 * (then they fail with CHANNEL_SESSION_CLOSED and the caller opens them again on the next
 * session, e.g. StreamOutput from its stored offset).
 */
export class AgentClient {
  constructor(readonly connection: AgentConnection) {}

  /** Connect to QEMU's agent socket and complete Hello within `timeoutMs`. */
  static async connect(options: AgentConnectionOptions, timeoutMs: number, signal?: AbortSignal): Promise<AgentClient> {
    const connection = new AgentConnection(options);
    try {
      await connection.start(timeoutMs, signal);
    } catch (err) {
      connection.close();
      throw err;
    }
    return new AgentClient(connection);
  }

  close(): void {
    this.connection.close();
  }

  guestFacts(options: CallOptions): Promise<GuestFacts> {
    return this.unary('GetGuestFacts', {}, options);
  }

  async createContainer(request: Init<CreateContainerRequest>, options: CallOptions): Promise<{ pid: number }> {
    return this.unary('CreateContainer', request, options);
  }

  async startContainer(containerId: string, options: CallOptions): Promise<{ startedAt: Timestamp | null }> {
    return this.unary('StartContainer', { containerId }, options);
  }

  async signalContainer(containerId: string, signal: number, all: boolean, options: CallOptions): Promise<void> {
    await this.unary('SignalContainer', { containerId, signal, all }, options);
  }

  /** Freeze every process of a running container (its guest cgroup); idempotent. */
  async pauseContainer(containerId: string, options: CallOptions): Promise<void> {
    await this.unary('PauseContainer', { containerId }, options);
  }

  /**
   * A quote of the guest TPM's sha256 PCRs `pcrs` with `nonce` (at most 64 bytes), with the
   * attestation key's public area and the PCR values; check it with verifyQuote
   * (src/measure/quote.ts). An agent older than the call answers UNIMPLEMENTED, a guest without
   * a TPM TPM_UNAVAILABLE.
   */
  async tpmQuote(
    nonce: Buffer,
    pcrs: readonly number[],
    options: CallOptions,
  ): Promise<{ attest: Buffer; signature: Buffer; akPublic: Buffer; pcrValues: Record<number, Buffer> }> {
    const r = await this.unary('GetTpmQuote', { nonce, pcrs: [...pcrs] }, options);
    return {
      attest: Buffer.from(r.attest),
      signature: Buffer.from(r.signature),
      akPublic: Buffer.from(r.akPublic),
      pcrValues: Object.fromEntries(r.pcrValues.map((v) => [v.index, Buffer.from(v.sha256)])),
    };
  }

  /** Thaw a paused container; idempotent. */
  async resumeContainer(containerId: string, options: CallOptions): Promise<void> {
    await this.unary('ResumeContainer', { containerId }, options);
  }

  /** A running container's new limits: `resources` is the OCI linux.resources object. */
  async updateContainer(containerId: string, resources: object, options: CallOptions): Promise<void> {
    await this.unary('UpdateContainer', { containerId, ociResourcesJson: JSON.stringify(resources) }, options);
  }

  waitContainer(containerId: string, options: CallOptions): Promise<ExitStatus> {
    return this.unary('WaitContainer', { containerId }, options);
  }

  async deleteContainer(containerId: string, force: boolean, options: CallOptions): Promise<void> {
    await this.unary('DeleteContainer', { containerId, force }, options);
  }

  async listContainers(containerIds: string[], options: CallOptions): Promise<ContainerState[]> {
    return (await this.unary('ListContainers', { containerIds }, options)).containers;
  }

  async containerStats(containerIds: string[], options: CallOptions): Promise<ContainerStatsEntry[]> {
    return (await this.unary('ContainerStats', { containerIds }, options)).stats;
  }

  guestStats(options: CallOptions): Promise<GuestStatsResponse> {
    return this.unary('GuestStats', {}, options);
  }

  /** The container's output from `fromOffset`; the last chunk has `eof`. Acknowledge with ackOutput. */
  streamOutput(containerId: string, fromOffset: number, options: StreamCallOptions = {}): AsyncGenerator<OutputChunk> {
    this.connection.admit('StreamOutput', undefined);
    return this.connection.rpc.serverStream('StreamOutput', { containerId, fromOffset }, options);
  }

  async ackOutput(containerId: string, offset: number, options: CallOptions): Promise<void> {
    await this.unary('AckOutput', { containerId, offset }, options);
  }

  execProcess(request: Init<ExecProcessRequest>, options: CallOptions): Promise<{ pid: number }> {
    return this.unary('ExecProcess', request, options);
  }

  /**
   * A writer to the stdin of a process (execId '' = the container's own). `write` resolves when
   * the channel took the bytes; `end` closes the process's stdin (for the container's own stdin,
   * only when it was created with stdinOnce).
   */
  writeStdin(containerId: string, execId: string, options: StreamCallOptions = {}): StdinWriter {
    this.connection.admit('WriteStdin', undefined);
    const call = this.connection.rpc.clientStream('WriteStdin', options);
    let first = true;
    return {
      write: (data) => {
        const message = first ? { containerId, execId, data } : { data };
        first = false;
        return call.send(message);
      },
      end: () => {
        if (first) void call.send({ containerId, execId }).catch(() => {});
        call.end();
      },
      cancel: () => call.cancel(),
      done: call.response.then(() => undefined),
    };
  }

  /** An exec'd process's stdout or stderr, until end of file. */
  readProcessOutput(
    containerId: string,
    execId: string,
    stream: OutputStream,
    options: StreamCallOptions = {},
  ): AsyncGenerator<OutputChunk> {
    this.connection.admit('ReadProcessOutput', undefined);
    return this.connection.rpc.serverStream('ReadProcessOutput', { containerId, execId, stream }, options);
  }

  async signalProcess(containerId: string, execId: string, signal: number, options: CallOptions): Promise<void> {
    await this.unary('SignalProcess', { containerId, execId, signal }, options);
  }

  async resizeTty(containerId: string, execId: string, rows: number, columns: number, options: CallOptions): Promise<void> {
    await this.unary('ResizeTty', { containerId, execId, rows, columns }, options);
  }

  waitProcess(containerId: string, execId: string, options: CallOptions): Promise<ExitStatus> {
    return this.unary('WaitProcess', { containerId, execId }, options);
  }

  async deleteProcess(containerId: string, execId: string, options: CallOptions): Promise<void> {
    await this.unary('DeleteProcess', { containerId, execId }, options);
  }

  /** A byte stream to `port` on the guest's loopback. */
  portForward(port: number, options: StreamCallOptions = {}): PortForwardStream {
    this.connection.admit('PortForward', undefined);
    const call = this.connection.rpc.bidi('PortForward', options);
    const opened = call.send({ port });
    opened.catch(() => {});
    async function* data(): AsyncGenerator<Uint8Array> {
      for await (const m of call.responses) yield m.data;
    }
    return {
      write: async (bytes) => {
        await opened;
        await call.send({ data: bytes });
      },
      end: () => {
        void opened.then(() => call.end()).catch(() => {});
      },
      cancel: () => call.cancel(),
      data: data(),
    };
  }

  /** The pod in the guest (pause process, /dev/shm); idempotent. */
  createPod(request: Init<CreatePodRequest>, options: CallOptions): Promise<CreatePodResponse> {
    return this.unary('CreatePod', request, options);
  }

  async destroyPod(podId: string, options: CallOptions): Promise<void> {
    await this.unary('DestroyPod', { podId }, options);
  }

  /** What the guest sees at a path of the sandbox's shared directory (as the guest kernel resolves it). */
  statSharedPath(request: Init<StatSharedPathRequest>, options: CallOptions): Promise<StatSharedPathResponse> {
    return this.unary('StatSharedPath', request, options);
  }

  /** The pod's network in the guest (NIC addresses, routes, resolv.conf); idempotent. */
  configureNetwork(request: Init<ConfigureNetworkRequest>, options: CallOptions): Promise<ConfigureNetworkResponse> {
    return this.unary('ConfigureNetwork', request, options);
  }

  /** Guest events as they happen (hints: after a reconnect, list containers again). */
  guestEvents(options: StreamCallOptions = {}): AsyncGenerator<GuestEvent> {
    this.connection.admit('GuestEvents', undefined);
    return this.connection.rpc.serverStream('GuestEvents', {}, options);
  }

  private async unary<K extends MethodsOfKind<AgentMethods, 'unary'>>(
    method: K,
    request: Init<AgentMethods[K]['request']>,
    options: CallOptions,
  ): Promise<AgentMethods[K]['response']> {
    const startMs = Date.now();
    await this.connection.ready(options.timeoutMs, options.signal);
    // What the agent's API (current or one back) lacks is refused here, never sent and ignored.
    this.connection.admit(method, request);
    const session = this.connection.currentSession;
    try {
      return await this.connection.rpc.unary(method, request, remaining(options, startMs));
    } catch (err) {
      if (!endedUnder(session, err)) throw err;
      const why = errorMessage(err);
      if (!retryableAfterSessionEnd(method, request)) {
        throw unavailable(
          'AGENT_SESSION_ENDED',
          `${method} was in flight when the agent session ended (${why}); the agent may or may not have done it, and it is not sent again because doing it twice is not the same as once.`,
          { cause: err },
        );
      }
      return this.retryOnNewSession(method, request, options, startMs, err as Error);
    }
  }

  /**
   * Send an idempotent call once more, on the session that follows the one that ended under it
   * (`first`), within what is left of the caller's deadline. A second session ending under it is
   * not retried again: the caller hears AGENT_SESSION_ENDED.
   */
  private async retryOnNewSession<K extends MethodsOfKind<AgentMethods, 'unary'>>(
    method: K,
    request: Init<AgentMethods[K]['request']>,
    options: CallOptions,
    startMs: number,
    first: Error,
  ): Promise<AgentMethods[K]['response']> {
    const log = this.connection.logger;
    log.warn(
      { method, err: errorMessage(first) },
      'the agent session ended under an idempotent call; sending it again on the next session',
    );
    try {
      await this.connection.ready(remaining(options, startMs).timeoutMs, options.signal);
    } catch (err) {
      if (!isReason(err, 'AGENT_NOT_CONNECTED')) throw err;
      throw timedOut(
        'AGENT_SESSION_ENDED',
        `${method} was in flight when the agent session ended (${errorMessage(first)}), and no new session came within its ${options.timeoutMs} ms deadline to send it again.`,
        { cause: first },
      );
    }
    this.connection.admit(method, request);
    const session = this.connection.currentSession;
    try {
      return await this.connection.rpc.unary(method, request, remaining(options, startMs));
    } catch (err) {
      if (!endedUnder(session, err)) throw err;
      throw unavailable(
        'AGENT_SESSION_ENDED',
        `${method} was in flight when the agent session ended (${errorMessage(first)}), and again when it was sent on the next session (${errorMessage(err)}); it is not sent a third time.`,
        { cause: err as KataError },
      );
    }
  }
}

export interface StdinWriter {
  write(data: Buffer | Uint8Array): Promise<void>;
  end(): void;
  cancel(): void;
  /** Settles when the agent has closed or released the process's stdin. */
  done: Promise<void>;
}

export interface PortForwardStream {
  write(data: Buffer | Uint8Array): Promise<void>;
  end(): void;
  cancel(): void;
  data: AsyncGenerator<Uint8Array>;
}

export type { CallWriter };
