/**
 * `kata-ts pause <pod>` and `kata-ts resume <pod>` for the standalone daemon (behind containerd,
 * `ctr task pause` reaches the shim's Pause instead). The daemon holds each pod's QMP and agent
 * connections, so only it can pause a pod: `kata-ts serve` listens on a control socket in its
 * state dir (`<stateDir>/control.sock`, 0600, root's), and these commands send it one request
 * each. The protocol is one JSON line each way: `{"pause":"<id>"}` or `{"resume":"<id>"}`,
 * answered `{"ok":true,"sandboxId":..,"changed":bool}` or `{"error":{"kind","reason","message"}}`.
 * `ps` reads the same state dir from the config file, as these commands do.
 */
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { ERROR_KINDS, type ErrorKind, errorMessage, isKataError, type KataError } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { rpcCodeName, rpcCodeOfKind } from '../common/status-codes.js';
import { loadConfig } from '../config/load.js';
import type { RequestContext } from '../runtime/context.js';
import type { PauseOutcome } from '../runtime/sandbox/pause.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

/** The longest request or answer line accepted, in bytes: an id and a sentence fit many times over. */
const CONTROL_LINE_MAX_BYTES = 16 * 1024;
/** How long the command waits for the daemon's answer: a pause thaws or freezes every container (30 s each at most). */
const ANSWER_TIMEOUT_MS = 300_000;

/** The daemon's control socket for its state dir. */
export function controlSocketPath(stateDir: string): string {
  return path.join(stateDir, 'control.sock');
}

/** What `kata-ts serve` hands the control socket: the daemon's pod pause and resume. */
export interface PodPauseControl {
  pause(id: string, ctx: RequestContext): Promise<PauseOutcome>;
  resume(id: string, ctx: RequestContext): Promise<PauseOutcome>;
}

/** One request on the control socket, decoded. */
export type ControlRequest = { op: 'pause' | 'resume'; id: string };

/** A coded refusal of a request line (pure; the server answers it as an error). */
export class ControlRequestError extends Error {
  override readonly name = 'ControlRequestError';
}

/**
 * Decode one request line (pure): a JSON object with exactly one key, `pause` or `resume`,
 * whose value is a non-empty id of at most 128 characters.
 */
export function decodeControlRequest(line: string): ControlRequest {
  let doc: unknown;
  try {
    doc = JSON.parse(line);
  } catch {
    throw new ControlRequestError('the request is not JSON');
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw new ControlRequestError('the request is not a JSON object');
  const keys = Object.keys(doc);
  const op = keys[0];
  if (keys.length !== 1 || (op !== 'pause' && op !== 'resume')) {
    throw new ControlRequestError('the request must have exactly one key, "pause" or "resume"');
  }
  const id = (doc as Record<string, unknown>)[op];
  if (typeof id !== 'string' || id === '' || id.length > 128) {
    throw new ControlRequestError(`"${op}" must be a pod sandbox id (1 to 128 characters)`);
  }
  return { op, id };
}

/** A running control socket: close() stops listening and removes the socket file. */
export interface ControlServer {
  close(): Promise<void>;
}

/**
 * Serve the daemon's control socket at `socketPath` (a stale file is replaced: the daemon holds
 * its state dir's lock, so no other daemon listens there). One request per connection.
 */
export async function serveControlSocket(socketPath: string, pods: PodPauseControl, logger: Logger): Promise<ControlServer> {
  await fsp.rm(socketPath, { force: true });
  const log = logger.child({ component: 'control' });
  const server = net.createServer((sock) => {
    let buffered = '';
    let answered = false;
    const answer = (doc: unknown): void => {
      answered = true;
      sock.end(`${JSON.stringify(doc)}\n`);
    };
    sock.setEncoding('utf8');
    sock.on('error', () => sock.destroy());
    sock.on('data', (chunk: string) => {
      if (answered) return;
      buffered += chunk;
      const nl = buffered.indexOf('\n');
      if (nl < 0) {
        if (buffered.length > CONTROL_LINE_MAX_BYTES)
          answer(errorDoc('invalid', 'CONTROL_REQUEST_INVALID', 'the request line is too long'));
        return;
      }
      let request: ControlRequest;
      try {
        request = decodeControlRequest(buffered.slice(0, nl));
      } catch (err) {
        answer(errorDoc('invalid', 'CONTROL_REQUEST_INVALID', errorMessage(err)));
        return;
      }
      answered = true;
      const ctx = controlContext(log, request.op === 'pause' ? 'PausePod' : 'ResumePod');
      const run = request.op === 'pause' ? pods.pause(request.id, ctx) : pods.resume(request.id, ctx);
      run.then(
        (outcome) => sock.end(`${JSON.stringify({ ok: true, sandboxId: outcome.sandboxId, changed: outcome.changed })}\n`),
        (err: unknown) => {
          log.warn({ op: request.op, id: request.id, err: errorMessage(err) }, 'control request failed');
          const e = err as Partial<KataError>;
          sock.end(
            `${JSON.stringify(errorDoc(isKataError(err) ? (e.kind ?? 'internal') : 'internal', isKataError(err) ? String(e.reason) : 'INTERNAL', errorMessage(err)))}\n`,
          );
        },
      );
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => {
      server.off('error', reject);
      resolve();
    });
  });
  await fsp.chmod(socketPath, 0o600);
  log.info({ socketPath }, 'control socket listening (kata-ts pause, resume)');
  return {
    close: async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await fsp.rm(socketPath, { force: true });
    },
  };
}

function errorDoc(kind: string, reason: string, message: string): { error: { kind: string; reason: string; message: string } } {
  return { error: { kind, reason, message } };
}

function controlContext(logger: Logger, method: string): RequestContext {
  return {
    method,
    logger: logger.child({ method }),
    signal: new AbortController().signal,
    deadlineMs: undefined,
    annotate: () => undefined,
  };
}

/** The daemon's answer to one request, as the command reads it. */
export type ControlAnswer =
  | { ok: true; sandboxId: string; changed: boolean }
  | { ok: false; error: { kind: string; reason: string; message: string } };

/** Send one request to the daemon's control socket and read its answer. */
export function sendControlRequest(socketPath: string, request: ControlRequest, timeoutMs = ANSWER_TIMEOUT_MS): Promise<ControlAnswer> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(socketPath);
    let text = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`the kata-ts daemon did not answer on ${socketPath} within ${timeoutMs} ms`));
    }, timeoutMs);
    sock.setEncoding('utf8');
    sock.on('connect', () => sock.write(`${JSON.stringify({ [request.op]: request.id })}\n`));
    sock.on('data', (chunk: string) => {
      text += chunk;
      if (text.length > CONTROL_LINE_MAX_BYTES) sock.destroy(new Error('the daemon answered more than a line'));
    });
    sock.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      const why =
        err.code === 'ENOENT' || err.code === 'ECONNREFUSED' ? 'no kata-ts daemon listens on' : 'could not talk to the kata-ts daemon on';
      reject(new Error(`${why} ${socketPath} (${err.code ?? err.message}); is 'kata-ts serve' running with this config?`));
    });
    sock.on('end', () => {
      clearTimeout(timer);
      try {
        const doc = JSON.parse(text.trim()) as {
          ok?: boolean;
          sandboxId?: string;
          changed?: boolean;
          error?: ControlAnswer & { ok: false };
        };
        if (doc.ok === true && typeof doc.sandboxId === 'string')
          resolve({ ok: true, sandboxId: doc.sandboxId, changed: doc.changed === true });
        else if (typeof doc.error === 'object' && doc.error !== null)
          resolve({ ok: false, error: doc.error as unknown as { kind: string; reason: string; message: string } });
        else reject(new Error('the daemon answered something that is not a control answer'));
      } catch {
        reject(new Error('the daemon answered something that is not JSON'));
      }
    });
  });
}

/** The gRPC name of an error kind the daemon answered (one mapping: common/status-codes.ts); an unknown kind as it came. */
function kindName(kind: string): string {
  return (ERROR_KINDS as readonly string[]).includes(kind) ? rpcCodeName(rpcCodeOfKind(kind as ErrorKind)) : kind;
}

function helpFor(op: 'pause' | 'resume'): string {
  const what =
    op === 'pause'
      ? `Pauses a pod of the running kata-ts daemon: every running container is frozen in the guest,
then the VM's vCPUs are stopped (QMP stop). The pod keeps its memory and uses no CPU; calls that
need its guest (exec, create or start a container, stats, port-forward) are refused with
FAILED_PRECONDITION until 'kata-ts resume'. Pausing a paused pod changes nothing.`
      : `Resumes a pod paused by 'kata-ts pause': the VM's vCPUs run again (QMP cont), then its
containers are thawed, each going on from where it stopped. Resuming a pod that is not paused
changes nothing.`;
  return `Usage: kata-ts ${op} [--config FILE] [--state-dir DIR] <pod sandbox id or unique prefix>

${what}
The daemon is reached on <stateDir>/control.sock (the config's stateDir, or --state-dir). Behind
containerd, use 'ctr task ${op} <sandbox id>' instead. See docs/pause.md.
`;
}

async function runPauseOrResume(op: 'pause' | 'resume', argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(
    argv,
    { config: { type: 'string' }, 'state-dir': { type: 'string' }, help: { type: 'boolean', short: 'h' } },
    true,
  );
  if (values.help === true) {
    io.stdout.write(helpFor(op));
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`${op} takes one pod sandbox id, got ${positionals.length} arguments`);
  const id = positionals[0] as string;
  const stateDirFlag = values['state-dir'];
  if (stateDirFlag !== undefined && !path.isAbsolute(stateDirFlag))
    throw new UsageError(`--state-dir must be an absolute path, got "${stateDirFlag}"`);
  const stateDir = stateDirFlag ?? (await loadConfig(values.config)).config.stateDir;
  const answer = await sendControlRequest(controlSocketPath(stateDir), { op, id }).catch((err: unknown) => {
    io.stderr.write(`kata-ts ${op}: ${errorMessage(err)}\n`);
    return undefined;
  });
  if (answer === undefined) return 1;
  if (!answer.ok) {
    const { kind, reason, message } = answer.error;
    io.stderr.write(`kata-ts ${op}: ${kindName(kind)} ${reason}: ${message}\n`);
    return 1;
  }
  const done = op === 'pause' ? 'paused' : 'resumed';
  io.stdout.write(
    answer.changed ? `${answer.sandboxId} ${done}\n` : `${answer.sandboxId} was already ${done === 'paused' ? 'paused' : 'running'}\n`,
  );
  return 0;
}

/** `kata-ts pause`. */
export function runPauseCommand(argv: string[], io: CliIo): Promise<number> {
  return runPauseOrResume('pause', argv, io);
}

/** `kata-ts resume`. */
export function runResumeCommand(argv: string[], io: CliIo): Promise<number> {
  return runPauseOrResume('resume', argv, io);
}
