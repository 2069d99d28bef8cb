/**
 * Every OOM kill in a running container, as it happens: the container's cgroup v2 `memory.events`
 * counts them (`oom_kill`), and the kernel raises a file-modified event on that file whenever a
 * count changes. A kill that leaves the container's init alive (a child, a worker) is told as
 * much as one that ends it; containerd's runc shim watches the same file for the same reason.
 */
import { type FSWatcher, watch } from 'node:fs';
import path from 'node:path';
import { readOomKills } from './cgroup.js';

/** Re-read the count this often as well: a watch that could not be set up, or a missed event. */
export const OOM_POLL_MS = 2_000;

export interface OomWatch {
  /** Kills counted so far (the count at the start of the watch is the baseline, already told). */
  readonly seen: bigint;
  /** Read the count now and tell what is new; resolves with the count. */
  check(): Promise<bigint>;
  stop(): void;
}

/**
 * Watch `cgroupDir`'s oom_kill count from `baseline`; `onKills` is called with the new count each
 * time it grows (several kills between two reads are one call). Reads are serialised, so a count is
 * told once.
 */
export function watchOomKills(cgroupDir: string, baseline: bigint, onKills: (count: bigint) => void, pollMs = OOM_POLL_MS): OomWatch {
  let seen = baseline;
  let stopped = false;
  let reading: Promise<bigint> = Promise.resolve(baseline);
  const check = (): Promise<bigint> => {
    reading = reading.then(async () => {
      if (stopped) return seen;
      const count = await readOomKills(cgroupDir).catch(() => seen);
      if (count > seen) {
        seen = count;
        onKills(count);
      }
      return seen;
    });
    return reading;
  };
  let watcher: FSWatcher | undefined;
  try {
    watcher = watch(path.join(cgroupDir, 'memory.events'), { persistent: false }, () => void check());
    watcher.on('error', () => watcher?.close());
  } catch {
    // No memory controller, or no inotify on this file: the poll alone.
  }
  const timer = setInterval(() => void check(), pollMs);
  timer.unref();
  return {
    get seen() {
      return seen;
    },
    check,
    stop: () => {
      stopped = true;
      watcher?.close();
      clearInterval(timer);
    },
  };
}
