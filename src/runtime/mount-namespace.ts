/**
 * The runtime's own mount namespace (docs/architecture.md, "The runtime's mount namespace").
 *
 * kata-ts mounts a lot: every sandbox's shared directory, each container's root filesystem and
 * volumes bound recursively under it, containerd's rootfs at `<bundle>/rootfs`, the pods' network
 * namespaces. Made in the host's mount namespace, a recursive bind copies a volume's submounts, and
 * such a copy pins the submount's mount point on the host: once the host has unmounted the
 * submount, removing its directory answers EBUSY for as long as the copy exists (the kernel refuses
 * to remove a mount point of the caller's own namespace; copies in other namespaces are detached).
 * So `kata-ts serve` and the shim make their mounts in a namespace of the runtime's own:
 *
 * - a slave of the namespace it is created from: where the host's mounts are shared (systemd makes
 *   them so), the host's later mounts arrive; none of ours ever leave;
 * - bound at a file (`mountNamespacePath`, /run/kata-ts/ns/mnt by default), so it outlives every
 *   process of the runtime: a restarted daemon enters the same one and finds its mounts again. One
 *   per node, shared by the daemon and every shim; QEMU, virtiofsd and everything else they start
 *   inherit it.
 *
 * Node cannot setns(2) itself into it (the kernel refuses a mount namespace change to a process
 * whose threads share its fs_struct, and Node always runs threads), so a program enters it by
 * running itself again under nsenter(1) (`runInsideMountNamespace`, or `insideCommand` for a
 * detached child), with `KATA_TS_MOUNT_NAMESPACE` naming the namespace so the child knows it is
 * inside and never runs itself a third time.
 *
 * A mount namespace can be bound at a file only on a mount that propagates nowhere (it could
 * otherwise end up holding itself; the kernel answers EINVAL): the file's directory is made a
 * private bind mount of itself, as iproute2 makes /run/netns a mount of its own. That directory is
 * the runtime's. Creating is serialised by a lock file in it (daemon and shims may start at once).
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { closeSync, promises as fsp, readdirSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CALLER_ROOT_CHILD_FD, CALLER_ROOT_ENV, openOwnRoot } from '../common/caller-root.js';
import { errnoCode, errorMessage, internal, isReason, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { acquireStateLock, type StateLock } from './state-lock.js';
import './reasons.js';

/** Set by the program that runs itself again inside: `<dev>:<ino>` of the namespace it entered. */
export const MOUNT_NAMESPACE_ENV = 'KATA_TS_MOUNT_NAMESPACE';

/** statfs(2) f_type of nsfs, the file system of /proc/<pid>/ns/* and of their bind mounts. */
const NSFS_MAGIC = 0x6e736673;
const COMMAND_TIMEOUT_MS = 10_000;
/** How long a creator waits for another one (they hold the lock for a few milliseconds). */
const LOCK_WAIT_MS = 10_000;

/** A mount namespace, as stat(2) names its nsfs inode. */
export interface MountNamespaceId {
  dev: number;
  ino: number;
}

export function sameNamespace(a: MountNamespaceId, b: MountNamespaceId): boolean {
  return a.dev === b.dev && a.ino === b.ino;
}

/** `<dev>:<ino>`, the marker's value. */
export function formatNamespaceId(id: MountNamespaceId): string {
  return `${id.dev}:${id.ino}`;
}

export function parseNamespaceId(text: string): MountNamespaceId | undefined {
  const m = /^([0-9]+):([0-9]+)$/.exec(text);
  return m === null ? undefined : { dev: Number(m[1]), ino: Number(m[2]) };
}

/** The mount namespace of a process (this one by default); undefined when it is gone. */
export function namespaceOf(pid: number | 'self' = 'self', procRoot = '/proc'): MountNamespaceId | undefined {
  try {
    const st = statSync(path.join(procRoot, String(pid), 'ns', 'mnt'));
    return { dev: st.dev, ino: st.ino };
  } catch {
    return undefined;
  }
}

/** The namespace bound at `file`; undefined when none is (no file, or a plain one: inside the namespace, for one). */
export async function boundNamespace(file: string): Promise<MountNamespaceId | undefined> {
  const fs = await fsp.statfs(file).catch(() => undefined);
  if (fs?.type !== NSFS_MAGIC) return undefined;
  const st = await fsp.stat(file);
  return { dev: st.dev, ino: st.ino };
}

/** Pids of the processes in namespace `id` (by /proc/<pid>/ns/mnt). */
export function processesInNamespace(id: MountNamespaceId, procRoot = '/proc'): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync(procRoot)) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const ns = namespaceOf(Number(entry), procRoot);
    if (ns !== undefined && sameNamespace(ns, id)) pids.push(Number(entry));
  }
  return pids;
}

function run(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: COMMAND_TIMEOUT_MS }, (err, _stdout, stderr) => {
      if (err)
        reject(internal('MOUNT_NAMESPACE_FAILED', `${file} ${args.join(' ')} failed: ${stderr.trim() || err.message}.`, { cause: err }));
      else resolve();
    });
  });
}

/** One line of /proc/self/mountinfo, as far as this file needs it. */
interface MountEntry {
  id: string;
  parent: string;
  dev: string;
  /** The path inside its file system that is mounted. */
  root: string;
  point: string;
  shared: boolean;
}

function unescapeMountPath(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_m, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/** Pure: the entries of a mountinfo text. */
export function parseMountEntries(mountinfo: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of mountinfo.split('\n')) {
    const f = line.split(' ');
    const dash = f.indexOf('-');
    if (f.length < 7 || dash < 6) continue;
    out.push({
      id: f[0]!,
      parent: f[1]!,
      dev: f[2]!,
      root: unescapeMountPath(f[3]!),
      point: unescapeMountPath(f[4]!),
      shared: f.slice(6, dash).some((o) => o.startsWith('shared:')),
    });
  }
  return out;
}

/** The mount on top at `point` (the last one listed there), if any. */
function topMountAt(entries: readonly MountEntry[], point: string): MountEntry | undefined {
  return entries.filter((e) => e.point === point).at(-1);
}

/** Whether `entry` is a directory bound onto itself (what `mount --bind D D` makes): its own path on its parent's file system. */
function isBindOfItself(entry: MountEntry, entries: readonly MountEntry[]): boolean {
  const parent = entries.find((e) => e.id === entry.parent);
  if (parent === undefined || parent.dev !== entry.dev) return false;
  const rel = path.relative(parent.root, entry.root);
  return !rel.startsWith('..') && path.join(parent.point, rel) === entry.point;
}

async function mountEntries(): Promise<MountEntry[]> {
  return parseMountEntries(await fsp.readFile('/proc/self/mountinfo', 'utf8'));
}

/** Whether the root mount of this process's namespace has shared propagation (what lets the host's later mounts reach a slave). */
export async function rootMountShared(): Promise<boolean> {
  return topMountAt(await mountEntries(), '/')?.shared ?? false;
}

/** Make `dir` a mount whose propagation reaches nothing: a private bind of itself, unless it is a private or slave mount already. */
async function makePrivateMount(dir: string): Promise<void> {
  const entries = await mountEntries();
  const top = topMountAt(entries, dir);
  if (top === undefined) {
    await run('mount', ['--bind', '--', dir, dir]);
    await run('mount', ['--make-private', '--', dir]);
    return;
  }
  if (!top.shared) return;
  // Ours from an earlier start that stopped between the bind and making it private.
  if (isBindOfItself(top, entries)) {
    await run('mount', ['--make-private', '--', dir]);
    return;
  }
  throw precondition(
    'MOUNT_NAMESPACE_DIR_SHARED',
    `${dir} is a shared mount kata-ts did not make, where no mount namespace can be bound: give mountNamespacePath a directory of its own.`,
    { details: { dir } },
  );
}

/** The creators' lock: a lock file in the namespace's directory, waited for (its holders keep it a few milliseconds). */
async function lockDir(dir: string, logger: Logger): Promise<StateLock> {
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (;;) {
    try {
      return await acquireStateLock(dir, logger);
    } catch (err) {
      if (!isReason(err, 'STATE_DIR_LOCKED') || Date.now() > deadline) throw err;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The CPUs this process may run on (Cpus_allowed_list of /proc/self/status). */
async function allowedCpus(): Promise<number[]> {
  const status = await fsp.readFile('/proc/self/status', 'utf8').catch(() => '');
  const list = /^Cpus_allowed_list:\s*(\S+)/m.exec(status)?.[1] ?? '';
  const cpus: number[] = [];
  for (const part of list.split(',')) {
    const [a, b] = part.split('-').map(Number);
    if (a === undefined || !Number.isInteger(a)) continue;
    for (let c = a; c <= (b !== undefined && Number.isInteger(b) ? b : a); c++) cpus.push(c);
  }
  return cpus;
}

/**
 * unshare makes the namespace, binds it at `target` and exits: the namespace lives on, holding
 * copies of this one's mounts, all of them slaves.
 *
 * The kernel refuses (EINVAL) to bind a mount namespace whose id is not above the binder's own
 * namespace's (mnt_ns_loop), and Linux 6.18 (measured here) hands namespace ids out in per-CPU
 * batches: made on another CPU than the one this namespace's id came from, a newer namespace can
 * have a lower id, and the bind fails every time on that CPU (on a host's initial namespace, id 1,
 * never). So on EINVAL the namespace is made again on each CPU in turn (taskset), until one takes.
 */
async function bindNewNamespace(target: string): Promise<void> {
  const unshare = ['unshare', `--mount=${target}`, '--propagation', 'slave', 'true'];
  const isLoop = (err: unknown) => isReason(err, 'MOUNT_NAMESPACE_FAILED') && /Invalid argument/.test(errorMessage(err));
  let first: unknown;
  try {
    await run(unshare[0]!, unshare.slice(1));
    return;
  } catch (err) {
    if (!isLoop(err)) throw err;
    first = err;
  }
  for (const cpu of await allowedCpus()) {
    try {
      await run('taskset', ['--cpu-list', String(cpu), ...unshare]);
      return;
    } catch (err) {
      if (!isLoop(err)) throw err;
    }
  }
  throw first;
}

/** The namespace bound at `file`, created (a slave of this process's namespace) when there is none. */
export async function ensureMountNamespace(file: string, logger: Logger): Promise<{ id: MountNamespaceId; created: boolean }> {
  const existing = await boundNamespace(file);
  if (existing !== undefined) return { id: existing, created: false };
  await fsp.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
  // mountinfo names mount points by their real paths.
  const dir = await fsp.realpath(path.dirname(file));
  const target = path.join(dir, path.basename(file));
  const lock = await lockDir(dir, logger);
  try {
    const raced = await boundNamespace(target);
    if (raced !== undefined) return { id: raced, created: false };
    await makePrivateMount(dir);
    await fsp.writeFile(target, '', { flag: 'a', mode: 0o600 });
    await bindNewNamespace(target);
    const id = await boundNamespace(target);
    if (id === undefined) throw internal('MOUNT_NAMESPACE_FAILED', `unshare bound no mount namespace at ${target}.`);
    return { id, created: true };
  } finally {
    await lock.release();
  }
}

/** The mount table inside the namespace bound at `file` (read by `cat` run there: nothing of ours need be in it). */
export function readNamespaceMountinfo(file: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      'nsenter',
      [`--mount=${file}`, '--', 'cat', '/proc/self/mountinfo'],
      { timeout: COMMAND_TIMEOUT_MS },
      (err, stdout, stderr) => {
        if (err) reject(internal('MOUNT_NAMESPACE_FAILED', `reading the mount table in ${file} failed: ${stderr.trim() || err.message}.`));
        else resolve(stdout);
      },
    );
  });
}

/** What removeMountNamespace did. */
export interface NamespaceRemoval {
  /** A namespace was bound at the file and no longer is. */
  removed: boolean;
  /** The processes still in it, when it was left alone because of them. */
  users: number[];
}

/**
 * Let the namespace bound at `file` go, unless a process is still in it (a pod VM, virtiofsd, the
 * daemon, a shim: then nothing changes and they are named). Its mounts go with it. The file, the
 * lock and the directory's private bind mount are removed too; idempotent.
 */
export async function removeMountNamespace(file: string): Promise<NamespaceRemoval> {
  const dir = await fsp.realpath(path.dirname(file)).catch(() => undefined);
  if (dir === undefined) return { removed: false, users: [] };
  const target = path.join(dir, path.basename(file));
  const id = await boundNamespace(target);
  if (id !== undefined) {
    const users = processesInNamespace(id);
    if (users.length > 0) return { removed: false, users };
    // An interrupted creation may have stacked a second one there: every one goes.
    for (let i = 0; i < 8 && (await boundNamespace(target)) !== undefined; i++) await run('umount', ['--', target]);
  }
  await fsp.rm(target, { force: true });
  const entries = await mountEntries();
  const top = topMountAt(entries, dir);
  if (top !== undefined && isBindOfItself(top, entries)) await run('umount', ['--', dir]);
  await fsp.rmdir(dir).catch((err: unknown) => {
    if (!['ENOENT', 'ENOTEMPTY', 'EEXIST', 'EBUSY'].includes(errnoCode(err) ?? '')) throw err;
  });
  return { removed: id !== undefined, users: [] };
}

/**
 * Where this process is: `inside` when its namespace is the one the marker names (a child started
 * by runInsideMountNamespace or insideCommand) or the one bound at `file`, else `outside`. A marker
 * naming another namespace throws: that child was meant to be inside, and running itself again
 * would only loop.
 */
export async function placeInNamespace(file: string, env: NodeJS.ProcessEnv): Promise<'inside' | 'outside'> {
  const own = namespaceOf();
  if (own === undefined) throw internal('MOUNT_NAMESPACE_FAILED', 'cannot read /proc/self/ns/mnt.');
  const marker = env[MOUNT_NAMESPACE_ENV];
  if (marker !== undefined && marker !== '') {
    const want = parseNamespaceId(marker);
    if (want !== undefined && sameNamespace(want, own)) return 'inside';
    throw internal(
      'MOUNT_NAMESPACE_NOT_ENTERED',
      `${MOUNT_NAMESPACE_ENV}=${marker} names a mount namespace this process is not in (it is in ${formatNamespaceId(own)}).`,
    );
  }
  const bound = await boundNamespace(file);
  return bound !== undefined && sameNamespace(bound, own) ? 'inside' : 'outside';
}

/** A command line: the program and its arguments. */
export interface CommandLine {
  command: string;
  args: string[];
}

/**
 * The command line that runs `self` inside the namespace bound at `file`, in `cwd` (nsenter leaves
 * the working directory at the namespace's root; `env -C` sets it again once inside), and the
 * environment entry that marks it. nsenter and env exec, so the child's pid is the program's own.
 * `dieWithParent`: setpriv gives it SIGKILL when the process that started it dies, however it dies.
 */
export function insideCommand(
  file: string,
  id: MountNamespaceId,
  cwd: string,
  self: CommandLine,
  dieWithParent: boolean,
): CommandLine & { env: Record<string, string> } {
  const nsenter = ['nsenter', `--mount=${file}`, '--', 'env', '-C', cwd, '--', self.command, ...self.args];
  const [command, ...args] = (dieWithParent ? ['setpriv', '--pdeathsig', 'KILL', '--', ...nsenter] : nsenter) as [string, ...string[]];
  return { command, args, env: { [MOUNT_NAMESPACE_ENV]: formatNamespaceId(id) } };
}

export interface RunInsideOptions {
  file: string;
  /** The program to run inside: this one again, with its own arguments. */
  self: CommandLine;
  cwd: string;
  env: NodeJS.ProcessEnv;
  /** `inherit`: the child uses this process's stdio; else its stdout and stderr are copied into these streams. */
  stdio: 'inherit' | { stdout: NodeJS.WritableStream; stderr: NodeJS.WritableStream };
  logger: Logger;
  /**
   * Whether the child dies with this process (default true: a daemon must not outlive the process
   * its service manager knows). False for work that must finish even when whoever waits for this
   * process gives up on it (the shim's `delete`, which containerd kills after a few seconds).
   */
  dieWithParent?: boolean;
  /**
   * Hand the child this process's root directory (CALLER_ROOT_CHILD_FD, named in CALLER_ROOT_ENV;
   * src/common/caller-root.ts), so it can read the paths its caller named in this namespace.
   */
  passCallerRoot?: boolean;
}

const FORWARDED: readonly NodeJS.Signals[] = ['SIGTERM', 'SIGINT', 'SIGHUP'];

/**
 * Run `self` inside the runtime's namespace (created when missing) and wait for it: resolves with
 * its exit code (128 + the signal's number when a signal ended it). SIGTERM, SIGINT and SIGHUP are
 * passed on once each (the child has a process group of its own, so a terminal's signals reach it
 * only through here); if this process dies, the child is killed with it (unless `dieWithParent`
 * is false).
 */
export async function runInsideMountNamespace(options: RunInsideOptions): Promise<number> {
  const { id, created } = await ensureMountNamespace(options.file, options.logger);
  if (created) {
    options.logger.info({ file: options.file, namespace: `mnt:[${id.ino}]` }, "created the runtime's mount namespace");
    if (!(await rootMountShared())) {
      options.logger.warn(
        { file: options.file },
        "the root mount is private here: mounts made on the host from now on do not reach the runtime's mount namespace (systemd makes it shared; mountNamespacePath null keeps the runtime in the host's namespace instead)",
      );
    }
  }
  const cmd = insideCommand(options.file, id, options.cwd, options.self, options.dieWithParent ?? true);
  const piped = options.stdio !== 'inherit';
  const root = options.passCallerRoot === true ? openOwnRoot() : undefined;
  const stdio: ('ignore' | 'pipe' | 'inherit' | number)[] = piped ? ['ignore', 'pipe', 'pipe'] : ['inherit', 'inherit', 'inherit'];
  let child: ChildProcess;
  try {
    child = spawn(cmd.command, cmd.args, {
      env: { ...options.env, ...cmd.env, ...(root === undefined ? {} : { [CALLER_ROOT_ENV]: String(CALLER_ROOT_CHILD_FD) }) },
      // The root at index 3, CALLER_ROOT_CHILD_FD.
      stdio: root === undefined ? stdio : [...stdio, root],
      detached: true,
    });
  } finally {
    if (root !== undefined) closeSync(root);
  }
  if (options.stdio !== 'inherit') {
    child.stdout!.pipe(options.stdio.stdout, { end: false });
    child.stderr!.pipe(options.stdio.stderr, { end: false });
  }
  const forward = (signal: NodeJS.Signals) => {
    try {
      child.kill(signal);
    } catch {
      // gone already
    }
  };
  for (const s of FORWARDED) process.on(s, forward);
  try {
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
      child.once('error', (err) =>
        reject(internal('MOUNT_NAMESPACE_FAILED', `${cmd.command} could not be started: ${errorMessage(err)}.`, { cause: err })),
      );
      child.once('close', (c, s) => resolve([c, s]));
    });
    if (code !== null) return code;
    return 128 + (signal === null ? 0 : (os.constants.signals[signal] ?? 0));
  } finally {
    for (const s of FORWARDED) process.off(s, forward);
  }
}
