import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { internal, type KataError, precondition } from '../../../src/common/errors.js';

/** What the reaper (native/reaper.c) reports about the process it watches. */
export type WaitStatus = { kind: 'exit'; code: number } | { kind: 'signal'; signal: number };

const PROCESS_NOT_RUNNABLE: readonly RegExp[] = [
  // crun's own steps on the process's behalf: finding and opening the executable, its cwd.
  /^(open executable|chdir to .*|exec(ve)? .*): /,
  /executable file .* not found/,
  // The container's own memory limit is too small for the runtime to set the process up.
  /^OOM: the memory limit could be too low/,
  /: (No such file or directory|Permission denied|Not a directory|Is a directory|Exec format error)$/,
];

/**
 * Why the OCI runtime did not start a process, from the last line of its log. The process the
 * request names cannot be run (no such executable, not executable, a working directory that is
 * not there, a memory limit too small to start in): FAILED_PRECONDITION, the request's doing.
 * Anything else is ours: INTERNAL. Either way the runtime's own words are in the sentence.
 */
export function startFailure(reason: string, runtimeLog: string): KataError {
  const line =
    runtimeLog
      .trim()
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l !== '')
      .at(-1) ?? '';
  const details = { reason, runtimeLog: runtimeLog.trim() };
  if (PROCESS_NOT_RUNNABLE.some((re) => re.test(line)))
    return precondition('RUNTIME_PROCESS_NOT_RUNNABLE', `The process cannot be started in the container: ${line}.`, { details });
  return internal('RUNTIME_START_FAILED', `The OCI runtime could not start the process${line === '' ? '' : `: ${line}`}.`, { details });
}

/** A process running under kata-ts-reaper: the runtime command first, then what it started. */
export interface Reaped {
  /** Resolves with the watched pid once the runtime command succeeded; rejects otherwise. */
  pid: Promise<number>;
  /** Resolves with the watched process's wait status (never rejects; a lost reaper reads as 255). */
  exited: Promise<WaitStatus>;
  stdin: Writable | undefined;
  /** Absent with a spool (the reaper writes the output there). */
  stdout: Readable | undefined;
  /** Absent with a terminal or a spool. */
  stderr: Readable | undefined;
  /** Terminal size requests (tty mode): lines "ROWS COLS". */
  resize: Writable | undefined;
}

export interface ReapOptions {
  reaperPath: string;
  /** The runtime command (create or exec --detach) that writes `pidFile`. */
  runtimeArgv: string[];
  pidFile: string;
  /** crun's --log file, read to explain a failure. */
  logFile: string;
  /** tty mode: the reaper listens here for crun's pty master and relays it as stdin/stdout. */
  consoleSocket?: string;
  stdin: boolean;
  /**
   * The reaper holds the output pipes (or the pty) itself and appends the output to this file
   * (output-spool.ts reads it): the output survives an agent restart.
   */
  spool?: string;
}

/** Parses one status line of the reaper. */
export function parseStatusLine(line: string): { event: string; value: string } {
  const space = line.indexOf(' ');
  return space < 0 ? { event: line, value: '' } : { event: line.slice(0, space), value: line.slice(space + 1) };
}

/**
 * Starts the reaper in its own session (signals to the agent's group do not reach it) with the
 * process's stdio as pipes: the runtime passes them on to the container, the reaper drops its
 * copies, so EOF arrives when the container's processes close them.
 */
export function reap(options: ReapOptions): Reaped {
  const args = [
    ...(options.consoleSocket ? ['-t', options.consoleSocket] : []),
    ...(options.spool ? ['-s', options.spool] : []),
    options.pidFile,
    '--',
    ...options.runtimeArgv,
  ];
  const child = spawn(options.reaperPath, args, {
    // With a terminal the pty carries both output streams: the reaper relays it as stdout.
    stdio: [
      options.stdin ? 'pipe' : 'ignore',
      options.spool ? 'ignore' : 'pipe',
      options.consoleSocket || options.spool ? 'ignore' : 'pipe',
      'pipe',
      options.consoleSocket ? 'pipe' : 'ignore',
    ],
    detached: true,
  });
  const status = child.stdio[3] as Readable;
  let resolvePid: (pid: number) => void = () => {};
  let rejectPid: (err: unknown) => void = () => {};
  const pid = new Promise<number>((resolve, reject) => {
    resolvePid = resolve;
    rejectPid = reject;
  });
  let resolveExit: (s: WaitStatus) => void = () => {};
  const exited = new Promise<WaitStatus>((resolve) => {
    resolveExit = resolve;
  });
  const failStart = (reason: string) => {
    void readFile(options.logFile, 'utf8')
      .catch(() => '')
      .then((log) => rejectPid(startFailure(reason, log)));
  };
  const lines = createInterface({ input: status });
  lines.on('line', (line) => {
    const { event, value } = parseStatusLine(line);
    const n = Number(value);
    if (event === 'pid') resolvePid(n);
    else if (event === 'runtime-exit' || event === 'runtime-signal' || event === 'error') failStart(line);
    if (event === 'exit' || event === 'signal') {
      resolveExit(event === 'exit' ? { kind: 'exit', code: n } : { kind: 'signal', signal: n });
    }
  });
  child.on('error', (err) => failStart(err.message));
  lines.on('close', () => {
    // Only the reaper holds the status pipe: its end means the reaper is gone. Without a report
    // (killed, or failed) the status is unknown; both calls are no-ops after a report.
    failStart('reaper ended');
    resolveExit({ kind: 'exit', code: 255 });
  });
  child.unref();
  // Writing to a process that has exited fails with EPIPE: the writer sees it in its callback,
  // and the stream's 'error' event must not go unheard (it would end the agent).
  child.stdin?.on('error', () => {});
  (child.stdio[4] as Writable | null)?.on('error', () => {});
  return {
    pid,
    exited,
    stdin: child.stdin ?? undefined,
    stdout: child.stdout ? relay(child.stdout) : undefined,
    stderr: child.stderr ? relay(child.stderr) : undefined,
    resize: (child.stdio[4] as Writable | null) ?? undefined,
  };
}

/**
 * Node resumes (and so discards) a child's stdout/stderr that nobody listens to when the child
 * exits, and the reaper exits as soon as the container does, often before the consumer has read
 * the output. A pipe() into a PassThrough listens from the start without reading ahead more than
 * the two highWaterMarks: an unread PassThrough still pauses the pipe, so backpressure holds.
 */
function relay(source: Readable): Readable {
  const out = new PassThrough();
  source.on('error', (err) => out.destroy(err));
  return source.pipe(out);
}
