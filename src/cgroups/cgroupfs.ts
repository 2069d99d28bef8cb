/**
 * The cgroupfs driver: `<cgroup_parent>/kata-ts-<sandbox id>` in each hierarchy the VMM needs,
 * limits written before the VMM joins, everything created removed again on failure or teardown.
 */
import path from 'node:path';
import { alreadyExists, errnoCode, invalid, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { readProcStatFields } from '../common/proc-stat.js';
import { describeRecord } from './describe.js';
import { detectCgroupMode } from './detect.js';
import { realCgroupFs } from './fsops.js';
import { cgroupIoError, type Hierarchy, keyHolding, resolveHierarchies, V2_OPTIONAL, V2_REQUIRED } from './hierarchies.js';
import { type CgroupFileWrite, cgroupFileWrites, checkPidsMax, parentWeightWrite, pidsMaxWrite, planLimits } from './limits.js';
import { parseCgroupfsParent, validateParentFor, vmmCgroupName } from './parent.js';
import { cgroupDirOf, findProcEntry, type ProcCgroupEntry, readCgroupMounts, readProcCgroup } from './procfs.js';
import type { CgroupDriver, CgroupDriverOptions, CgroupFs, CgroupMode, PlacementRecord, PlaceRequest, VmmLimits } from './types.js';

/** How often, and how far apart, rmdir is retried while a just-killed VMM finishes exiting. */
const RMDIR_ATTEMPTS = 40;
const RMDIR_RETRY_MS = 25;
/** How long a parent's empty cpuset is read again before it is taken for empty (another process may be filling it). */
const CPUSET_SETTLE_MS = 2000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export class CgroupfsDriver implements CgroupDriver {
  readonly name = 'cgroupfs' as const;
  private readonly fs: CgroupFs;
  private readonly logger: Logger;
  private modeCache: CgroupMode | undefined;

  constructor(private readonly opts: CgroupDriverOptions) {
    this.fs = opts.fs ?? realCgroupFs;
    this.logger = opts.logger.child({ component: 'cgroupfs' });
    this.modeCache = opts.mode;
  }

  validateParent(cgroupParent: string): void {
    validateParentFor('cgroupfs', cgroupParent);
  }

  private async mode(): Promise<CgroupMode> {
    this.modeCache ??= await detectCgroupMode(this.opts.cgroupRoot, this.fs);
    return this.modeCache;
  }

  private async read(file: string): Promise<string> {
    try {
      return (await this.fs.readFile(file)).trim();
    } catch (err) {
      throw cgroupIoError(err, 'read', file);
    }
  }

  private async write(file: string, value: string): Promise<void> {
    try {
      await this.fs.writeFile(file, value);
    } catch (err) {
      throw cgroupIoError(err, 'write', file, value);
    }
  }

  /** mkdir one level; true when created, false when it already existed. */
  private async mkdirOnce(dir: string): Promise<boolean> {
    try {
      await this.fs.mkdir(dir);
      return true;
    } catch (err) {
      if (errnoCode(err) === 'EEXIST') return false;
      throw cgroupIoError(err, 'mkdir', dir);
    }
  }

  /** The placements of this driver, one at a time (see place). */
  private placing: Promise<unknown> = Promise.resolve();

  /**
   * One at a time: two pods whose cgroup parents share a level neither has yet would race on it.
   * The one that made the directory copies cpuset.cpus/mems into it from its parent; the other
   * found it there and read it empty in between (CGROUP_CPUSET_EMPTY: seen with 4 clones placed in
   * the same tens of ms). A placement is a few ms of file writes; the wait costs nothing.
   */
  async place(req: PlaceRequest): Promise<PlacementRecord> {
    const run = this.placing.then(() => this.placeNow(req));
    this.placing = run.catch(() => undefined);
    return run;
  }

  private async placeNow(req: PlaceRequest): Promise<PlacementRecord> {
    const plan = planLimits(req.limits);
    const parent = parseCgroupfsParent(req.cgroupParent);
    const leafName = vmmCgroupName(req.sandboxId);
    const pids = [req.pid, ...(req.extraPids ?? [])];
    for (const pid of pids) {
      if (!Number.isSafeInteger(pid) || pid <= 0)
        throw invalid('CGROUP_PID_INVALID', `pid ${pid} is not a process id.`, { details: { pid } });
    }
    checkPidsMax(req.pidsMax);
    if (req.parentCpuShares !== undefined && parent.components.length === 0) {
      throw invalid('CGROUP_PARENT_INVALID', 'a parent given a CPU weight of its own must name a cgroup, not the root.', {
        details: { cgroupParent: req.cgroupParent },
      });
    }
    const mode = await this.mode();
    const hierarchies = await resolveHierarchies(this.fs, this.opts.cgroupRoot, mode);
    // Where each process is now, to put it back should joining fail half-way.
    const originals = new Map<number, ProcCgroupEntry[]>();
    for (const pid of pids) {
      const original = await readProcCgroup(pid);
      if (original === undefined) {
        throw precondition('CGROUP_PID_GONE', `the sandbox process ${pid} exited before it could be placed.`, { details: { pid } });
      }
      originals.set(pid, original);
    }
    const created: string[] = [];
    const createdParents: string[] = [];
    const joined = new Map<number, Hierarchy[]>(pids.map((pid) => [pid, []]));
    const paths: Record<string, string> = {};
    const parentDirs: Record<string, string> = {};
    let pidsMax: number | undefined;
    try {
      for (const h of hierarchies) {
        let dir = h.base;
        let dirIsMine = false;
        for (const component of parent.components) {
          if (!dirIsMine) await this.checkHandsDown(h, dir, mode);
          const child = path.join(dir, component);
          dirIsMine = await this.mkdirOnce(child);
          if (dirIsMine) {
            created.push(child);
            createdParents.push(child);
            await this.prepareNew(h, dir, child, mode);
          }
          dir = child;
        }
        if (!dirIsMine) await this.checkHandsDown(h, dir, mode);
        parentDirs[h.key] = dir;
        const leaf = path.join(dir, leafName);
        if (await this.mkdirOnce(leaf)) {
          created.push(leaf);
        } else {
          await this.adoptStale(leaf);
          created.push(leaf);
        }
        await this.prepareNew(h, dir, leaf, mode, true);
        paths[h.key] = leaf;
      }
      if (req.parentCpuShares !== undefined) {
        const w = parentWeightWrite(req.parentCpuShares, mode);
        const key = keyHolding(parentDirs, mode, w.controller);
        if (key !== undefined) await this.write(path.join(parentDirs[key] as string, w.file), w.value);
      }
      for (const w of cgroupFileWrites(plan, mode)) {
        const key = keyHolding(paths, mode, w.controller);
        if (key === undefined) continue;
        await this.write(path.join(paths[key] as string, w.file), w.value);
      }
      // Before any process joins: QEMU never runs a moment without its task limit.
      if (req.pidsMax !== undefined) pidsMax = await this.writePidsMax(paths, mode, req.pidsMax, req.sandboxId);
      for (const pid of pids) {
        for (const h of hierarchies) {
          await this.write(path.join(paths[h.key] as string, 'cgroup.procs'), String(pid));
          joined.get(pid)!.push(h);
        }
      }
    } catch (err) {
      for (const pid of pids) await this.moveBack(pid, joined.get(pid)!, originals.get(pid)!);
      await this.removeCreated(created);
      throw err;
    }
    this.logger.info({ sandboxId: req.sandboxId, pids, paths, mode }, 'VMM placed in cgroupfs');
    return {
      driver: 'cgroupfs',
      cgroupParent: req.cgroupParent,
      mode,
      paths,
      createdParents,
      limits: { ...req.limits },
      ...(pidsMax === undefined ? {} : { pidsMax }),
    };
  }

  /**
   * pids.max in the VMM's pids cgroup: v1's pids hierarchy, or cgroup2 where the parent enables
   * the pids controller for its children (the leaf's cgroup.controllers lists it). Without one the
   * VMM is still placed (the parent's limit, if any, applies): warned, and absent from the record.
   */
  private async writePidsMax(
    paths: Record<string, string>,
    mode: CgroupMode,
    pidsMax: number,
    sandboxId: string,
  ): Promise<number | undefined> {
    const w = pidsMaxWrite(pidsMax);
    const key = keyHolding(paths, mode, w.controller);
    let dir = key === undefined ? undefined : paths[key];
    if (dir !== undefined && mode === 'v2' && !(await this.read(path.join(dir, 'cgroup.controllers'))).split(/\s+/).includes('pids')) {
      dir = undefined;
    }
    if (dir === undefined) {
      this.logger.warn({ sandboxId, pidsMax }, 'no pids controller where the VMM is placed: its task count is not limited');
      return undefined;
    }
    await this.write(path.join(dir, w.file), w.value);
    return pidsMax;
  }

  /**
   * Makes a directory kata-ts just created usable. v1 cpuset: a new cpuset has no CPUs or memory
   * nodes, and no process can join it until cpuset.cpus/mems are copied from its parent. v2: the
   * directory's children get only the controllers enabled in its subtree_control; the VMM's own
   * (leaf) directory enables nothing, because a cgroup2 with processes may not have children
   * with controllers ("no internal processes").
   */
  private async prepareNew(h: Hierarchy, parentDir: string, dir: string, mode: CgroupMode, leaf = false): Promise<void> {
    if (h.kind === 'v1' && h.controllers.includes('cpuset')) {
      for (const file of ['cpuset.cpus', 'cpuset.mems']) {
        const value = await this.readCpuset(path.join(parentDir, file));
        if (value === '') {
          throw precondition('CGROUP_CPUSET_EMPTY', `cgroup ${parentDir} has an empty ${file}, so no process can join a cgroup below it.`, {
            details: { dir: parentDir, file },
          });
        }
        await this.write(path.join(dir, file), value);
      }
    }
    if (mode === 'v2' && !leaf) {
      const available = (await this.read(path.join(dir, 'cgroup.controllers'))).split(/\s+/);
      const wanted = [...V2_REQUIRED, ...V2_OPTIONAL].filter((c) => available.includes(c));
      if (wanted.length > 0) await this.write(path.join(dir, 'cgroup.subtree_control'), wanted.map((c) => `+${c}`).join(' '));
    }
  }

  /**
   * A parent's cpuset file. Empty may mean another process (another shim, the kubelet) made the
   * directory a moment ago and has not copied its cpuset in yet: read again for a while before
   * taking it for a cpuset no process can join.
   */
  private async readCpuset(file: string): Promise<string> {
    const deadline = Date.now() + CPUSET_SETTLE_MS;
    for (;;) {
      const value = await this.read(file);
      if (value !== '' || Date.now() >= deadline) return value;
      await sleep(50);
    }
  }

  /**
   * cgroup2 only: an ancestor kata-ts did not create must already enable cpu and memory for its
   * children. kata-ts never writes the subtree_control of a cgroup it did not create: that would
   * change every sibling (the kubelet's or systemd's tree), and the kernel refuses it anyway while
   * that cgroup holds processes. The kubelet enables these controllers along its kubepods tree.
   */
  private async checkHandsDown(h: Hierarchy, dir: string, mode: CgroupMode): Promise<void> {
    if (mode !== 'v2' || h.kind !== 'unified') return;
    const enabled = (await this.read(path.join(dir, 'cgroup.subtree_control'))).split(/\s+/);
    const missing = V2_REQUIRED.filter((c) => !enabled.includes(c));
    if (missing.length > 0) {
      throw precondition(
        'CGROUP_CONTROLLERS_NOT_DELEGATED',
        `cgroup ${dir} does not enable the ${missing.join(' and ')} controller(s) for its children, and kata-ts does not change cgroups it did not create.`,
        { details: { dir, missing } },
      );
    }
  }

  /** A directory with this sandbox's name left by a crash: reuse it when empty, refuse otherwise. */
  private async adoptStale(leaf: string): Promise<void> {
    const procs = await this.read(path.join(leaf, 'cgroup.procs'));
    if (procs !== '') {
      throw alreadyExists('CGROUP_EXISTS', `cgroup ${leaf} already exists and holds processes ${procs.split('\n').join(', ')}.`, {
        details: { dir: leaf },
      });
    }
    this.logger.warn({ dir: leaf }, 'reusing an empty cgroup left by an earlier attempt');
  }

  /** Undo a failed placement, first step: move a process back where it was. */
  private async moveBack(pid: number, joined: Hierarchy[], original: ProcCgroupEntry[]): Promise<void> {
    if (joined.length > 0) {
      const mounts = await readCgroupMounts().catch(() => []);
      for (const h of joined) {
        const entry = findProcEntry(original, h.kind === 'unified' ? '' : (h.controllers[0] as string));
        const dir = entry === undefined ? undefined : cgroupDirOf(mounts, entry);
        if (dir === undefined) {
          this.logger.error({ pid, hierarchy: h.key }, 'cannot find the original cgroup of the VMM to move it back');
          continue;
        }
        await this.fs.writeFile(path.join(dir, 'cgroup.procs'), String(pid)).catch((err: unknown) => {
          // ESRCH: the VMM is gone, which empties our directory just as well.
          if (errnoCode(err) !== 'ESRCH') this.logger.error({ err, pid, dir }, 'could not move the VMM back');
        });
      }
    }
  }

  /** Undo a failed placement, last step: remove what was created (once every process left). */
  private async removeCreated(created: string[]): Promise<void> {
    for (const dir of [...created].reverse()) {
      await this.rmdirWhenEmpty(dir).catch((err: unknown) => this.logger.error({ err, dir }, 'rollback could not remove a cgroup'));
    }
  }

  private async rmdirWhenEmpty(dir: string): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await this.fs.rmdir(dir);
        return;
      } catch (err) {
        const code = errnoCode(err);
        if (code === 'ENOENT') return;
        if (code !== 'EBUSY' || attempt >= RMDIR_ATTEMPTS) throw cgroupIoError(err, 'rmdir', dir);
        // A VMM that was just killed leaves the cgroup only when its exit completes.
        await sleep(RMDIR_RETRY_MS);
      }
    }
  }

  async update(record: PlacementRecord, limits: VmmLimits): Promise<PlacementRecord> {
    const next = planLimits(limits);
    const previous = planLimits(record.limits);
    // Memory first: shrinking it is what the kernel may refuse (usage above the new limit).
    const order = (ws: CgroupFileWrite[]) => [...ws.filter((w) => w.controller === 'memory'), ...ws.filter((w) => w.controller === 'cpu')];
    const writes = order(cgroupFileWrites(next, record.mode));
    const undo = order(cgroupFileWrites(previous, record.mode));
    const done: CgroupFileWrite[] = [];
    try {
      for (const w of writes) {
        const key = keyHolding(record.paths, record.mode, w.controller);
        if (key === undefined) continue;
        await this.write(path.join(record.paths[key] as string, w.file), w.value);
        done.push(w);
      }
    } catch (err) {
      for (const w of undo.filter((u) => done.some((d) => d.file === u.file)).reverse()) {
        const key = keyHolding(record.paths, record.mode, w.controller);
        if (key === undefined) continue;
        await this.fs.writeFile(path.join(record.paths[key] as string, w.file), w.value).catch((e: unknown) => {
          this.logger.error({ err: e, file: w.file }, 'could not restore a cgroup limit');
        });
      }
      throw err;
    }
    this.logger.info({ paths: record.paths, limits }, 'VMM cgroup limits updated');
    return { ...record, limits: { ...limits } };
  }

  async remove(record: PlacementRecord): Promise<void> {
    // Check every hierarchy before removing anything, so that a refusal changes nothing.
    const leaves: string[] = [];
    for (const leaf of Object.values(record.paths)) {
      let procs: string;
      try {
        procs = await this.procsOnceReaped(leaf);
      } catch (err) {
        if (errnoCode(err) === 'ENOENT') continue; // already removed
        throw cgroupIoError(err, 'read', path.join(leaf, 'cgroup.procs'));
      }
      if (procs !== '') {
        throw precondition(
          'CGROUP_BUSY',
          `cgroup ${leaf} still holds processes ${procs.split('\n').join(', ')}; the VMM must be gone first.`,
          {
            details: { dir: leaf },
          },
        );
      }
      leaves.push(leaf);
    }
    for (const leaf of leaves) await this.rmdirWhenEmpty(leaf);
    for (const dir of [...(record.createdParents ?? [])].reverse()) {
      try {
        await this.fs.rmdir(dir);
      } catch (err) {
        const code = errnoCode(err);
        if (code === 'ENOENT') continue;
        // Another sandbox of the same pod still lives below it: it stays for that one.
        if (code === 'EBUSY' || code === 'ENOTEMPTY') {
          this.logger.debug({ dir }, 'created parent cgroup still in use; left in place');
          continue;
        }
        throw cgroupIoError(err, 'rmdir', dir);
      }
    }
    this.logger.info({ paths: record.paths }, 'VMM cgroups removed');
  }

  describe(record: PlacementRecord): Record<string, string> {
    return describeRecord(record);
  }

  async placementFor(sandboxId: string, cgroupParent: string): Promise<PlacementRecord> {
    const parent = parseCgroupfsParent(cgroupParent);
    const mode = await this.mode();
    const paths: Record<string, string> = {};
    for (const h of await resolveHierarchies(this.fs, this.opts.cgroupRoot, mode)) {
      paths[h.key] = path.join(h.base, ...parent.components, vmmCgroupName(sandboxId));
    }
    return {
      driver: 'cgroupfs',
      cgroupParent,
      mode,
      paths,
      createdParents: [],
      limits: { cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 },
    };
  }

  /**
   * The processes in a leaf cgroup, waiting briefly while they are only zombies: a VMM that just
   * exited stays listed until its parent reaps it, and after a daemon restart that parent is init,
   * which may take a moment. A live process is never waited for.
   */
  private async procsOnceReaped(leaf: string): Promise<string> {
    const deadline = Date.now() + ZOMBIE_REAP_WAIT_MS;
    for (;;) {
      const procs = (await this.fs.readFile(path.join(leaf, 'cgroup.procs'))).trim();
      if (procs === '' || Date.now() > deadline) return procs;
      const states = procs.split('\n').map(processState);
      if (!states.every((s) => s === 'Z')) return procs;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** How long teardown waits for an exited VMM to be reaped before calling its cgroup busy. */
const ZOMBIE_REAP_WAIT_MS = 10_000;

/** The state letter of /proc/<pid>/stat (R, S, Z, ...), or undefined when there is no such process. */
function processState(pid: string): string | undefined {
  try {
    return readProcStatFields(Number(pid))?.state;
  } catch {
    // Unreadable or unparsable is "not known to be a zombie": teardown then calls the cgroup busy
    // rather than wait on a guess.
    return undefined;
  }
}
