/**
 * A node-mode pod's relay (native/shim-relay.c, `kata-ts-shim-relay`), seen from TypeScript: its
 * command line, finding it by the pid it wrote (checked against its command line, so a reused
 * pid is never signalled), ending it, and charging it to the pod's cgroup.
 *
 * The relay is the pod's only process of the shim's own (the node server is shared), so it is
 * moved into the cgroup(s) kata-ts placed the pod's VMM in, and moved back where it came from
 * once the VM has stopped: cgroupfs removal refuses a cgroup that still holds a process
 * (src/cgroups/cgroupfs.ts `remove`), and the relay outlives the VM until containerd's last call.
 * Where it came from is written to `<stateDir>/relay-cgroup.json`, so a node server started
 * again after a crash still knows.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { PlacementRecord } from '../cgroups/index.js';
import { errnoCode } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import { packageRoot } from '../common/paths.js';
import { readCmdline } from '../common/procfs.js';

/** The relay's file name, beside the other native helpers (scripts/build-native.sh). */
export const RELAY_BINARY_NAME = 'kata-ts-shim-relay';

/** Where setup builds the relay: `dist/native/kata-ts-shim-relay` of the running code's package. */
export function defaultRelayBinary(): string {
  return path.join(packageRoot(), 'dist', 'native', RELAY_BINARY_NAME);
}

/** The relay's argv (after its binary): the pod socket, the upstream, its pid file, and the node server's command to revive. */
export function relayArgs(listen: string, upstream: string, pidFile: string, revive: readonly string[]): string[] {
  return ['--listen', listen, '--upstream', upstream, '--pid-file', pidFile, '--', ...revive];
}

/** The relay's pid when its pid file names a live relay listening on `listen`; else undefined. */
export async function livingRelayPid(pidFile: string, listen: string, procRoot = '/proc'): Promise<number | undefined> {
  const text = await fsp.readFile(pidFile, 'utf8').catch(() => '');
  const pid = Number.parseInt(text.trim(), 10);
  if (!Number.isInteger(pid) || pid <= 1) return undefined;
  const argv = readCmdline(pid, procRoot);
  const named = argv.length > 0 && path.basename(argv[0] ?? '') === RELAY_BINARY_NAME;
  const i = argv.indexOf('--listen');
  return named && i >= 0 && argv[i + 1] === listen ? pid : undefined;
}

/** SIGTERM the pod's relay (found as livingRelayPid finds it), SIGKILL after `timeoutMs`; true when one was ended. */
export async function endRelay(pidFile: string, listen: string, timeoutMs = 3_000): Promise<boolean> {
  const pid = await livingRelayPid(pidFile, listen);
  if (pid === undefined) return false;
  try {
    process.kill(pid, 'SIGTERM');
  } catch {
    return false;
  }
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if ((await livingRelayPid(pidFile, listen)) === undefined) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone meanwhile
  }
  return true;
}

/** Wait up to `timeoutMs` for the relay to leave by itself (it does once the upstream's gone marker is there). */
export async function relayGone(pidFile: string, listen: string, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if ((await livingRelayPid(pidFile, listen)) === undefined) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `<stateDir>/relay-cgroup.json`: which relay was moved, and each hierarchy's directory it came from. */
export const RELAY_CGROUP_FILE = 'relay-cgroup.json';

interface RelayCgroupMove {
  pid: number;
  /** Hierarchy key (as PlacementRecord.paths keys it) -> the directory the relay was in. */
  from: Record<string, string>;
}

/** The hierarchy key of a /proc/<pid>/cgroup line's controller field, as PlacementRecord.paths keys hierarchies. */
function hierarchyKey(controllers: string): string {
  if (controllers === '') return 'unified';
  if (controllers === 'name=systemd') return 'systemd';
  return controllers;
}

/** /proc/<pid>/cgroup as hierarchy key -> path inside that hierarchy. */
async function procCgroups(pid: number, procRoot: string): Promise<Map<string, string>> {
  const text = await fsp.readFile(path.join(procRoot, String(pid), 'cgroup'), 'utf8');
  const out = new Map<string, string>();
  for (const line of text.split('\n')) {
    const m = /^[0-9]+:([^:]*):(.*)$/.exec(line);
    if (m !== null) out.set(hierarchyKey(m[1]!), m[2]!);
  }
  return out;
}

/**
 * Move the relay into the VMM's cgroups (every hierarchy of `placement`), remembering where it
 * was in `<stateDir>/relay-cgroup.json`. The mount point of each hierarchy is the placement's
 * directory less the VMM's own path in it. Nothing is done (false) when the VMM's cgroups do not
 * end in the placement's directories (it is not where kata-ts placed it), or it was done already.
 */
export async function chargeRelayToPod(
  stateDir: string,
  relayPid: number,
  vmmPid: number,
  placement: PlacementRecord,
  procRoot = '/proc',
): Promise<boolean> {
  const done = await readMove(stateDir);
  if (done?.pid === relayPid) return false;
  const vmm = await procCgroups(vmmPid, procRoot);
  const relay = await procCgroups(relayPid, procRoot);
  const from: Record<string, string> = {};
  const moves: Array<[string, string]> = [];
  for (const [key, dir] of Object.entries(placement.paths)) {
    const vmmPath = vmm.get(key);
    const relayPath = relay.get(key);
    if (vmmPath === undefined || relayPath === undefined || !dir.endsWith(vmmPath)) return false;
    const mount = dir.slice(0, dir.length - vmmPath.length);
    from[key] = path.join(mount, relayPath);
    moves.push([key, dir]);
  }
  if (moves.length === 0) return false;
  await writeFileAtomic(path.join(stateDir, RELAY_CGROUP_FILE), `${JSON.stringify({ pid: relayPid, from } satisfies RelayCgroupMove)}\n`);
  for (const [, dir] of moves) await fsp.writeFile(path.join(dir, 'cgroup.procs'), String(relayPid));
  return true;
}

/** Move the relay back where chargeRelayToPod found it (when it still lives); the record goes. */
export async function unchargeRelay(stateDir: string): Promise<void> {
  const move = await readMove(stateDir);
  if (move === undefined) return;
  for (const dir of Object.values(move.from)) {
    try {
      await fsp.writeFile(path.join(dir, 'cgroup.procs'), String(move.pid));
    } catch (err) {
      // ESRCH: the relay is gone, and with it what held the pod's cgroup.
      if (errnoCode(err) !== 'ESRCH' && errnoCode(err) !== 'ENOENT') throw err;
    }
  }
  await fsp.rm(path.join(stateDir, RELAY_CGROUP_FILE), { force: true });
}

async function readMove(stateDir: string): Promise<RelayCgroupMove | undefined> {
  const text = await fsp.readFile(path.join(stateDir, RELAY_CGROUP_FILE), 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  try {
    const v = JSON.parse(text) as RelayCgroupMove;
    if (!Number.isInteger(v.pid) || typeof v.from !== 'object' || v.from === null) return undefined;
    for (const dir of Object.values(v.from)) if (typeof dir !== 'string' || !path.isAbsolute(dir)) return undefined;
    return v;
  } catch {
    return undefined;
  }
}

/**
 * Move this process (the node server), and the flock(1) of its revive command when that is its
 * parent, out of the pod's VMM cgroups when they are in them, to where
 * the pod's relay came from: a node server revived by a relay starts in the relay's cgroup, which
 * is the pod's while its VM runs, and the VMM's cgroup cannot be removed while it holds a process.
 * False when it was not there (or where to go is not known: nothing is done then).
 */
export async function leavePodCgroup(
  stateDir: string,
  placement: PlacementRecord,
  pid = process.pid,
  procRoot = '/proc',
): Promise<boolean> {
  const move = await readMove(stateDir);
  // The revive command's flock(1) (start.ts) waits as this process's parent, in the same cgroup.
  const ppid = pid === process.pid ? process.ppid : 0;
  const pids = [pid, ...(ppid > 1 && path.basename(readCmdline(ppid, procRoot)[0] ?? '') === 'flock' ? [ppid] : [])];
  let moved = false;
  for (const [key, dir] of Object.entries(placement.paths)) {
    const procs = (await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n');
    const to = move?.from[key];
    if (to === undefined) continue;
    for (const p of pids) {
      if (!procs.includes(String(p))) continue;
      await fsp.writeFile(path.join(to, 'cgroup.procs'), String(p));
      moved = true;
    }
  }
  return moved;
}
