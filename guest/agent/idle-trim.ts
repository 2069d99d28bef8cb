/**
 * The guest's memory trim once it has settled: a few seconds after the agent started and after
 * each burst of container work (a container started or deleted, an exec ended, the pod torn
 * down), when nothing else happened meanwhile, the agent runs a full garbage collection of its own
 * heap, drops the guest's clean page cache (`vm.drop_caches=1`: what boot, node's start and crun
 * read, which a later read gets again from the host) and compacts free memory
 * (`vm.compact_memory`). The pages that frees are reported to the host by free page reporting
 * (virtio_balloon, guest/init sets the reporting order), so an idle pod's host memory falls after
 * the container started instead of staying at what its start touched. Without a balloon the trim
 * only moves pages from the page cache to the free lists.
 *
 * One trim per quiet period: a burst of calls moves the trim later, an idle guest is not trimmed
 * again, and two trims are at least IDLE_TRIM_MIN_INTERVAL_MS apart. Failures of a step are
 * logged and the other steps run.
 *
 * Quiet means no container call in flight either (`begin()`): the quiet period starts when the
 * last one ended. Counted only from the ends of some calls, the trim of a new pod ran 5 s after
 * the agent served, in the middle of its first CreateContainer and StartContainer, and dropped
 * the page cache (crun, its libraries, the image's binaries over virtio-fs, node's own code) that
 * the start and the first ExecSyncs right after it then read again (measured through the daemon:
 * an exec right after a trim 3.6 s, the next ones 1.2-1.3 s; test/conformance/README.md, session F).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { Logger } from '../../src/common/logger.js';

/** How long the guest must be quiet (no container work) before the trim runs. */
export const IDLE_TRIM_DELAY_MS = 5000;
/**
 * The least time between two trims: an exec probe every few seconds would otherwise drop the
 * page cache (crun, the probe's files) after every run, only for the next run to read it again.
 */
export const IDLE_TRIM_MIN_INTERVAL_MS = 30_000;

export interface TrimStep {
  name: string;
  run: () => Promise<void> | void;
}

export interface IdleTrimOptions {
  delayMs: number;
  /** The least time from one trim's start to the next (0: none). */
  minIntervalMs?: number;
  steps: readonly TrimStep[];
  logger: Logger;
  /**
   * Whether a trim can give anything back to the host, asked before each one (default: yes).
   * Without free page reporting it cannot: freed pages stay with the VM, and in a clone of a VM
   * template (no balloon, guest RAM a private copy-on-write map of the template's file) the trim
   * would only write to pages the clone still shares: the GC and the compaction move memory, and
   * every page they touch becomes the clone's own copy.
   */
  worthwhile?: () => Promise<boolean> | boolean;
}

/** What the agent tells the trim (guest/agent/server.ts); IdleTrim is one. */
export interface TrimNotice {
  /** Container work happened: trim once the guest has been quiet for a while. */
  note(): void;
  /** Container work starts: no trim until it ends; the returned function ends it (once) and notes. */
  begin(): () => void;
}

export class IdleTrim implements TrimNotice {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private lastTrimAt = Number.NEGATIVE_INFINITY;
  /** Container calls begun and not yet ended. */
  private inFlight = 0;
  /** Trims run so far (tests and the log read it). */
  trims = 0;
  /** Trims skipped because none was worthwhile (logged once). */
  skipped = 0;

  constructor(private readonly options: IdleTrimOptions) {}

  begin(): () => void {
    this.inFlight++;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.inFlight--;
      this.note();
    };
  }

  /** Container work happened: trim once the guest has been quiet for `delayMs` (from the end of the last call in flight). */
  note(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    // The last call in flight notes when it ends.
    if (this.inFlight > 0) return;
    const spacing = this.lastTrimAt + (this.options.minIntervalMs ?? 0) - performance.now();
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.running ??= this.run().finally(() => {
          this.running = undefined;
        });
      },
      Math.max(this.options.delayMs, spacing),
    );
    // A pending trim never keeps the agent alive.
    this.timer.unref();
  }

  /** Cancel a pending trim. */
  stop(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Run every step now, in order; the names of those that failed. Nothing when no trim is worthwhile. */
  async run(): Promise<string[]> {
    const failed: string[] = [];
    const started = performance.now();
    this.lastTrimAt = started;
    if (this.options.worthwhile !== undefined && !(await this.options.worthwhile())) {
      if (this.skipped++ === 0) this.options.logger.info('guest memory not trimmed: no free page reporting to give it back to the host');
      return failed;
    }
    for (const step of this.options.steps) {
      try {
        await step.run();
      } catch (err) {
        failed.push(step.name);
        this.options.logger.warn({ step: step.name, err: err instanceof Error ? err.message : String(err) }, 'memory trim step failed');
      }
    }
    this.trims++;
    this.options.logger.info({ trims: this.trims, failed, ms: Math.round(performance.now() - started) }, 'guest memory trimmed');
    return failed;
  }
}

/** V8's full garbage collection, reached without starting node with --expose-gc (the snapshot's flags stay as built). */
function fullGc(): () => void {
  let gc: (() => void) | undefined;
  return () => {
    if (gc === undefined) {
      setFlagsFromString('--expose-gc');
      gc = runInNewContext('gc') as () => void;
    }
    gc();
  };
}

/**
 * True when a virtio balloon device is bound to its driver (`driverDir`: the guest's sysfs):
 * the runtime gives a balloon only with free page reporting (src/hypervisor/argv.ts), so freed
 * pages reach the host. A VM template's clones have none.
 */
export async function hasReportingBalloon(driverDir = '/sys/bus/virtio/drivers/virtio_balloon'): Promise<boolean> {
  try {
    return (await fsp.readdir(driverDir)).some((name) => /^virtio\d+$/.test(name));
  } catch {
    return false;
  }
}

/** The guest's trim: the agent's heap, the clean page cache, compaction (under `procSysVmDir`). */
export function guestTrimSteps(procSysVmDir = '/proc/sys/vm'): TrimStep[] {
  return [
    { name: 'gc', run: fullGc() },
    { name: 'drop_caches', run: () => fsp.writeFile(path.join(procSysVmDir, 'drop_caches'), '1') },
    { name: 'compact_memory', run: () => fsp.writeFile(path.join(procSysVmDir, 'compact_memory'), '1') },
  ];
}
