/**
 * Reading where a process sits: /proc/<pid>/cgroup (hierarchy-relative paths) and
 * /proc/self/mountinfo (where each hierarchy is mounted, and from which cgroup). Together they
 * turn "pid 123 is in memory:/a/b" into a directory, whatever the cgroup root or cgroup namespace.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';

export interface ProcCgroupEntry {
  hierarchyId: number;
  /** v1 controllers and `name=` names of the hierarchy; empty for cgroup2. */
  controllers: string[];
  /** Path relative to the hierarchy root (as the reader's cgroup namespace sees it). */
  path: string;
}

/** Parses /proc/<pid>/cgroup. */
export function parseProcCgroup(text: string): ProcCgroupEntry[] {
  const out: ProcCgroupEntry[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const first = line.indexOf(':');
    const second = line.indexOf(':', first + 1);
    if (first < 0 || second < 0) continue;
    const list = line.slice(first + 1, second);
    out.push({
      hierarchyId: Number(line.slice(0, first)),
      controllers: list === '' ? [] : list.split(','),
      path: line.slice(second + 1),
    });
  }
  return out;
}

/**
 * The entry of the hierarchy holding `controller`: a v1 controller name (`cpu`), a named
 * hierarchy (`name=systemd`), or '' for cgroup2.
 */
export function findProcEntry(entries: ProcCgroupEntry[], controller: string): ProcCgroupEntry | undefined {
  if (controller === '') return entries.find((e) => e.hierarchyId === 0 && e.controllers.length === 0);
  return entries.find((e) => e.controllers.includes(controller));
}

/** /proc/<pid>/cgroup of a live process, or undefined when the process is gone. */
export async function readProcCgroup(pid: number, procRoot = '/proc'): Promise<ProcCgroupEntry[] | undefined> {
  try {
    return parseProcCgroup(await fsp.readFile(path.join(procRoot, String(pid), 'cgroup'), 'utf8'));
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'ESRCH') return undefined;
    throw err;
  }
}

export interface CgroupMount {
  /** Which cgroup of the hierarchy is mounted there ('/' unless mounted from a cgroup namespace or a bind). */
  root: string;
  mountPoint: string;
  fsType: 'cgroup' | 'cgroup2';
  /** v1 controllers and `name=` names from the super options; empty for cgroup2. */
  controllers: string[];
}

/** Super options of a v1 cgroup mount that are not controllers. */
const NON_CONTROLLER_OPTIONS = new Set([
  'rw',
  'ro',
  'noprefix',
  'clone_children',
  'xattr',
  'cpuset_v2_mode',
  'favordynmods',
  'all',
  'none',
]);

function unescapeMountField(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/** Parses /proc/<pid>/mountinfo, keeping cgroup and cgroup2 mounts. */
export function parseCgroupMounts(text: string): CgroupMount[] {
  const out: CgroupMount[] = [];
  for (const line of text.split('\n')) {
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const pre = line.slice(0, sep).split(' ');
    const post = line.slice(sep + 3).split(' ');
    const fsType = post[0];
    if (fsType !== 'cgroup' && fsType !== 'cgroup2') continue;
    const root = pre[3];
    const mountPoint = pre[4];
    if (root === undefined || mountPoint === undefined) continue;
    const superOptions = (post[2] ?? '').split(',');
    const controllers =
      fsType === 'cgroup2' ? [] : superOptions.filter((o) => o !== '' && !NON_CONTROLLER_OPTIONS.has(o) && !o.startsWith('release_agent='));
    out.push({ root: unescapeMountField(root), mountPoint: unescapeMountField(mountPoint), fsType, controllers });
  }
  return out;
}

export async function readCgroupMounts(procRoot = '/proc'): Promise<CgroupMount[]> {
  return parseCgroupMounts(await fsp.readFile(path.join(procRoot, 'self', 'mountinfo'), 'utf8'));
}

function below(dir: string, rel: string): string {
  return rel === '/' || rel === '' ? dir : path.join(dir, rel);
}

/**
 * The directory of a /proc/<pid>/cgroup entry through the mounts, or undefined when no mount of
 * that hierarchy shows that cgroup (the path lies outside every mount's root).
 */
export function cgroupDirOf(mounts: CgroupMount[], entry: ProcCgroupEntry): string | undefined {
  for (const m of mounts) {
    const sameHierarchy =
      entry.controllers.length === 0
        ? m.fsType === 'cgroup2'
        : m.fsType === 'cgroup' &&
          entry.controllers.every((c) => m.controllers.includes(c)) &&
          m.controllers.length === entry.controllers.length;
    if (!sameHierarchy) continue;
    if (m.root === '/') return below(m.mountPoint, entry.path);
    if (entry.path === m.root) return m.mountPoint;
    if (entry.path.startsWith(`${m.root}/`)) return below(m.mountPoint, entry.path.slice(m.root.length));
  }
  return undefined;
}
