/**
 * An imitation of cgroup2 on a plain directory tree, for the v2 paths of the cgroupfs driver:
 * these machines are v1 hybrid, so no cgroup2 hierarchy with controllers exists to write for real
 * (every controller is bound to a v1 hierarchy). Tests using it say so in their names.
 *
 * It keeps the kernel rules the driver depends on (Documentation/admin-guide/cgroup-v2.rst):
 * a child's cgroup.controllers is its parent's cgroup.subtree_control; enabling a controller
 * needs it in the cgroup's own cgroup.controllers (ENOENT otherwise); interface files exist only
 * for enabled controllers (ENOENT); a non-root cgroup with processes cannot enable controllers
 * for children and one with enabled controllers cannot take processes (EBUSY, "no internal
 * processes"); rmdir needs no children and no processes (EBUSY); writing cgroup.procs moves the
 * pid out of every other cgroup; memory limits are kept in pages.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { CGROUP2_SUPER_MAGIC } from '../../src/cgroups/fsops.js';
import type { CgroupFs } from '../../src/cgroups/types.js';

/** Controller order as the kernel prints it. */
const ORDER = ['cpuset', 'cpu', 'io', 'memory', 'hugetlb', 'pids', 'rdma', 'misc'];
const CORE_FILES: Record<string, string> = { 'cgroup.subtree_control': '', 'cgroup.procs': '', 'cgroup.type': 'domain' };
const CONTROLLER_FILES: Record<string, Record<string, string>> = {
  cpu: { 'cpu.max': 'max 100000', 'cpu.weight': '100' },
  memory: { 'memory.max': 'max' },
  pids: { 'pids.max': 'max' },
  cpuset: { 'cpuset.cpus': '' },
  io: { 'io.max': '' },
};

function errno(code: string, what: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: ${what}`), { code });
}

const words = (s: string) => s.split(/\s+/).filter((w) => w !== '');
const sorted = (cs: Iterable<string>) => [...new Set(cs)].sort((a, b) => ORDER.indexOf(a) - ORDER.indexOf(b));

export class SimulatedCgroup2Fs implements CgroupFs {
  /** Every write the driver made, in order, as `file=value` relative to the root. */
  readonly writes: string[] = [];

  constructor(readonly root: string) {}

  private inside(p: string): boolean {
    const rel = path.relative(this.root, p);
    return !rel.startsWith('..') && !path.isAbsolute(rel);
  }

  private async text(file: string): Promise<string> {
    return (await fsp.readFile(file, 'utf8')).trim();
  }

  private async childDirs(dir: string): Promise<string[]> {
    const entries = await fsp.readdir(dir, { withFileTypes: true });
    return entries.filter((e) => e.isDirectory()).map((e) => path.join(dir, e.name));
  }

  /** Makes `dir`'s controller files match its cgroup.controllers. */
  private async syncControllerFiles(dir: string): Promise<void> {
    const available = words(await this.text(path.join(dir, 'cgroup.controllers')));
    for (const [controller, files] of Object.entries(CONTROLLER_FILES)) {
      for (const [file, initial] of Object.entries(files)) {
        const p = path.join(dir, file);
        const exists = await fsp.stat(p).then(
          () => true,
          () => false,
        );
        if (available.includes(controller) && !exists) await fsp.writeFile(p, initial);
        if (!available.includes(controller) && exists) await fsp.rm(p);
      }
    }
  }

  async mkdir(dir: string): Promise<void> {
    await fsp.mkdir(dir);
    const parentEnabled = await this.text(path.join(path.dirname(dir), 'cgroup.subtree_control'));
    await fsp.writeFile(path.join(dir, 'cgroup.controllers'), parentEnabled);
    for (const [file, initial] of Object.entries(CORE_FILES)) await fsp.writeFile(path.join(dir, file), initial);
    await this.syncControllerFiles(dir);
  }

  async rmdir(dir: string): Promise<void> {
    if (
      !(await fsp.stat(dir).then(
        (s) => s.isDirectory(),
        () => false,
      ))
    )
      throw errno('ENOENT', dir);
    if ((await this.childDirs(dir)).length > 0) throw errno('EBUSY', `${dir} has children`);
    if ((await this.text(path.join(dir, 'cgroup.procs'))) !== '') throw errno('EBUSY', `${dir} has processes`);
    await fsp.rm(dir, { recursive: true });
  }

  async readFile(file: string): Promise<string> {
    return fsp.readFile(file, 'utf8');
  }

  async writeFile(file: string, value: string): Promise<void> {
    if (
      !(await fsp.stat(file).then(
        () => true,
        () => false,
      ))
    )
      throw errno('ENOENT', file);
    this.writes.push(`${path.relative(this.root, file)}=${value}`);
    const dir = path.dirname(file);
    const isRoot = path.resolve(dir) === path.resolve(this.root);
    switch (path.basename(file)) {
      case 'cgroup.subtree_control':
        return this.writeSubtreeControl(dir, value, isRoot);
      case 'cgroup.procs':
        return this.writeProcs(dir, value, isRoot);
      case 'cpu.max': {
        if (!/^(max|[0-9]+) [0-9]+$/.test(value.trim())) throw errno('EINVAL', `${file}=${value}`);
        return fsp.writeFile(file, value.trim());
      }
      case 'cpu.weight': {
        const w = Number(value);
        if (!Number.isInteger(w) || w < 1 || w > 10_000) throw errno('ERANGE', `${file}=${value}`);
        return fsp.writeFile(file, String(w));
      }
      case 'memory.max': {
        const v = value.trim();
        if (v === 'max') return fsp.writeFile(file, 'max');
        if (!/^[0-9]+$/.test(v)) throw errno('EINVAL', `${file}=${value}`);
        return fsp.writeFile(file, String(Number(v) - (Number(v) % 4096)));
      }
      default:
        return fsp.writeFile(file, value.trim());
    }
  }

  private async writeSubtreeControl(dir: string, value: string, isRoot: boolean): Promise<void> {
    const available = words(await this.text(path.join(dir, 'cgroup.controllers')));
    const enabled = new Set(words(await this.text(path.join(dir, 'cgroup.subtree_control'))));
    for (const token of words(value)) {
      const name = token.slice(1);
      if (token.startsWith('+')) {
        if (!available.includes(name)) throw errno('ENOENT', `${name} not available in ${dir}`);
        enabled.add(name);
      } else if (token.startsWith('-')) {
        enabled.delete(name);
      } else {
        throw errno('EINVAL', token);
      }
    }
    if (!isRoot && enabled.size > 0 && (await this.text(path.join(dir, 'cgroup.procs'))) !== '') {
      throw errno('EBUSY', `${dir} has processes`);
    }
    await fsp.writeFile(path.join(dir, 'cgroup.subtree_control'), sorted(enabled).join(' '));
    for (const child of await this.childDirs(dir)) {
      await fsp.writeFile(path.join(child, 'cgroup.controllers'), sorted(enabled).join(' '));
      await this.syncControllerFiles(child);
    }
  }

  private async writeProcs(dir: string, value: string, isRoot: boolean): Promise<void> {
    const pid = value.trim();
    if (!/^[0-9]+$/.test(pid)) throw errno('EINVAL', value);
    if (!isRoot && (await this.text(path.join(dir, 'cgroup.subtree_control'))) !== '') {
      throw errno('EBUSY', `${dir} enables controllers for its children`);
    }
    await this.removePid(this.root, pid);
    const procs = words(await this.text(path.join(dir, 'cgroup.procs')));
    await fsp.writeFile(path.join(dir, 'cgroup.procs'), [...procs, pid].join('\n'));
  }

  private async removePid(dir: string, pid: string): Promise<void> {
    const file = path.join(dir, 'cgroup.procs');
    const procs = words(await this.text(file).catch(() => ''));
    if (procs.includes(pid)) await fsp.writeFile(file, procs.filter((p) => p !== pid).join('\n'));
    for (const child of await this.childDirs(dir)) await this.removePid(child, pid);
  }

  async realpath(p: string): Promise<string> {
    return fsp.realpath(p);
  }

  async fsMagic(p: string): Promise<number> {
    if (this.inside(p)) return CGROUP2_SUPER_MAGIC;
    return (await fsp.statfs(p)).type;
  }
}
