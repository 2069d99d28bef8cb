import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { isSameLiveProcess, readProcStat } from '../hypervisor/index.js';

/** The lock file's name inside the state directory. */
export const STATE_LOCK_FILE = 'daemon.lock';

/** What the lock file says: who holds the state directory, named for good by pid + start time. */
export interface StateLockOwner {
  pid: number;
  startTimeTicks: number;
}

/** A held state-directory lock; release() gives it up (only if the file is still ours). */
export interface StateLock {
  readonly file: string;
  readonly owner: StateLockOwner;
  release(): Promise<void>;
}

/** Lock files this process holds, so that a second daemon in the same process is refused too. */
const heldHere = new Set<string>();

function parseOwner(text: string): StateLockOwner | undefined {
  const m = /^([0-9]+) ([0-9]+)\n?$/.exec(text);
  if (m === null) return undefined;
  return { pid: Number(m[1]), startTimeTicks: Number(m[2]) };
}

/** True when the owner named by the lock still runs (and, for our own pid, still holds it). */
function ownerAlive(owner: StateLockOwner, file: string): boolean {
  if (owner.pid === process.pid) return heldHere.has(file);
  return isSameLiveProcess(owner.pid, owner.startTimeTicks);
}

/**
 * Take the state directory for this daemon's life. The lock is a file created exclusively
 * (O_EXCL) holding "pid starttime"; a second daemon finds it, sees the holder alive (same pid
 * and start time, so a reused pid is not mistaken for it) and is refused with the holder's pid
 * before it reads or changes anything. A lock left by a crashed holder is taken over, logged.
 * Node has no flock(2); pid + start time survives a SIGKILLed holder, which flock would too.
 */
export async function acquireStateLock(stateDir: string, logger: Logger): Promise<StateLock> {
  await fsp.mkdir(stateDir, { recursive: true, mode: 0o700 });
  const file = path.join(stateDir, STATE_LOCK_FILE);
  const self = readProcStat(process.pid);
  if (self === undefined) throw new Error('cannot read /proc/self/stat');
  const owner: StateLockOwner = { pid: process.pid, startTimeTicks: self.startTimeTicks };
  const content = `${owner.pid} ${owner.startTimeTicks}\n`;
  for (let attempt = 0; attempt < 5; attempt++) {
    try {
      await fsp.writeFile(file, content, { flag: 'wx', mode: 0o600 });
      heldHere.add(file);
      return { file, owner, release: () => releaseLock(file, content) };
    } catch (err) {
      if (errnoCode(err) !== 'EEXIST') throw err;
    }
    const text = await fsp.readFile(file, 'utf8').catch((err: unknown) => (errnoCode(err) === 'ENOENT' ? null : Promise.reject(err)));
    if (text === null) continue; // released meanwhile: try again
    const holder = parseOwner(text);
    if (holder !== undefined && ownerAlive(holder, file)) {
      throw precondition('STATE_DIR_LOCKED', `state directory ${stateDir} is in use by kata-ts pid ${holder.pid} (${file}).`, {
        details: { pid: holder.pid, file },
      });
    }
    await takeOverStale(file, text);
    logger.warn({ file, stalePid: holder?.pid ?? null }, 'taking over a state directory lock left by a daemon that is gone');
  }
  throw precondition('STATE_DIR_LOCKED', `state directory ${stateDir} could not be locked (${file} keeps changing).`);
}

/**
 * Remove a stale lock file, but only the one we judged stale: it is renamed aside first (atomic),
 * and if what we moved is not what we read (another daemon took it over meanwhile), it is put
 * back with link(2), which never overwrites.
 */
async function takeOverStale(file: string, staleText: string): Promise<void> {
  const aside = `${file}.stale-${process.pid}`;
  try {
    await fsp.rename(file, aside);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return;
    throw err;
  }
  const moved = await fsp.readFile(aside, 'utf8').catch(() => '');
  if (moved !== staleText) await fsp.link(aside, file).catch(() => undefined);
  await fsp.rm(aside, { force: true });
}

async function releaseLock(file: string, content: string): Promise<void> {
  heldHere.delete(file);
  const text = await fsp.readFile(file, 'utf8').catch(() => undefined);
  if (text === content) await fsp.rm(file, { force: true });
}
