/**
 * Waiting in tests: for a state (until) or for progress to finish (untilProgress). Every bound is
 * scaled to the machine (time-scale.ts), and a wait that gives up says what it saw last, so a red
 * run on a slow machine tells "slow" (still moving) from "stuck" (nothing new) from "wrong".
 *
 * No vitest import: a bench may wait too.
 */
import { promises as fsp } from 'node:fs';
import { scaledMs } from './time-scale.js';

/** Hands the poller a short description of what was observed this round, for the failure message. */
export type Note = (seen: unknown) => void;

/**
 * Polls `fn` every `intervalMs` until it answers something other than undefined; throws once
 * `timeoutMs` (sized for an idle two-core machine, scaled to this one) has passed, with the last
 * observation `fn` passed to `note` (e.g. the state it found, or the last log line).
 */
export async function until<T>(what: string, fn: (note: Note) => Promise<T | undefined>, timeoutMs = 60_000, intervalMs = 100): Promise<T> {
  const boundMs = scaledMs(timeoutMs);
  const startedAt = Date.now();
  let seen: unknown = NOT_NOTED;
  let rounds = 0;
  for (;;) {
    const v = await fn((s) => {
      seen = s;
    });
    rounds++;
    if (v !== undefined) return v;
    if (Date.now() - startedAt > boundMs) {
      throw new Error(`timed out after ${seconds(boundMs)} waiting for ${what} (${rounds} polls); last seen: ${describeSeen(seen)}`);
    }
    await sleep(intervalMs);
  }
}

/** `until` for a value that must come to pass `ok`: polls `fn`, notes each value, returns the first that passes. */
export function untilMatches<T>(what: string, fn: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 60_000): Promise<T> {
  return until(
    what,
    async (note) => {
      const v = await fn();
      note(v);
      return ok(v) ? v : undefined;
    },
    timeoutMs,
  );
}

/** One look at something that moves towards an end: whether it is there, and how far it got. */
export interface ProgressProbe<T> {
  /** The result once the wait is over; undefined while it is not. */
  done: T | undefined;
  /** How far it got (a count, the last line): any change since the previous look is progress. */
  progress: string | number;
  /** What to report if the wait gives up; defaults to `progress`. */
  seen?: unknown;
}

/**
 * Polls `probe` until it is done, failing only when it has made no progress for `stallMs`
 * (scaled): a slow machine gets there later, a stuck one fails as soon as it stops moving, and
 * the message says how far it got. The vitest timeout of the test is the overall cap.
 */
export async function untilProgress<T>(
  what: string,
  probe: () => Promise<ProgressProbe<T>>,
  stallMs = 30_000,
  intervalMs = 200,
): Promise<T> {
  const boundMs = scaledMs(stallMs);
  const startedAt = Date.now();
  let lastProgress: string | number | undefined;
  let movedAt = startedAt;
  for (;;) {
    const look = await probe();
    if (look.done !== undefined) return look.done;
    const now = Date.now();
    if (look.progress !== lastProgress) {
      lastProgress = look.progress;
      movedAt = now;
    } else if (now - movedAt > boundMs) {
      throw new Error(
        `gave up waiting for ${what}: nothing new for ${seconds(boundMs)} (after ${seconds(now - startedAt)} in all); ` +
          `last seen: ${describeSeen(look.seen ?? look.progress)}`,
      );
    }
    await sleep(intervalMs);
  }
}

/** CRI log file -> "stream tag text" lines (the timestamp dropped); a missing file has none. */
export async function criLogLines(file: string): Promise<string[]> {
  const text = await fsp.readFile(file, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.split(' ').slice(1).join(' '));
}

/**
 * Waits until the CRI log lines of `files` (read in order and joined, e.g. a rotated `x.log.1`
 * then `x.log`) satisfy `done`, as long as lines keep coming; resolves with those lines.
 */
export function untilLogLines(what: string, files: string[], done: (lines: string[]) => boolean, stallMs = 30_000): Promise<string[]> {
  return untilProgress(
    what,
    async () => {
      const lines = (await Promise.all(files.map(criLogLines))).flat();
      return {
        done: done(lines) ? lines : undefined,
        progress: lines.length,
        seen: `${lines.length} lines, the last ${JSON.stringify(lines.at(-1) ?? null)}`,
      };
    },
    stallMs,
  );
}

const NOT_NOTED = Symbol('nothing noted');

function describeSeen(seen: unknown): string {
  if (seen === NOT_NOTED) return 'nothing (the probe noted no observation)';
  if (typeof seen === 'string') return seen;
  try {
    const json = JSON.stringify(seen, (_k, v: unknown) => (typeof v === 'bigint' ? String(v) : v));
    return json === undefined ? String(seen) : json.length > 2_000 ? `${json.slice(0, 2_000)}...` : json;
  } catch {
    return String(seen);
  }
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
