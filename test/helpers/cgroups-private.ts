/**
 * A private cgroup tree for tests: `kata-ts-test-<random>` below THIS process's own cgroup in
 * every hierarchy mounted under /sys/fs/cgroup (memory sits under a control-plane path on these
 * machines; nesting below it keeps the machine's accounting in force). Only directories created
 * here are ever written; processes are only those the test started. See ENVIRONMENT.md.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { type CgroupMount, cgroupDirOf, type ProcCgroupEntry, parseCgroupMounts, parseProcCgroup } from '../../src/cgroups/procfs.js';

export const TEST_CGROUP_PREFIX = 'kata-ts-test-';

export interface PrivateHierarchy {
  /** Mount directory name under /sys/fs/cgroup (cpu, memory, systemd, unified, ...). */
  name: string;
  mount: CgroupMount;
  /** This process's /proc/self/cgroup entry for the hierarchy. */
  own: ProcCgroupEntry;
  /** The private directory: <own cgroup>/kata-ts-test-<random>. */
  dir: string;
  /** Its path as /proc/<pid>/cgroup shows it. */
  procPath: string;
}

export interface PrivateCgroups {
  name: string;
  hierarchies: PrivateHierarchy[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The hierarchies mounted directly under /sys/fs/cgroup. */
export async function mountedHierarchies(): Promise<CgroupMount[]> {
  const mounts = parseCgroupMounts(await fsp.readFile('/proc/self/mountinfo', 'utf8'));
  return mounts.filter((m) => path.dirname(m.mountPoint) === '/sys/fs/cgroup');
}

function entryFor(own: ProcCgroupEntry[], m: CgroupMount): ProcCgroupEntry | undefined {
  return own.find((e) =>
    m.fsType === 'cgroup2'
      ? e.hierarchyId === 0
      : e.controllers.length === m.controllers.length && e.controllers.every((c) => m.controllers.includes(c)),
  );
}

/** Creates the private cgroups (cpuset.cpus/mems copied from the parent so processes may join). */
/** The private trees this test file's process made (assertMachineClean judges only these). */
const madeHere = new Set<string>();

/** Names of the private trees createPrivateCgroups made in this process, in order. */
export function privateCgroupNamesMade(): string[] {
  return [...madeHere];
}

export async function createPrivateCgroups(): Promise<PrivateCgroups> {
  const name = `${TEST_CGROUP_PREFIX}${randomBytes(6).toString('hex')}`;
  madeHere.add(name);
  const own = parseProcCgroup(await fsp.readFile('/proc/self/cgroup', 'utf8'));
  const hierarchies: PrivateHierarchy[] = [];
  const made: PrivateCgroups = { name, hierarchies };
  try {
    for (const mount of await mountedHierarchies()) {
      const entry = entryFor(own, mount);
      const ownDir = entry === undefined ? undefined : cgroupDirOf([mount], entry);
      if (entry === undefined || ownDir === undefined) throw new Error(`own cgroup of ${mount.mountPoint} not found`);
      const dir = path.join(ownDir, name);
      await fsp.mkdir(dir);
      hierarchies.push({ name: path.basename(mount.mountPoint), mount, own: entry, dir, procPath: path.posix.join(entry.path, name) });
      if (mount.controllers.includes('cpuset')) await copyCpuset(ownDir, dir);
    }
  } catch (err) {
    await removePrivateCgroups(made);
    throw err;
  }
  return made;
}

/** cpuset.cpus and cpuset.mems from `from` to `to` (a new v1 cpuset admits no process without them). */
export async function copyCpuset(from: string, to: string): Promise<void> {
  for (const f of ['cpuset.cpus', 'cpuset.mems']) {
    await fsp.writeFile(path.join(to, f), (await fsp.readFile(path.join(from, f), 'utf8')).trim());
  }
}

/** Creates `<private>/<rel>` in every hierarchy (cpuset copied level by level), as a kubelet would. */
export async function mkdirEverywhere(pc: PrivateCgroups, rel: string): Promise<void> {
  for (const h of pc.hierarchies) {
    let dir = h.dir;
    for (const c of rel.split('/').filter((x) => x !== '')) {
      const child = path.join(dir, c);
      await fsp.mkdir(child).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'EEXIST') throw err;
      });
      if (h.mount.controllers.includes('cpuset')) await copyCpuset(dir, child);
      dir = child;
    }
  }
}

export function hierarchy(pc: PrivateCgroups, name: string): PrivateHierarchy {
  const h = pc.hierarchies.find((x) => x.name === name);
  if (h === undefined) throw new Error(`no private ${name} hierarchy`);
  return h;
}

/**
 * A directory of symlinks named like /sys/fs/cgroup's entries, each pointing at the private
 * cgroup of that hierarchy: the cgroup root handed to the driver, so that everything it creates
 * lands inside the private tree while the kernel files it writes are real.
 */
export async function linkRoot(pc: PrivateCgroups): Promise<string> {
  const root = await fsp.mkdtemp(path.join(os.tmpdir(), `${pc.name}-root-`));
  for (const h of pc.hierarchies) await fsp.symlink(h.dir, path.join(root, h.name));
  return root;
}

/** Starts `sleep 300` and moves it (ours) into `<private>/<rel>` in every hierarchy. */
export async function startOwnedSleep(pc: PrivateCgroups, rel: string): Promise<ChildProcess> {
  await mkdirEverywhere(pc, rel);
  const child = spawn('sleep', ['300'], { stdio: 'ignore' });
  const pid = child.pid;
  if (pid === undefined) throw new Error('sleep did not start');
  for (const h of pc.hierarchies) await fsp.writeFile(path.join(h.dir, rel, 'cgroup.procs'), String(pid));
  return child;
}

/** SIGKILL by pid and wait for the exit. */
export async function killOwned(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  process.kill(child.pid as number, 'SIGKILL');
  await exited;
}

/** Every directory below `dir` (deepest first), then `dir`. */
export async function treeDeepestFirst(dir: string): Promise<string[]> {
  const out: string[] = [];
  const entries = await fsp.readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) if (e.isDirectory()) out.push(...(await treeDeepestFirst(path.join(dir, e.name))));
  out.push(dir);
  return out;
}

/**
 * Removes the private trees deepest first. A process still inside is one of ours (only our
 * processes were put there) and is killed by pid. Returns what could not be removed.
 */
export async function removePrivateCgroups(pc: PrivateCgroups): Promise<string[]> {
  const left: string[] = [];
  for (const h of pc.hierarchies) {
    if (!path.basename(h.dir).startsWith(TEST_CGROUP_PREFIX)) throw new Error(`refusing to remove ${h.dir}`);
    for (let attempt = 0; attempt < 100; attempt++) {
      if ((await fsp.stat(h.dir).catch(() => null)) === null) break;
      let busy = false;
      for (const dir of await treeDeepestFirst(h.dir)) {
        try {
          await fsp.rmdir(dir);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
          busy = true;
          if (attempt >= 40) {
            const procs = (await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter((p) => p !== '');
            for (const pid of procs) {
              try {
                process.kill(Number(pid), 'SIGKILL');
              } catch {
                /* gone already */
              }
            }
          }
        }
      }
      if (!busy) break;
      await sleep(50);
    }
    for (const d of await treeDeepestFirst(h.dir)) if ((await fsp.stat(d).catch(() => null)) !== null) left.push(d);
  }
  return left;
}
