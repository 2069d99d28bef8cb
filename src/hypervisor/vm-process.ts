import path from 'node:path';
import { errorMessage, internal, type KataError, precondition, timedOut } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { isSameLiveProcess } from '../common/procfs.js';
import { ConsoleLog } from './console-log.js';
import type { GuestReport } from './guest-protocol.js';
import { tailFile } from './log-tail.js';
import type { QmpClient } from './qmp/client.js';
import type { ReadyChannel } from './ready-channel.js';
import type { HypervisorReason } from './reasons.js';

/** Files of one VM: the sockets QEMU listens on, the guest console and QEMU's own stderr. */
export interface VmPaths {
  qmpSocket: string;
  readySocket: string;
  consoleLog: string;
  qemuLog: string;
}

/** The conventional layout inside a VM's work directory. */
export function vmPaths(workDir: string): VmPaths {
  return {
    qmpSocket: path.join(workDir, 'qmp.sock'),
    readySocket: path.join(workDir, 'ready.sock'),
    consoleLog: path.join(workDir, 'console.log'),
    qemuLog: path.join(workDir, 'qemu.log'),
  };
}

/**
 * How QEMU ended. `code`/`signal` are known only for a QEMU this daemon started (its child);
 * for an attached one both are null. `shutdownReason` is the reason of QEMU's last SHUTDOWN
 * event (`guest-shutdown`, `host-qmp-quit`, `guest-panic`, ...), null when none was seen.
 */
export interface ExitInfo {
  code: number | null;
  signal: string | null;
  shutdownReason: string | null;
  /**
   * Set when the runtime ended QEMU itself because the VM broke a protocol (the guest flooded
   * its ready port, QEMU sent QMP garbage): the VM failed, and this says why. Absent otherwise.
   */
  failure?: KataError;
}

export interface ShutdownResult {
  /** Which step stopped QEMU. */
  how: 'powerdown' | 'quit' | 'kill' | 'already-exited';
  exit: ExitInfo;
}

/** A running (or exited) QEMU and the connections to it. */
export interface VmProcess {
  readonly pid: number;
  /** From /proc/<pid>/stat: persisted with the pid so that a reused pid is never mistaken for it. */
  readonly startTimeTicks: number;
  readonly qmp: QmpClient;
  readonly paths: Partial<VmPaths>;
  /** Settles when QEMU has exited (never after release()). */
  readonly exited: Promise<ExitInfo>;
  readonly exitInfo: ExitInfo | undefined;
  /** The latest guest report (ready or update), if the ready channel is connected. */
  readonly guestReport: GuestReport | undefined;
  /** QMP `cont`: leave the paused (-S) state. */
  resume(): Promise<void>;
  /** The guest's KATA_TS_READY report; rejects on timeout or when QEMU exits first. */
  waitForReady(timeoutMs: number): Promise<GuestReport>;
  /** The next (or current) report satisfying `predicate`, e.g. after a hot-plug. */
  waitForGuestReport(predicate: (r: GuestReport) => boolean, timeoutMs: number): Promise<GuestReport>;
  onGuestReport(listener: (r: GuestReport) => void): () => void;
  /** ACPI power button, then QMP quit, then SIGKILL, within `timeoutMs` overall. Idempotent. */
  shutdown(options: { timeoutMs: number }): Promise<ShutdownResult>;
  /** SIGKILL now and wait for the exit. */
  kill(): Promise<ExitInfo>;
  /**
   * The VM broke a protocol (its guest flooded a channel): SIGKILL, and its exit carries `err` as
   * `failure`. A no-op once it exited or failed.
   */
  fail(err: KataError): void;
  /** The last lines QEMU wrote to stderr/stdout. */
  logTail(lines?: number): Promise<string>;
  /** The last lines of the guest's serial console. */
  consoleTail(lines?: number): Promise<string>;
  /** Close our connections and stop watching, leaving QEMU running (daemon shutdown). */
  release(): void;
}

/** Console lines read as QEMU exits, for the exit record and errors after it. */
const CONSOLE_LINES_KEPT_AT_EXIT = 50;

/** How long after SIGKILL we still wait for the exit to be observed. */
const KILL_GRACE_MS = 5_000;

export interface VmHandleInit {
  pid: number;
  startTimeTicks: number;
  qmp: QmpClient;
  ready: ReadyChannel | undefined;
  paths: Partial<VmPaths>;
  logger: Logger;
  /** Resolves with code and signal when QEMU exits (child exit, or pid gone for an attached VM). */
  processExit: Promise<{ code: number | null; signal: string | null }>;
  /** Called by release(): stop watching the process. */
  stopWatching: () => void;
}

export class VmHandle implements VmProcess {
  readonly pid: number;
  readonly startTimeTicks: number;
  readonly qmp: QmpClient;
  readonly paths: Partial<VmPaths>;
  readonly exited: Promise<ExitInfo>;
  private exitValue: ExitInfo | undefined;
  private shutdownReason: string | null = null;
  private readonly ready: ReadyChannel | undefined;
  private readonly logger: Logger;
  private readonly stopWatching: () => void;
  private shutdownInFlight: Promise<ShutdownResult> | undefined;
  private failure: KataError | undefined;
  /** The console log, reached beneath its directory's fd (undefined when it has none). */
  private readonly consoleLog: ConsoleLog | undefined;
  /** The console's last lines, read as QEMU exited (the directory fd closes then). */
  private consoleAtExit: string | undefined;

  constructor(init: VmHandleInit) {
    this.pid = init.pid;
    this.startTimeTicks = init.startTimeTicks;
    this.qmp = init.qmp;
    this.paths = init.paths;
    this.ready = init.ready;
    this.logger = init.logger;
    this.stopWatching = init.stopWatching;
    this.consoleLog = this.openConsoleLog(init.paths.consoleLog);
    this.qmp.on('SHUTDOWN', (e) => {
      this.shutdownReason = typeof e.data?.reason === 'string' ? e.data.reason : 'unknown';
    });
    // A VM that breaks a protocol is failed here, in its own handle: never an exception that
    // could reach the process, never a connection that buffers on.
    this.ready?.onViolation((err) => this.fail(err));
    void this.qmp.closed.then((info) => {
      if (info.violation !== undefined) this.fail(info.violation);
    });
    this.exited = init.processExit.then(async ({ code, signal }) => {
      if (this.consoleLog !== undefined) {
        this.consoleAtExit = await this.consoleLog.tail(CONSOLE_LINES_KEPT_AT_EXIT);
        this.consoleLog.close();
      }
      this.exitValue = {
        code,
        signal,
        shutdownReason: this.shutdownReason,
        ...(this.failure === undefined ? {} : { failure: this.failure }),
      };
      this.qmp.close();
      this.ready?.close();
      this.logger.info({ pid: this.pid, ...this.exitValue }, 'QEMU exited');
      return this.exitValue;
    });
  }

  get exitInfo(): ExitInfo | undefined {
    return this.exitValue;
  }

  get guestReport(): GuestReport | undefined {
    return this.ready?.latest;
  }

  resume(): Promise<void> {
    return this.qmp.cont();
  }

  waitForReady(timeoutMs: number): Promise<GuestReport> {
    return this.waitForReport((r) => r.kind === 'ready', timeoutMs, 'GUEST_READY_TIMEOUT', 'the guest ready report', true);
  }

  waitForGuestReport(predicate: (r: GuestReport) => boolean, timeoutMs: number): Promise<GuestReport> {
    return this.waitForReport(predicate, timeoutMs, 'GUEST_REPORT_TIMEOUT', 'the expected guest report', false);
  }

  onGuestReport(listener: (r: GuestReport) => void): () => void {
    return this.ready?.on(listener) ?? (() => undefined);
  }

  shutdown(options: { timeoutMs: number }): Promise<ShutdownResult> {
    this.shutdownInFlight ??= this.runShutdown(options.timeoutMs);
    return this.shutdownInFlight;
  }

  async kill(): Promise<ExitInfo> {
    this.signalKill();
    return this.exited;
  }

  logTail(lines = 20): Promise<string> {
    return this.paths.qemuLog === undefined ? Promise.resolve('') : tailFile(this.paths.qemuLog, lines);
  }

  consoleTail(lines = 20): Promise<string> {
    if (this.consoleAtExit !== undefined) return Promise.resolve(this.consoleAtExit.split('\n').slice(-lines).join('\n'));
    return this.consoleLog?.tail(lines) ?? Promise.resolve('');
  }

  /** Check the console log's size now (and rotate it past its cap); tests and the periodic check. */
  checkConsoleLog(): Promise<string> {
    return this.consoleLog?.check() ?? Promise.resolve('absent');
  }

  private openConsoleLog(file: string | undefined): ConsoleLog | undefined {
    if (file === undefined) return undefined;
    try {
      return new ConsoleLog(file, this.logger);
    } catch (err) {
      this.logger.warn({ file, err: errorMessage(err) }, 'console log directory not opened; its tail is unavailable');
      return undefined;
    }
  }

  /**
   * Fail the VM: it broke a protocol and is no longer trusted. QEMU is killed; its exit carries
   * `err` as `failure`, which its owner records as the reason the pod went NOTREADY.
   */
  fail(err: KataError): void {
    if (this.exitValue !== undefined || this.failure !== undefined) return;
    this.failure = err;
    this.logger.error({ pid: this.pid, reason: err.reason, err: err.message }, 'failing the VM: it broke a protocol');
    this.signalKill();
  }

  release(): void {
    this.stopWatching();
    this.consoleLog?.close();
    this.qmp.close();
    this.ready?.close();
  }

  private waitForReport(
    predicate: (r: GuestReport) => boolean,
    timeoutMs: number,
    timeoutReason: HypervisorReason,
    what: string,
    readyOnly: boolean,
  ): Promise<GuestReport> {
    const ready = this.ready;
    if (ready === undefined) {
      return Promise.reject(precondition('VM_READY_CHANNEL_MISSING', `VM pid ${this.pid} has no connected ready channel.`));
    }
    const current = readyOnly ? ready.ready : ready.latest;
    if (current !== undefined && predicate(current)) return Promise.resolve(current);
    return new Promise((resolve, reject) => {
      let done = false;
      const finish = (): void => {
        done = true;
        clearTimeout(timer);
        off();
      };
      const off = ready.on((r) => {
        if (!done && predicate(r)) {
          finish();
          resolve(r);
        }
      });
      const timer = setTimeout(() => {
        finish();
        void this.consoleTail(10)
          .catch(() => '')
          .then((consoleTail) =>
            reject(
              timedOut(timeoutReason, `VM pid ${this.pid} did not send ${what} within ${timeoutMs} ms.`, { details: { consoleTail } }),
            ),
          );
      }, timeoutMs);
      void this.exited.then(async (exit) => {
        if (done) return;
        finish();
        reject(await this.exitedError(exit, `before sending ${what}`));
      });
    });
  }

  /** A precise error for "QEMU went away", carrying the tails of its log and of the console. */
  async exitedError(exit: ExitInfo, when: string): Promise<KataError> {
    const [logTail, consoleTail] = await Promise.all([this.logTail(10).catch(() => ''), this.consoleTail(10).catch(() => '')]);
    const status = exit.signal !== null ? `signal ${exit.signal}` : exit.code !== null ? `code ${exit.code}` : 'unknown status';
    const reason = exit.shutdownReason !== null ? ` (shutdown reason ${exit.shutdownReason})` : '';
    const log = logTail.trim() === '' ? '' : `; its log ends: ${logTail.trim().split('\n').slice(-3).join(' | ')}`;
    return internal('QEMU_EXITED', `QEMU pid ${this.pid} exited with ${status}${reason} ${when}${log}.`, {
      details: { pid: this.pid, ...exit, logTail, consoleTail },
    });
  }

  private async runShutdown(timeoutMs: number): Promise<ShutdownResult> {
    if (this.exitValue !== undefined) return { how: 'already-exited', exit: this.exitValue };
    const deadline = Date.now() + timeoutMs;
    const remaining = (): number => Math.max(0, deadline - Date.now());
    // The guest gets two thirds of the time to power off; a paused guest cannot react at all.
    const powerdownDeadline = Date.now() + Math.floor((timeoutMs * 2) / 3);
    try {
      const status = await this.qmp.queryStatus({ timeoutMs: Math.max(1, Math.min(2_000, remaining())) });
      if (status.running) {
        await this.qmp.systemPowerdown({ timeoutMs: Math.max(1, Math.min(2_000, remaining())) });
        const exit = await this.exitWithin(powerdownDeadline - Date.now());
        if (exit !== undefined) return { how: 'powerdown', exit };
      }
    } catch (err) {
      this.logger.debug({ pid: this.pid, err: errorMessage(err) }, 'powerdown step failed, trying quit');
    }
    if (this.exitValue !== undefined) return { how: 'powerdown', exit: this.exitValue };
    try {
      await this.qmp.quit({ timeoutMs: Math.max(1, remaining()) });
      const exit = await this.exitWithin(remaining());
      if (exit !== undefined) return { how: 'quit', exit };
    } catch (err) {
      this.logger.debug({ pid: this.pid, err: errorMessage(err) }, 'quit step failed, killing');
    }
    if (this.exitValue !== undefined) return { how: 'quit', exit: this.exitValue };
    this.logger.warn({ pid: this.pid, timeoutMs }, 'QEMU did not stop in time; sending SIGKILL');
    this.signalKill();
    const exit = await this.exitWithin(KILL_GRACE_MS);
    if (exit === undefined) {
      throw internal('QEMU_KILL_FAILED', `QEMU pid ${this.pid} was sent SIGKILL but had not exited ${KILL_GRACE_MS} ms later.`);
    }
    return { how: 'kill', exit };
  }

  private exitWithin(ms: number): Promise<ExitInfo | undefined> {
    if (this.exitValue !== undefined) return Promise.resolve(this.exitValue);
    if (ms <= 0) return Promise.resolve(undefined);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(undefined), ms);
      void this.exited.then((exit) => {
        clearTimeout(timer);
        resolve(exit);
      });
    });
  }

  private signalKill(): void {
    if (this.exitValue !== undefined) return;
    // Only signal the process we started: after an exit the pid may already belong to another.
    if (!isSameLiveProcess(this.pid, this.startTimeTicks)) return;
    try {
      process.kill(this.pid, 'SIGKILL');
    } catch (err) {
      this.logger.debug({ pid: this.pid, err: errorMessage(err) }, 'SIGKILL failed');
    }
  }
}
