/**
 * The guest's serial console log, which QEMU writes (`-chardev file,...,append=on`) in a
 * directory it owns when confined (`<workDir>/vmm`). Nothing in that directory is trusted: the
 * runtime reaches it through a directory fd opened before the guest ran (rename-proof, so a
 * pooled VM's renamed work dir is still found), opens the log without following a link or
 * blocking, reads only a regular file with one name, and keeps its size bounded: past
 * CONSOLE_LOG_MAX_BYTES its last CONSOLE_LOG_MAX_BYTES go to `console.log.1` (the one rotated
 * file) and the log is truncated, which QEMU's O_APPEND writes follow.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, constants, promises as fsp, openSync } from 'node:fs';
import path from 'node:path';
import { errorMessage } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { openUntrusted, tailFile } from './log-tail.js';

/**
 * The console log's cap. A guest that prints forever must not fill the state disk: with the
 * one rotated file a VM's console takes at most twice this, plus what the guest prints in one
 * check interval (the guest's serial write rate was not measured yet: the overshoot is that rate
 * times CONSOLE_LOG_CHECK_INTERVAL_MS).
 */
export const CONSOLE_LOG_MAX_BYTES = 4 * 1024 * 1024;
/** How often the size is checked. */
export const CONSOLE_LOG_CHECK_INTERVAL_MS = 1_000;
/** The rotated file's name beside the log. */
export const CONSOLE_LOG_ROTATED_SUFFIX = '.1';
/** Copy unit of a rotation (the daemon never holds more of the log than this at once). */
const COPY_CHUNK_BYTES = 64 * 1024;

export interface ConsoleLogOptions {
  maxBytes?: number;
  checkIntervalMs?: number;
}

/** What one check did. */
export type ConsoleCheck = 'absent' | 'within-cap' | 'rotated' | 'unsafe';

/** One VM's console log, reached only beneath its directory's fd. Close it when the VM is gone. */
export class ConsoleLog {
  private readonly dirFd: number;
  private readonly name: string;
  private readonly maxBytes: number;
  private timer: NodeJS.Timeout | undefined;
  private checking = false;
  private closedFlag = false;

  /**
   * Open the log's directory now (before the guest runs; its parent, the work dir, is root's, so
   * only the last component needs O_NOFOLLOW). Throws when the directory cannot be opened.
   */
  constructor(
    file: string,
    private readonly logger: Logger,
    options: ConsoleLogOptions = {},
  ) {
    this.dirFd = openSync(path.dirname(file), constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    this.name = path.basename(file);
    this.maxBytes = options.maxBytes ?? CONSOLE_LOG_MAX_BYTES;
    const intervalMs = options.checkIntervalMs ?? CONSOLE_LOG_CHECK_INTERVAL_MS;
    if (intervalMs > 0) {
      this.timer = setInterval(() => void this.check(), intervalMs);
      this.timer.unref();
    }
  }

  /** A name beneath the directory fd: the magic link resolves to the directory wherever it moved. */
  beneath(name: string): string {
    return `/proc/self/fd/${this.dirFd}/${name}`;
  }

  /** The last `lines` lines, read safely ('' when absent or refused). */
  async tail(lines: number): Promise<string> {
    if (this.closedFlag) return '';
    try {
      return await tailFile(this.beneath(this.name), lines);
    } catch (err) {
      this.logger.warn({ err: errorMessage(err) }, 'console log not read');
      return '';
    }
  }

  /**
   * Check the size once and rotate past the cap. Never throws: a failed check is logged and the
   * next one tries again.
   */
  async check(): Promise<ConsoleCheck> {
    if (this.checking || this.closedFlag) return 'within-cap';
    this.checking = true;
    try {
      return await this.checkOnce();
    } catch (err) {
      this.logger.warn({ err: errorMessage(err) }, 'console log check failed');
      return 'unsafe';
    } finally {
      this.checking = false;
    }
  }

  /** Stop checking and close the directory fd. */
  close(): void {
    if (this.closedFlag) return;
    this.closedFlag = true;
    clearInterval(this.timer);
    closeSync(this.dirFd);
  }

  private async checkOnce(): Promise<ConsoleCheck> {
    const flags = constants.O_RDWR | constants.O_NOFOLLOW | constants.O_NONBLOCK;
    const log = await openUntrusted(this.beneath(this.name), flags);
    if (log === undefined) return 'absent';
    try {
      const { size } = await log.stat();
      if (size <= this.maxBytes) return 'within-cap';
      await this.rotate(log, size);
      this.logger.info({ sizeBytes: size, maxBytes: this.maxBytes }, 'console log rotated');
      return 'rotated';
    } finally {
      await log.close();
    }
  }

  /**
   * Copy the last maxBytes to a new file (created exclusively, never through a link), rename it
   * over the rotated name (rename replaces whatever entry is there, a planted link included, and
   * follows nothing), then truncate the log. Lines the guest prints between the copy and the
   * truncation are lost: the price of never making QEMU reopen its file.
   */
  private async rotate(log: fsp.FileHandle, size: number): Promise<void> {
    const temp = this.beneath(`.${this.name}${CONSOLE_LOG_ROTATED_SUFFIX}.${randomBytes(6).toString('hex')}`);
    const out = await fsp.open(temp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      const buffer = Buffer.alloc(COPY_CHUNK_BYTES);
      for (let at = size - this.maxBytes; at < size; ) {
        const { bytesRead } = await log.read(buffer, 0, Math.min(COPY_CHUNK_BYTES, size - at), at);
        if (bytesRead === 0) break;
        await out.write(buffer, 0, bytesRead);
        at += bytesRead;
      }
      await out.close();
      await fsp.rename(temp, this.beneath(`${this.name}${CONSOLE_LOG_ROTATED_SUFFIX}`));
    } catch (err) {
      await out.close().catch(() => undefined);
      await fsp.rm(temp, { force: true });
      throw err;
    }
    await log.truncate(0);
  }
}
