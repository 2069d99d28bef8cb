import { type Dirent, promises as fsp, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../../common/errors.js';
import { readProcStatFields } from '../../common/proc-stat.js';
import { readCmdline } from '../../hypervisor/index.js';
import { POD_NETNS_NAME } from '../../network/index.js';
import { sandboxJailDir, sandboxSharedDir, sandboxVmRoot, sandboxWorkDir } from './paths.js';

/** Something under the daemon's roots that no record owns. */
export interface Orphan {
  kind: 'qemu' | 'virtiofsd' | 'mount' | 'cgroup' | 'workdir' | 'socket' | 'file' | 'rootfs' | 'netns';
  /** The path (work dir, mount point, cgroup dir, file) or the process's work dir. */
  path: string;
  pid?: number;
}

/**
 * What the records own: sandbox ids with the pids of their QEMU and virtiofsd, container ids, and
 * the pod network namespaces (by name) of the sandboxes that have one.
 */
export interface AuditOwners {
  sandboxes: Array<{ id: string; pids: number[] }>;
  containerIds: string[];
  netnsNames: string[];
}

export interface AuditOptions {
  stateDir: string;
  /** cgroup mount root (`/sys/fs/cgroup`); its hierarchies are walked for `kata-ts-<id>` cgroups. */
  cgroupRoot?: string;
  procRoot?: string;
  /** The mount table to read (tests give a fixture); /proc/self/mountinfo otherwise. */
  mountinfo?: string;
  /**
   * Where pod network namespaces are pinned (`/run/netns`): a `kata-ts-<16 hex>` one that no record
   * names is an orphan (and so is the TAP inside it: a pod's TAP lives only in its namespace),
   * unless a QEMU of another state dir runs in it: another daemon's pod is not ours to name.
   */
  netnsDir?: string;
  /**
   * Only these names in `netnsDir` are judged (a test's or a bench's own pods, e.g. from
   * ownNetnsNames in test/helpers/runtime-daemon.ts): `/run/netns` is the machine's, and another
   * run's leftover is not this daemon's orphan. Unset: every `kata-ts-<16 hex>` (doctor, the daemon).
   */
  netnsScope?: readonly string[];
}

const VMM_CGROUP = /^kata-ts-([0-9a-f]{64})(\.scope)?$/;
const WORKDIR_SOCKETS = new Set(['qmp.sock', 'ready.sock', 'agent.sock', 'vfs.sock']);

async function entries(dir: string): Promise<Dirent[]> {
  try {
    return await fsp.readdir(dir, { withFileTypes: true });
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return [];
    throw err;
  }
}

/** QEMU and virtiofsd processes naming a path under `vmRoot`: pid -> [kind, work dir name]. */
function vmmProcesses(vmRoot: string, procRoot: string): Array<{ pid: number; kind: 'qemu' | 'virtiofsd'; workDir: string }> {
  const out: Array<{ pid: number; kind: 'qemu' | 'virtiofsd'; workDir: string }> = [];
  const root = `${vmRoot}/`;
  let pids: string[];
  try {
    pids = readdirSync(procRoot);
  } catch {
    return out;
  }
  for (const entry of pids) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const argv = readCmdline(Number(entry), procRoot);
    const base = path.basename(argv[0] ?? '');
    const kind = base.startsWith('qemu-system') ? 'qemu' : base.startsWith('virtiofsd') ? 'virtiofsd' : undefined;
    if (kind === undefined) continue;
    // QEMU doubles commas in option values; a work dir name never has one.
    const arg = argv.find((a) => a.includes(root));
    if (arg === undefined) continue;
    const rest = arg.slice(arg.indexOf(root) + root.length);
    out.push({ pid: Number(entry), kind, workDir: rest.split('/')[0] ?? '' });
  }
  return out;
}

/** The network namespace inodes of QEMU processes that do not serve a work dir under `vmRoot`. */
async function foreignQemuNetns(vmRoot: string, procRoot: string): Promise<Set<number>> {
  const inodes = new Set<number>();
  for (const e of await entries(procRoot)) {
    if (!/^[0-9]+$/.test(e.name)) continue;
    const argv = readCmdline(Number(e.name), procRoot);
    if (!path.basename(argv[0] ?? '').startsWith('qemu-system') || argv.some((a) => a.includes(`${vmRoot}/`))) continue;
    const st = await fsp.stat(path.join(procRoot, e.name, 'ns', 'net')).catch(() => undefined);
    if (st !== undefined) inodes.add(st.ino);
  }
  return inodes;
}

/** The parent pid from /proc/<pid>/stat (field 4), undefined when the process is gone. */
function parentPid(pid: number, procRoot: string): number | undefined {
  try {
    return readProcStatFields(pid, procRoot)?.ppid;
  } catch {
    // An audit reports what it can see: a stat it cannot read or parse names no parent.
    return undefined;
  }
}

/** Mount points (mountinfo field 5, octal escapes decoded). */
function mountPointsOf(mountinfo: string): string[] {
  return mountinfo
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((p): p is string => p !== undefined && p !== '')
    .map((p) => p.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(Number.parseInt(o, 8))));
}

/** Every directory below `dir` named like a VMM cgroup, at most `depth` levels down. */
async function vmmCgroups(dir: string, depth: number, out: Array<{ dir: string; id: string }>): Promise<void> {
  if (depth < 0) return;
  for (const e of await entries(dir)) {
    if (!e.isDirectory()) continue;
    const child = path.join(dir, e.name);
    const m = VMM_CGROUP.exec(e.name);
    if (m !== null) out.push({ dir: child, id: m[1]! });
    else await vmmCgroups(child, depth - 1, out);
  }
}

/** The cgroup hierarchies mounted under `root` (one per mount, symlinked co-mounts counted once). */
async function hierarchies(root: string): Promise<string[]> {
  const seen = new Set<string>();
  const out: string[] = [];
  const candidates = [
    root,
    ...(await entries(root)).filter((e) => e.isDirectory() || e.isSymbolicLink()).map((e) => path.join(root, e.name)),
  ];
  for (const dir of candidates) {
    const real = await fsp.realpath(dir).catch(() => dir);
    if (seen.has(real)) continue;
    if (
      !(await fsp.stat(path.join(real, 'cgroup.procs')).then(
        () => true,
        () => false,
      ))
    )
      continue;
    seen.add(real);
    out.push(real);
  }
  return out;
}

/**
 * Everything under the daemon's roots that no record owns: QEMU and virtiofsd processes serving a
 * work dir without a record (or a second one beside the recorded pid), work dirs, mounts under the
 * state dir outside a recorded sandbox's shared dir and VMM jail, sockets and files where none belong, container
 * root filesystems without a container record, pod network namespaces no record names (given
 * `netnsDir`), and `kata-ts-<id>` cgroups of no record that are
 * empty or hold one of those processes (a cgroup holding another daemon's VMM is not ours to name).
 * Read-only: it reports, it removes nothing.
 */
export async function auditOrphans(owners: AuditOwners, opts: AuditOptions): Promise<Orphan[]> {
  const procRoot = opts.procRoot ?? '/proc';
  const vmRoot = sandboxVmRoot(opts.stateDir);
  const knownDirs = new Map(owners.sandboxes.map((s) => [path.basename(sandboxWorkDir(opts.stateDir, s.id)), s]));
  const ids = new Set(owners.sandboxes.map((s) => s.id));
  const orphans: Orphan[] = [];

  const processes = vmmProcesses(vmRoot, procRoot);
  for (const p of processes) {
    const owner = knownDirs.get(p.workDir);
    // virtiofsd's sandbox=namespace runs as a parent and its child: the child of an owned pid is owned.
    const ownedPid = (pid: number): boolean =>
      owner?.pids.includes(pid) === true || owner?.pids.includes(parentPid(pid, procRoot) ?? -1) === true;
    if (owner === undefined || !ownedPid(p.pid)) orphans.push({ kind: p.kind, path: path.join(vmRoot, p.workDir), pid: p.pid });
  }
  for (const e of await entries(vmRoot)) {
    const p = path.join(vmRoot, e.name);
    if (!e.isDirectory()) orphans.push({ kind: e.isSocket() ? 'socket' : 'file', path: p });
    else if (!knownDirs.has(e.name)) orphans.push({ kind: 'workdir', path: p });
    else {
      for (const f of await entries(p)) {
        if (f.isSocket() && !WORKDIR_SOCKETS.has(f.name)) orphans.push({ kind: 'socket', path: path.join(p, f.name) });
      }
    }
  }
  // A sandbox's mounts: its shared dir and, confined, its VMM jail (itself a mount, and all inside).
  const owned = owners.sandboxes.flatMap((s) => [
    `${sandboxSharedDir(opts.stateDir, s.id)}/`,
    `${sandboxJailDir(sandboxWorkDir(opts.stateDir, s.id))}/`,
  ]);
  // A container's overlay root filesystem is mounted in its own dir (src/images/rootfs.ts).
  for (const id of owners.containerIds) owned.push(`${path.join(opts.stateDir, 'rootfs', id)}/`);
  const mountinfo = opts.mountinfo ?? readFileSync(path.join(procRoot, 'self', 'mountinfo'), 'utf8');
  const stateRoot = `${opts.stateDir}/`;
  for (const point of mountPointsOf(mountinfo)) {
    const under = `${point}/`;
    // A mount at the state dir itself is the disk the state lives on, not something we mounted.
    if (!under.startsWith(stateRoot) || under === stateRoot) continue;
    if (!owned.some((o) => under.startsWith(o))) orphans.push({ kind: 'mount', path: point });
  }
  const containers = new Set(owners.containerIds);
  for (const e of await entries(path.join(opts.stateDir, 'rootfs'))) {
    if (!containers.has(e.name)) orphans.push({ kind: 'rootfs', path: path.join(opts.stateDir, 'rootfs', e.name) });
  }
  for (const e of await entries(path.join(opts.stateDir, 'logs'))) {
    if (!containers.has(e.name.replace(/\.json$/, ''))) orphans.push({ kind: 'file', path: path.join(opts.stateDir, 'logs', e.name) });
  }

  if (opts.netnsDir !== undefined) {
    const named = new Set(owners.netnsNames);
    const scope = opts.netnsScope === undefined ? undefined : new Set(opts.netnsScope);
    const unowned = (await entries(opts.netnsDir)).filter(
      (e) => POD_NETNS_NAME.test(e.name) && !named.has(e.name) && (scope === undefined || scope.has(e.name)),
    );
    const foreign = unowned.length === 0 ? new Set<number>() : await foreignQemuNetns(vmRoot, procRoot);
    for (const e of unowned) {
      const p = path.join(opts.netnsDir, e.name);
      const st = await fsp.stat(p).catch(() => undefined);
      if (st !== undefined && !foreign.has(st.ino)) orphans.push({ kind: 'netns', path: p });
    }
  }

  if (opts.cgroupRoot !== undefined) {
    const ours = new Set(processes.filter((p) => !knownDirs.has(p.workDir)).map((p) => p.pid));
    const found: Array<{ dir: string; id: string }> = [];
    for (const h of await hierarchies(opts.cgroupRoot)) await vmmCgroups(h, 8, found);
    for (const c of found) {
      if (ids.has(c.id)) continue;
      const procs = (await fsp.readFile(path.join(c.dir, 'cgroup.procs'), 'utf8').catch(() => ''))
        .split('\n')
        .filter((l) => l !== '')
        .map(Number);
      if (procs.length === 0 || procs.some((pid) => ours.has(pid))) orphans.push({ kind: 'cgroup', path: c.dir });
    }
  }
  return orphans;
}

/**
 * The owners as the state dir's records say (for `kata-ts doctor` and the soak, which do not run
 * the managers): sandbox ids with their recorded QEMU and virtiofsd pids, and container ids.
 */
export async function ownersFromRecords(stateDir: string): Promise<AuditOwners> {
  const sandboxes: AuditOwners['sandboxes'] = [];
  const netnsNames: string[] = [];
  for (const e of await entries(path.join(stateDir, 'sandboxes'))) {
    if (!e.isFile() || !e.name.endsWith('.json')) continue;
    const id = e.name.slice(0, -'.json'.length);
    const pids: number[] = [];
    try {
      const doc = JSON.parse(await fsp.readFile(path.join(stateDir, 'sandboxes', e.name), 'utf8')) as {
        record?: {
          vmm?: { pid?: number } | null;
          virtiofsd?: { pid?: number } | null;
          network?: { netnsName?: string } | null;
          origin?: { poolVmId?: string };
        };
      };
      for (const pid of [doc.record?.vmm?.pid, doc.record?.virtiofsd?.pid]) if (typeof pid === 'number') pids.push(pid);
      // A claim in flight: QEMU's cgroup in the pool's (`kata-ts-<pool VM id>`) is the sandbox's until the claim removes it.
      const poolVmId = doc.record?.origin?.poolVmId;
      if (typeof poolVmId === 'string') sandboxes.push({ id: poolVmId, pids: [] });
      if (typeof doc.record?.network?.netnsName === 'string') netnsNames.push(doc.record.network.netnsName);
    } catch {
      // unreadable: its id still owns its work dir; recovery reports the record itself
    }
    sandboxes.push({ id, pids });
  }
  // Pooled VMs (docs/pool.md) own their QEMU and namespace the same way.
  for (const e of await entries(path.join(stateDir, 'pool'))) {
    if (!e.isFile() || !e.name.endsWith('.json')) continue;
    try {
      const doc = JSON.parse(await fsp.readFile(path.join(stateDir, 'pool', e.name), 'utf8')) as {
        record?: { id?: string; vmm?: { pid?: number } | null; network?: { netnsName?: string } | null };
      };
      const pid = doc.record?.vmm?.pid;
      sandboxes.push({ id: e.name.slice(0, -'.json'.length), pids: typeof pid === 'number' ? [pid] : [] });
      if (typeof doc.record?.network?.netnsName === 'string') netnsNames.push(doc.record.network.netnsName);
    } catch {
      // unreadable: the pool's recovery reports it
    }
  }
  const containerIds = (await entries(path.join(stateDir, 'containers')))
    .filter((e) => e.isFile() && e.name.endsWith('.json'))
    .map((e) => e.name.slice(0, -'.json'.length));
  return { sandboxes, containerIds, netnsNames };
}
