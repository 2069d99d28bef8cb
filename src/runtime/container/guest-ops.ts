/**
 * The agent calls behind the container rpcs: create + start, the exit watch, stop with the stop
 * signal then SIGKILL, ExecSync. Each takes the AgentClient of the container's sandbox and the
 * container's record; none touches records or locks (the manager does).
 */

import { randomBytes } from 'node:crypto';
import os from 'node:os';
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage, invalid, isKataError, isReason, timedOut } from '../../common/errors.js';
import { epochNs } from '../../common/time.js';
import type { ExitStatus, Timestamp } from '../../generated/agent/agent.js';
import { execProcessRequest } from './exec-process.js';
import type { ContainerRecord } from './record.js';

/** A unary call that may wait for a container (WaitContainer): long, but bounded. */
const WAIT_CALL_MS = 24 * 3600 * 1000;
const CALL_MS = 30_000;
/**
 * The bound on creating and starting a container in the guest, cut to the caller's deadline when
 * it sets a shorter one: the kubelet's own default for a CRI call (--runtime-request-timeout,
 * 2 min). crun's create in the guest, the root filesystem over virtio-fs and a secret fetched from
 * the broker all run inside it; on a loaded two-core node under TCG they took more than the fixed
 * 30 s this bound replaces, and the container failed where the kubelet would still have waited.
 */
export const START_CALL_MS = 120_000;
/** The kubelet's own bound on ExecSync output per stream. */
export const EXEC_SYNC_MAX_BYTES = 16 * 1024 * 1024;
const TRUNCATED_NOTE = '\n[kata-ts: output truncated at 16 MiB]\n';

/** A signal name (SIGTERM, TERM, RTMIN+3) or number -> its Linux number. */
export function signalNumber(name: string): number {
  if (/^[0-9]+$/.test(name)) return Number(name);
  const upper = name.toUpperCase();
  const full = upper.startsWith('SIG') ? upper : `SIG${upper}`;
  const rt = /^SIGRTMIN\+([0-9]+)$/.exec(full);
  if (rt !== null) return 34 + Number(rt[1]);
  const n = (os.constants.signals as Record<string, number | undefined>)[full];
  if (n === undefined) throw invalid('CONTAINER_STOP_SIGNAL_UNKNOWN', `stop signal "${name}" is not a Linux signal`);
  return n;
}

export function timestampNs(t: Timestamp | null | undefined): string {
  if (t === null || t === undefined) return epochNs().toString();
  return (BigInt(t.seconds) * 1_000_000_000n + BigInt(t.nanos)).toString();
}

/** ContainerStatus reason and message of an exit (pure). */
export function exitReason(exit: Pick<ExitStatus, 'exitCode' | 'signal' | 'oomKilled'>): { reason: string; message: string } {
  if (exit.oomKilled)
    return { reason: 'OOMKilled', message: `the container was killed by the out-of-memory killer (exit code ${exit.exitCode})` };
  if (exit.exitCode === 0) return { reason: 'Completed', message: '' };
  if (exit.signal !== 0)
    return { reason: 'Error', message: `the container was killed by signal ${exit.signal} (exit code ${exit.exitCode})` };
  return { reason: 'Error', message: `the container exited with code ${exit.exitCode}` };
}

/**
 * The container's stdin as the agent opens it. The CRI's: as the spec asks (attach writes it;
 * stdin_once closes it after the first attach). The caller's FIFO: open when there is one, and
 * closed when its writer closes or the caller says so (CloseIO): `stdinOnce`, since the agent
 * closes a container's stdin at the end of a WriteStdin stream only then.
 */
export function guestStdin(record: Pick<ContainerRecord, 'spec' | 'stdio'>): { stdin: boolean; stdinOnce: boolean } {
  if (record.stdio.kind === 'fifo') return { stdin: record.stdio.stdin !== '', stdinOnce: true };
  return { stdin: record.spec.stdin, stdinOnce: record.spec.stdin_once };
}

/** CreateContainer + StartContainer in the guest: the start time (ns since the epoch) and the guest pid. */
export async function createAndStart(
  agent: AgentClient,
  record: ContainerRecord,
  timeoutMs = START_CALL_MS,
): Promise<{ startedAtNs: string; pid: number }> {
  const guest = record.guest!;
  // create() made sure a FIFO's terminal and the spec's tty agree.
  const { pid } = await agent.createContainer(
    {
      containerId: record.id,
      ociConfigJson: JSON.stringify(guest.ociSpec),
      rootfsPath: guest.rootfsGuestPath,
      stdio: record.spec.tty ? 'STDIO_MODE_TTY' : 'STDIO_MODE_PIPES',
      ...guestStdin(record),
      devices: guest.guestDevices,
      // Names and paths only: the agent fetches the resources itself, from the broker.
      secrets: (guest.secrets ?? []).map((s) => ({ resource: s.resource, containerPath: s.path })),
    },
    { timeoutMs },
  );
  const { startedAt } = await agent.startContainer(record.id, { timeoutMs });
  return { startedAtNs: timestampNs(startedAt), pid };
}

/**
 * The container's exit, waiting across broken sessions (a daemon restart or a channel reset ends a
 * WaitContainer call, not the container). Rejects when `signal` aborts or the agent says the
 * container does not exist.
 */
export async function waitForExit(agent: AgentClient, containerId: string, signal: AbortSignal): Promise<ExitStatus> {
  for (;;) {
    try {
      return await agent.waitContainer(containerId, { timeoutMs: WAIT_CALL_MS, signal });
    } catch (err) {
      if (signal.aborted || (isKataError(err) && err.kind === 'not_found')) throw err;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

/**
 * StopContainer in the guest: the stop signal to the init, then after `timeoutMs` SIGKILL to every
 * process of the container; resolves when `exited` does. A container already gone is fine.
 */
export async function stopInGuest(agent: AgentClient, record: ContainerRecord, timeoutMs: number, exited: Promise<unknown>): Promise<void> {
  const first = signalNumber(record.guest?.stopSignal ?? 'SIGTERM');
  const graceful = timeoutMs > 0 && first !== 9;
  if (graceful) {
    await ignoreGone(agent.signalContainer(record.id, first, false, { timeoutMs: CALL_MS }), exited);
    let timer: NodeJS.Timeout | undefined;
    const timedOutP = new Promise<'timeout'>((r) => {
      timer = setTimeout(() => r('timeout'), timeoutMs);
    });
    const outcome = await Promise.race([exited.then(() => 'exited' as const), timedOutP]);
    clearTimeout(timer);
    if (outcome === 'exited') return;
  }
  // Every process of the container (they may share the pod's PID namespace, where the init's
  // death does not take them along), and the init itself (`kill --all` finds processes through
  // the container's cgroup; the init is signalled directly whatever the cgroup says).
  await ignoreGone(agent.signalContainer(record.id, 9, true, { timeoutMs: CALL_MS }), exited);
  await ignoreGone(agent.signalContainer(record.id, 9, false, { timeoutMs: CALL_MS }), exited);
  await exited;
}

/** How long a failed signal waits for the exit report of a container that died just before it. */
const EXIT_REPORT_GRACE_MS = 2000;

async function ignoreGone(p: Promise<void>, exited: Promise<unknown>): Promise<void> {
  try {
    await p;
  } catch (err) {
    if (await goneWhenSignalled(err, exited)) return;
    throw err;
  }
}

/** Whether a signal that failed with `err` failed because the container is not running (any more). */
async function goneWhenSignalled(err: unknown, exited: Promise<unknown>): Promise<boolean> {
  // A paused pod's held agent refused the call (sandbox/pause.ts): the process is there, frozen.
  if (isReason(err, 'SANDBOX_PAUSED')) return false;
  // Not found, or already stopped: the agent says the container is not running.
  if (isKataError(err) && (err.kind === 'not_found' || err.kind === 'precondition')) return true;
  // It exited between the agent's state check and crun's kill ("open pidfd: No such process"):
  // its exit report follows within moments (found by the soak: StopContainer of a container that
  // had just exited answered INTERNAL).
  let timer: NodeJS.Timeout | undefined;
  const grace = new Promise<false>((r) => {
    timer = setTimeout(() => r(false), EXIT_REPORT_GRACE_MS);
  });
  const gone = await Promise.race([
    exited.then(
      () => true,
      () => true,
    ),
    grace,
  ]);
  clearTimeout(timer);
  return gone;
}

/**
 * A signal to a running container's process (`all`: every process of the container); false when
 * it had exited already (or exits just then), as the agent's refusal or the exit report says.
 */
export async function signalInGuest(
  agent: AgentClient,
  record: ContainerRecord,
  signal: number,
  all: boolean,
  exited: Promise<unknown>,
): Promise<boolean> {
  try {
    await agent.signalContainer(record.id, signal, all, { timeoutMs: CALL_MS });
    return true;
  } catch (err) {
    if (await goneWhenSignalled(err, exited)) return false;
    throw err;
  }
}

export interface ExecSyncResult {
  stdout: Buffer;
  stderr: Buffer;
  exitCode: number;
}

/**
 * ExecSync: run `cmd` with the container's process settings (user, env, cwd, capabilities), collect
 * stdout and stderr (each bounded to `maxBytes`, then truncated with a note; the rest is read and
 * dropped so the process never blocks), and wait. With a timeout the process is killed when it
 * passes and the call fails with DEADLINE_EXCEEDED after the process is gone.
 */
export async function execSync(
  agent: AgentClient,
  record: ContainerRecord,
  cmd: readonly string[],
  timeoutMs: number,
  maxBytes = EXEC_SYNC_MAX_BYTES,
): Promise<ExecSyncResult> {
  if (cmd.length === 0) throw invalid('CONTAINER_EXEC_EMPTY', 'cmd is empty; ExecSync needs a command');
  const execId = `sync-${randomBytes(8).toString('hex')}`;
  await agent.execProcess(execProcessRequest(record, { execId, cmd, tty: false, stdin: false }), { timeoutMs: CALL_MS });
  const abort = new AbortController();
  const collect = async (stream: 'OUTPUT_STREAM_STDOUT' | 'OUTPUT_STREAM_STDERR'): Promise<Buffer> => {
    const parts: Buffer[] = [];
    let size = 0;
    let truncated = false;
    try {
      for await (const chunk of agent.readProcessOutput(record.id, execId, stream, { signal: abort.signal })) {
        if (size < maxBytes) {
          const take = Math.min(chunk.data.length, maxBytes - size);
          parts.push(Buffer.from(chunk.data.subarray(0, take)));
          size += take;
          if (take < chunk.data.length) truncated = true;
        } else if (chunk.data.length > 0) truncated = true;
        if (chunk.eof) break;
      }
    } catch (err) {
      if (!abort.signal.aborted) throw err;
    }
    if (truncated) parts.push(Buffer.from(TRUNCATED_NOTE));
    return Buffer.concat(parts);
  };
  const outputs = Promise.all([collect('OUTPUT_STREAM_STDOUT'), collect('OUTPUT_STREAM_STDERR')]);
  outputs.catch(() => undefined);
  try {
    let exit: ExitStatus;
    if (timeoutMs > 0) {
      try {
        exit = await agent.waitProcess(record.id, execId, { timeoutMs });
      } catch (err) {
        if (!(isKataError(err) && err.kind === 'timeout')) throw err;
        // The process must be gone, not only the call returned (critest checks).
        await agent.signalProcess(record.id, execId, 9, { timeoutMs: CALL_MS }).catch(() => undefined);
        await agent.waitProcess(record.id, execId, { timeoutMs: CALL_MS }).catch(() => undefined);
        abort.abort();
        throw timedOut('CONTAINER_EXEC_TIMEOUT', `command timed out after ${timeoutMs} ms and was killed`);
      }
    } else exit = await agent.waitProcess(record.id, execId, { timeoutMs: WAIT_CALL_MS });
    const [stdout, stderr] = await outputs;
    return { stdout, stderr, exitCode: exit.exitCode };
  } finally {
    abort.abort();
    await agent.deleteProcess(record.id, execId, { timeoutMs: CALL_MS }).catch((err: unknown) => {
      if (!(isKataError(err) && err.kind === 'not_found')) void errorMessage(err);
    });
  }
}
