/**
 * Exec and attach through the guest agent, on the channels of any face (the CRI's streaming
 * server, the shim's FIFOs). Exec: a new process
 * in the container (ExecProcess with the container's process settings, a pty in the guest for a
 * tty), stdin written with the agent's pacing, stdout/stderr read only as fast as the client takes
 * them (a slow reader slows the process), terminal sizes forwarded, the exit code as the status.
 * A client that goes away kills the process; the process is always deleted from the agent.
 * Attach: the container's own output from now on, its stdin (closed after this client when the
 * container has stdin_once) and its terminal.
 */
import { randomBytes } from 'node:crypto';
import type { Readable, Writable } from 'node:stream';
import type { AgentClient } from '../../agent-client/index.js';
import { isKataError, isReason } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { CommandChannels, TerminalSize } from './command-channels.js';
import { execProcessRequest } from './exec-process.js';
import type { ContainerRecord } from './record.js';

const CALL_MS = 30_000;
/** A day: longer waits overflow setTimeout (2^31 ms), which would fire at once. */
const WAIT_MS = 24 * 3600 * 1000;

/** Write and wait for the consumer (backpressure); false when the client is gone. */
function writeTo(out: Writable, data: Uint8Array): Promise<boolean> {
  return new Promise((resolve) => {
    if (out.destroyed || out.writableEnded) return resolve(false);
    out.write(data, (err) => resolve(!err));
  });
}

async function pumpStdin(stdin: Readable, agent: AgentClient, containerId: string, execId: string, signal: AbortSignal): Promise<void> {
  const writer = agent.writeStdin(containerId, execId, { signal });
  writer.done.catch(() => undefined);
  try {
    for await (const chunk of stdin) await writer.write(chunk as Buffer);
  } catch {
    // the client's stdin or the agent's stream broke: stdin ends here either way
  }
  writer.end();
}

/** How long a tty exec waits for the client's first terminal size before it starts anyway. */
const FIRST_SIZE_WAIT_MS = 1000;

/**
 * The client's first terminal size, waited for briefly: a process started before its terminal has
 * a size sees 0 rows (busybox `stty size` fails; crictl sends the size just after connecting).
 */
async function firstSize(sizes: AsyncIterator<TerminalSize>): Promise<TerminalSize | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), FIRST_SIZE_WAIT_MS);
  });
  try {
    const first = await Promise.race([sizes.next(), timeout]);
    return first === undefined || first.done ? undefined : first.value;
  } finally {
    clearTimeout(timer);
  }
}

async function pumpResizes(
  resizes: AsyncIterable<TerminalSize>,
  agent: AgentClient,
  containerId: string,
  execId: string,
  logger: Logger,
): Promise<void> {
  for await (const size of resizes) {
    await agent.resizeTty(containerId, execId, size.height, size.width, { timeoutMs: CALL_MS }).catch((err: unknown) => {
      logger.debug({ containerId, execId, err: String(err) }, 'terminal resize failed');
    });
  }
}

/** What a face may add to an exec beyond its command. */
export interface ExecHooks {
  /** Told the guest pid once the process runs (the shim's Start answers with it). */
  started?(pid: number): void;
  /** The agent's id for the process, for signals and terminal sizes from outside the channels. */
  execId?: string;
}

/** Run `cmd` in the container over `channels`; resolves when the status has been written. */
export async function runExec(
  agent: AgentClient,
  record: ContainerRecord,
  cmd: readonly string[],
  tty: boolean,
  channels: CommandChannels,
  logger: Logger,
  hooks: ExecHooks = {},
): Promise<void> {
  const execId = hooks.execId ?? newExecId();
  // One iterator for the first size (the process's consoleSize) and every later one.
  const sizes = tty && channels.resizes !== null ? channels.resizes[Symbol.asyncIterator]() : undefined;
  const size = sizes === undefined ? undefined : await firstSize(sizes);
  const request = execProcessRequest(record, {
    execId,
    cmd,
    tty,
    stdin: channels.stdin !== null,
    ...(size !== undefined ? { consoleSize: size } : {}),
  });
  const { pid } = await agent.execProcess(request, { timeoutMs: CALL_MS });
  hooks.started?.(pid);
  logger.debug({ containerId: record.id, execId }, 'exec started');
  const abort = new AbortController();
  const onClientGone = () => abort.abort();
  channels.signal.addEventListener('abort', onClientGone, { once: true });
  const output = async (stream: 'OUTPUT_STREAM_STDOUT' | 'OUTPUT_STREAM_STDERR', out: Writable | null) => {
    let clientOpen = out !== null;
    try {
      for await (const chunk of agent.readProcessOutput(record.id, execId, stream, { signal: abort.signal })) {
        // A client that did not ask for this stream still has it read, or the process would block.
        if (clientOpen && chunk.data.length > 0) clientOpen = await writeTo(out!, chunk.data);
        if (chunk.eof) break;
      }
    } catch (err) {
      if (!abort.signal.aborted) throw err;
    }
  };
  try {
    const outputs = Promise.all([
      output('OUTPUT_STREAM_STDOUT', channels.stdout),
      tty ? Promise.resolve() : output('OUTPUT_STREAM_STDERR', channels.stderr),
    ]);
    outputs.catch(() => undefined);
    if (channels.stdin !== null) void pumpStdin(channels.stdin, agent, record.id, execId, abort.signal);
    if (sizes !== undefined) {
      if (size !== undefined)
        void agent.resizeTty(record.id, execId, size.height, size.width, { timeoutMs: CALL_MS }).catch(() => undefined);
      void pumpResizes({ [Symbol.asyncIterator]: () => sizes }, agent, record.id, execId, logger);
    }
    const exit = (async () => {
      // A process may outlive one wait call's deadline: wait again.
      for (;;) {
        try {
          return await agent.waitProcess(record.id, execId, { timeoutMs: WAIT_MS, signal: abort.signal });
        } catch (err) {
          if (!(isKataError(err) && err.kind === 'timeout') || abort.signal.aborted) throw err;
        }
      }
    })();
    exit.catch(() => undefined);
    const ended = await Promise.race([exit.then((e) => ({ exit: e })), abortedPromise(abort.signal)]);
    if ('gone' in ended) {
      // The client went away with the process still running: it must not outlive its stream.
      await agent.signalProcess(record.id, execId, 9, { timeoutMs: CALL_MS }).catch(() => undefined);
      await agent.waitProcess(record.id, execId, { timeoutMs: CALL_MS }).catch(() => undefined);
      logger.info({ containerId: record.id, execId }, 'exec client went away; its process was killed');
      return;
    }
    logger.debug({ containerId: record.id, execId, exitCode: ended.exit.exitCode }, 'exec exited');
    await outputs;
    await channels.finish({ exitCode: ended.exit.exitCode, cmd });
    logger.debug({ containerId: record.id, execId }, 'exec status sent');
  } finally {
    channels.signal.removeEventListener('abort', onClientGone);
    abort.abort();
    await agent.deleteProcess(record.id, execId, { timeoutMs: CALL_MS }).catch((err: unknown) => {
      if (!(isKataError(err) && err.kind === 'not_found')) logger.warn({ execId, err: String(err) }, 'deleting an exec failed');
    });
  }
}

/**
 * A new exec id for the agent. Short: the guest puts a tty exec's console socket at
 * <bundles>/<64-char id>/exec-<execId>.sock, and a unix socket path holds at most 107 bytes.
 */
export function newExecId(): string {
  return `s${randomBytes(4).toString('hex')}`;
}

function abortedPromise(signal: AbortSignal): Promise<{ gone: true }> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve({ gone: true });
    else signal.addEventListener('abort', () => resolve({ gone: true }), { once: true });
  });
}

/** Attach to the container's own stdio over `channels`; resolves when the container's output ends or the client leaves. */
export async function runAttach(agent: AgentClient, record: ContainerRecord, channels: CommandChannels, logger: Logger): Promise<void> {
  const abort = new AbortController();
  const onClientGone = () => abort.abort();
  channels.signal.addEventListener('abort', onClientGone, { once: true });
  try {
    if (channels.stdin !== null) {
      if (record.spec.stdin) void pumpStdin(channels.stdin, agent, record.id, '', abort.signal);
      else channels.stdin.resume(); // the container has no stdin: what the client types goes nowhere
    }
    if (record.spec.tty && channels.resizes !== null) void pumpResizes(channels.resizes, agent, record.id, '', logger);
    if (channels.stdout === null && channels.stderr === null) {
      // stdin only: attached until the client closes it.
      if (channels.stdin !== null) await new Promise<void>((resolve) => channels.stdin!.once('end', resolve).once('close', resolve));
    } else await followOutput(agent, record.id, channels, abort.signal);
    if (!channels.signal.aborted) await channels.finish({ exitCode: 0 });
  } finally {
    channels.signal.removeEventListener('abort', onClientGone);
    abort.abort();
  }
}

/** The container's output from the current offset until its end (the container exited). */
async function followOutput(agent: AgentClient, containerId: string, channels: CommandChannels, signal: AbortSignal): Promise<void> {
  for (;;) {
    const [state] = await agent.listContainers([containerId], { timeoutMs: CALL_MS, signal });
    if (state === undefined) return;
    try {
      for await (const chunk of agent.streamOutput(containerId, state.outputOffset, { signal })) {
        const out = chunk.stream === 'OUTPUT_STREAM_STDERR' ? channels.stderr : channels.stdout;
        if (out !== null && chunk.data.length > 0 && !(await writeTo(out, chunk.data))) return;
        if (chunk.eof) return;
      }
      return;
    } catch (err) {
      if (signal.aborted) return;
      // The log pump acknowledged bytes this reader had not reached: go on from the live end.
      if (!isReason(err, 'OUTPUT_OFFSET_GONE')) throw err;
    }
  }
}
