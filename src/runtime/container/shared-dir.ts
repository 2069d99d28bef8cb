/**
 * What a container brings into the pod VM through the sandbox's virtio-fs share: its root
 * filesystem and each CRI mount, bind-mounted under `<shared>/containers/<id>/`, and the pod's etc
 * files written there. Only what was announced is mounted; a mount source is pinned by an open
 * file descriptor, so a symlink swapped in after the check cannot redirect it.
 *
 * Host-side flags: every bind mount is `nodev,nosuid` on the host. The guest kernel interprets
 * device nodes and set-id bits of the files it sees itself (a device node in the share names a
 * guest device, which the container's device cgroup denies), so these flags change nothing in the
 * guest; they keep a device node the guest creates in a writable mount from being usable on the
 * host.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { constants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { errorMessage, internal, invalid } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { OciContainerFile } from '../../oci/index.js';
import { mountsUnder, unescapeMountPath } from '../sandbox/shared-dir.js';

const run = promisify(execFile);

/** CRI mount propagation -> the util-linux flag that sets it on the bind mount. */
const PROPAGATION_FLAG = {
  PROPAGATION_PRIVATE: '--make-rprivate',
  PROPAGATION_HOST_TO_CONTAINER: '--make-rslave',
  PROPAGATION_BIDIRECTIONAL: '--make-rshared',
} as const;

export interface HostMountRequest {
  container_path: string;
  host_path: string;
  readonly: boolean;
  /** Every mount below the source read-only as well (only with readonly and private propagation). */
  recursive_read_only?: boolean;
  propagation: keyof typeof PROPAGATION_FLAG;
}

/** Where one container's files are, on the host and in the guest. */
export interface ContainerDirs {
  /** `<shared>/containers/<id>` on the host. */
  hostDir: string;
  /** The same directory in the guest. */
  guestDir: string;
  /**
   * Where a private bind is made before it is moved into the share (see bindPinned): outside the
   * shared directory, `<sandbox work dir>/staging`, a private mount of itself.
   */
  stagingDir: string;
}

export function containerDirs(sharedHostDir: string, sharedGuestDir: string, containerId: string): ContainerDirs {
  return {
    hostDir: path.join(sharedHostDir, 'containers', containerId),
    guestDir: path.posix.join(sharedGuestDir, 'containers', containerId),
    stagingDir: path.join(path.dirname(sharedHostDir), 'staging'),
  };
}

/**
 * A directory the runtime's own mounts are under. `shared`: its mounts are shared (the sandboxes'
 * shared directories), so copies of them in a slave or shared volume follow their unmounts; the
 * copies of others' (the containers' overlays, private mounts) never do and are always dropped.
 */
export interface RuntimeMountRoot {
  dir: string;
  shared: boolean;
}

/** Where the containers' own root filesystems (`<id>/`, an overlay or a copy) are in the state dir. */
export function containerRootfsRoot(stateDir: string): string {
  return path.join(stateDir, 'rootfs');
}

/** Bind mounts made so far; `undo()` takes them down deepest first and removes the directory. */
export class SharedDirMounts {
  readonly bindMounts: string[] = [];

  constructor(
    readonly dirs: ContainerDirs,
    /**
     * The directories the runtime's own mounts are under: every sandbox's shared directory, and
     * the containers' overlay root filesystems. A private volume whose host path holds one ("/",
     * "/var/lib") copies, through its recursive bind, every mount there (the shared directories
     * and the container mounts inside them, the overlays); those copies are taken down at once
     * (see bindPinned).
     */
    private readonly runtimeMountRoots: readonly RuntimeMountRoot[],
    private readonly logger: Logger,
  ) {}

  /** The root filesystem (rw) at `<hostDir>/rootfs`; returns its guest path. */
  async bindRootfs(rootfsHostPath: string): Promise<string> {
    await fsp.mkdir(this.dirs.hostDir, { recursive: true, mode: 0o700 });
    const target = path.join(this.dirs.hostDir, 'rootfs');
    await bindPinned(
      rootfsHostPath,
      target,
      { readonly: false, propagationFlag: '--make-rprivate', stagingDir: this.dirs.stagingDir },
      'rootfs',
    );
    this.bindMounts.push(target);
    return path.posix.join(this.dirs.guestDir, 'rootfs');
  }

  /**
   * Each CRI mount at `<hostDir>/mounts/<n>`; returns container_path -> guest path. A source that
   * is not a directory or a regular file is refused (INVALID_ARGUMENT naming the mount): a device
   * node would name a guest device, and a socket or FIFO cannot connect across the VM boundary,
   * so a hostPath socket (a container runtime's, for example) would silently not work.
   */
  async bindCriMounts(mounts: readonly HostMountRequest[]): Promise<Record<string, string>> {
    const sources: Record<string, string> = {};
    await fsp.mkdir(path.join(this.dirs.hostDir, 'mounts'), { recursive: true, mode: 0o700 });
    for (const [i, m] of mounts.entries()) {
      const field = `container.mounts[${i}] (${m.container_path})`;
      const target = path.join(this.dirs.hostDir, 'mounts', String(i));
      const opts = {
        readonly: m.readonly,
        recursive: m.recursive_read_only === true,
        propagationFlag: PROPAGATION_FLAG[m.propagation],
        runtimeMountRoots: this.runtimeMountRoots,
        stagingDir: this.dirs.stagingDir,
      };
      await bindPinned(m.host_path, target, opts, field);
      this.bindMounts.push(target);
      sources[m.container_path] = path.posix.join(this.dirs.guestDir, 'mounts', String(i));
    }
    return sources;
  }

  /** The pod's etc files (hosts, resolv.conf, hostname) at the host side of their guest paths. */
  async writeFiles(files: readonly OciContainerFile[]): Promise<void> {
    for (const f of files) {
      const rel = path.posix.relative(this.dirs.guestDir, f.guestPath);
      if (rel.startsWith('..') || path.posix.isAbsolute(rel))
        throw internal('CONTAINER_SHARED_DIR', `${f.guestPath} is outside ${this.dirs.guestDir}`);
      const hostPath = path.join(this.dirs.hostDir, rel);
      await fsp.mkdir(path.dirname(hostPath), { recursive: true, mode: 0o755 });
      await fsp.writeFile(hostPath, f.content, { mode: f.mode });
    }
  }

  /** Unmount deepest first, then remove the directory. Never throws; failures are logged. */
  async undo(): Promise<boolean> {
    return unmountAndRemove(this.dirs.hostDir, this.bindMounts, this.logger);
  }
}

/** More host submounts than this below one read-only volume are not bound again one by one. */
export const MAX_SUBMOUNT_BINDS = 32;

/**
 * The host mounts below `hostPath` (resolved), relative to it, shallowest first, without repeats;
 * [] when it does not exist yet. Undefined when there are more than MAX_SUBMOUNT_BINDS (a whole
 * host tree such as "/"): the caller leaves them to the volume's own flags.
 */
export async function hostSubmounts(hostPath: string): Promise<string[] | undefined> {
  const resolved = await fsp.realpath(hostPath).catch(() => undefined);
  if (resolved === undefined) return [];
  const below = mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), resolved).filter((p) => p !== resolved);
  const rel = [...new Set(below.map((p) => path.relative(resolved, p)))].reverse();
  return rel.length > MAX_SUBMOUNT_BINDS ? undefined : rel;
}

/**
 * Unmount `bindMounts` (deepest first; a mount already gone is fine) and remove `hostDir`. The
 * directory is removed only when every unmount succeeded: removing it recursively with a bind
 * mount still inside would delete the mounted host files (a caller's root filesystem, a volume).
 * Each mount point is removed on its own first, without recursion (rmdir, unlink): one that still
 * shows files (a mount the checks above missed) stops the recursive removal. Returns whether
 * everything went.
 */
export async function unmountAndRemove(hostDir: string, bindMounts: readonly string[], logger: Logger): Promise<boolean> {
  let ok = true;
  const deepestFirst = [...bindMounts].sort((a, b) => b.split('/').length - a.split('/').length || b.localeCompare(a));
  for (const target of deepestFirst) {
    try {
      if (await isMountPoint(target)) {
        // virtiofsd holds a file descriptor for every inode the guest still caches, so a plain
        // unmount is usually busy: detach it (MNT_DETACH) and let those references drain.
        await run('umount', ['--', target]).catch(() => run('umount', ['--lazy', '--', target]));
        if (await isMountPoint(target)) throw new Error('still mounted after a lazy unmount');
      }
      await removeMountPoint(target);
    } catch (err) {
      ok = false;
      logger.error({ target, err: errorMessage(err) }, 'could not unmount a container bind mount');
    }
  }
  if (ok) await fsp.rm(hostDir, { recursive: true, force: true });
  return ok;
}

/** An unmounted mount point: an empty directory, or the empty file a file was bound on (a missing one is fine). */
async function removeMountPoint(target: string): Promise<void> {
  const st = await fsp.lstat(target).catch(() => undefined);
  if (st === undefined) return;
  if (st.isDirectory()) await fsp.rmdir(target);
  else if (st.size === 0) await fsp.unlink(target);
  else throw new Error(`${target} is not the empty file a bind mount was made on`);
}

/** Whether `p` is a mount point (its parent is on another mount, or /proc/self/mountinfo lists it). */
async function isMountPoint(p: string): Promise<boolean> {
  try {
    await run('mountpoint', ['-q', '--', p]);
    return true;
  } catch {
    return false;
  }
}

/**
 * Bind-mount `source` at `target` without a window for a symlink swap: the source is resolved
 * (realpath), checked with lstat, opened with O_NOFOLLOW, checked again by fstat (same device and
 * inode), and the mount is made from `/proc/<pid>/fd/<n>` with `--no-canonicalize`, so the kernel
 * binds exactly the file that was checked.
 *
 * A private bind is made in `stagingDir` and moved into the share only once it is private. Made
 * in the share directly, its copies reached virtiofsd's mount namespace (a slave of the share)
 * while they were still slaves of the source's mounts; made private afterwards, ours let go of
 * those copies, which then became slaves of the source's own peers. The host's unmount of a
 * submount of the volume then propagated to virtiofsd's copy, which is busy while the guest has a
 * file of it open, and failed (EBUSY). Moved in as a private tree, its copies in virtiofsd's
 * namespace are copies of a private mount, private too once ours is made private again.
 */
async function bindPinned(
  source: string,
  target: string,
  opts: {
    readonly: boolean;
    recursive?: boolean;
    propagationFlag: string;
    runtimeMountRoots?: readonly RuntimeMountRoot[];
    stagingDir: string;
  },
  field: string,
): Promise<void> {
  if (!path.isAbsolute(source)) throw invalid('CONTAINER_MOUNT_SOURCE_INVALID', `${field}: host_path "${source}" is not absolute`);
  let resolved: string;
  try {
    // A missing source was made a directory beforehand, once every mount was checked (mount-sources.ts).
    resolved = await fsp.realpath(source);
  } catch (err) {
    throw invalid('CONTAINER_MOUNT_SOURCE_INVALID', `${field}: host_path "${source}" cannot be resolved: ${errorMessage(err)}`);
  }
  const before = await fsp.lstat(resolved);
  if (!before.isDirectory() && !before.isFile()) {
    const what = before.isSocket()
      ? 'a socket'
      : before.isFIFO()
        ? 'a FIFO'
        : before.isCharacterDevice() || before.isBlockDevice()
          ? 'a device node'
          : 'not a file or directory';
    throw invalid(
      'CONTAINER_MOUNT_SOURCE_UNSUPPORTED',
      `${field}: host_path "${source}" is ${what}, which cannot cross into the pod VM (only directories and regular files can)`,
    );
  }
  const flags = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | (before.isDirectory() ? constants.O_DIRECTORY : 0);
  const handle = await fsp.open(resolved, flags);
  const isPrivate = opts.propagationFlag === PROPAGATION_FLAG.PROPAGATION_PRIVATE;
  try {
    const after = await handle.stat();
    if (after.dev !== before.dev || after.ino !== before.ino) {
      throw invalid('CONTAINER_MOUNT_SOURCE_INVALID', `${field}: host_path "${source}" changed while it was being mounted`);
    }
    const makePoint = async (point: string) => {
      if (before.isDirectory()) await fsp.mkdir(point, { recursive: true, mode: 0o755 });
      else {
        await fsp.mkdir(path.dirname(point), { recursive: true, mode: 0o700 });
        await fsp.writeFile(point, '', { flag: 'a', mode: 0o600 });
      }
    };
    await makePoint(target);
    // Where the bind is made and set up: below a staging point (private binds), or the target.
    const staging = isPrivate ? await stagingPoint(opts.stagingDir, field) : undefined;
    try {
      const at = staging === undefined ? target : path.join(staging, 'm');
      if (staging !== undefined) await makePoint(at);
      const pinned = `/proc/${process.pid}/fd/${handle.fd}`;
      await mountCmd(['--no-canonicalize', '--rbind', pinned, at], field);
      let moved = false;
      try {
        const options = ['remount', 'bind', 'nodev', 'nosuid', opts.readonly ? 'ro' : 'rw'].join(',');
        await mountCmd(['--no-canonicalize', '-o', options, at], field);
        await mountCmd([opts.propagationFlag, at], field);
        for (const root of opts.runtimeMountRoots ?? [])
          if (isPrivate || !root.shared) await dropRuntimeMountCopies(resolved, at, root.dir, field);
        // The remount above changes the top mount only, and the recursive bind copied each host
        // mount below the source with its own flags: the guest reaches those through virtiofsd
        // too, so each is made nodev,nosuid here as well (and read-only for a recursive read-only
        // volume, whatever the guest does), keeping its other flags.
        for (const sub of submountRemounts(await fsp.readFile('/proc/self/mountinfo', 'utf8'), at, opts.recursive === true))
          await mountCmd(['--no-canonicalize', '-o', sub.options, sub.point], field);
        if (staging !== undefined) {
          await mountCmd(['--move', '--', at, target], field);
          moved = true;
          // Attached below the share (shared), the tree was made shared: private again.
          await mountCmd(['--make-rprivate', target], field);
        }
      } catch (err) {
        await run('umount', ['--lazy', '--', moved || staging === undefined ? target : at]).catch(() => undefined);
        throw err;
      }
    } finally {
      if (staging !== undefined) await releaseStagingPoint(staging);
    }
  } finally {
    await handle.close();
  }
}

/** Per-mount flags of a mountinfo line (its 6th field) that a bind remount would otherwise reset. */
const KEPT_MOUNT_FLAGS = new Set(['noexec', 'noatime', 'nodiratime', 'relatime', 'strictatime', 'nosymfollow', 'ro']);

/**
 * Pure: for each mount strictly below `at` in a /proc/<pid>/mountinfo text, the `mount -o` options
 * that remount it `nodev,nosuid` (and `ro` when `readOnly`) while keeping its own `ro`, `noexec` and
 * atime flags: a bind remount sets every per-mount flag at once, so one left out is cleared.
 */
export function submountRemounts(mountinfo: string, at: string, readOnly: boolean): Array<{ point: string; options: string }> {
  const flagsOf = new Map<string, string[]>();
  for (const line of mountinfo.split('\n')) {
    const fields = line.split(' ');
    if (fields[4] !== undefined && fields[5] !== undefined) flagsOf.set(unescapeMountPath(fields[4]), fields[5].split(','));
  }
  // A point with mounts stacked on it is listed once: a remount there changes the top one, the
  // only one anything (virtiofsd included) can reach by that path.
  return [...new Set(mountsUnder(mountinfo, at))]
    .filter((point) => point !== path.resolve(at))
    .map((point) => {
      const kept = (flagsOf.get(point) ?? []).filter((f) => KEPT_MOUNT_FLAGS.has(f) && !(readOnly && f === 'ro'));
      return { point, options: ['remount', 'bind', 'nodev', 'nosuid', ...(readOnly ? ['ro'] : []), ...kept].join(',') };
    });
}

/**
 * A fresh mount point in `stagingDir` for a private bind, made a private bind mount of itself:
 * nothing mounted on it propagates anywhere, and the kernel moves no mount out of a shared parent
 * (the state dir's mount may be shared when the daemon runs in the host's namespace).
 * releaseStagingPoint takes it down again.
 */
async function stagingPoint(stagingDir: string, field: string): Promise<string> {
  const point = path.join(stagingDir, randomUUID());
  await fsp.mkdir(point, { recursive: true, mode: 0o700 });
  try {
    await mountCmd(['--bind', '--make-private', '--', point, point], field);
  } catch (err) {
    await fsp.rmdir(point).catch(() => undefined);
    throw err;
  }
  return point;
}

/** Unmount a staging point (whatever is still on it, lazily) and remove it. */
async function releaseStagingPoint(point: string): Promise<void> {
  for (const p of mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), point))
    await run('umount', ['--lazy', '--', p]).catch(() => undefined);
  // Never recursively: only the empty mount point inside, then the point itself.
  await removeMountPoint(path.join(point, 'm')).catch(() => undefined);
  await fsp.rmdir(point).catch(() => undefined);
}

/**
 * After a private recursive bind of `source` at `target`: when `source` holds `mountRoot` (one of
 * the runtime's mount roots), the bind copied every mount under it: every sandbox's shared
 * directory with the container mounts in it, or every container's overlay root filesystem. Private
 * copies no longer follow the originals, so each would keep its container's mount point busy in
 * this namespace after that container's own unmount, and its removal would fail (rmdir: EBUSY)
 * for as long as this volume lives. They are detached here (lazily: a subtree at once); being
 * private, their unmount reaches nothing else. What the volume shows there is the directories
 * underneath, as a recursive bind made before any pod ran would. Slave and shared volumes keep
 * their copies of shared mounts (the shared directories): those follow the originals' unmounts by
 * propagation; copies of private mounts (the overlays) are dropped in every mode.
 */
async function dropRuntimeMountCopies(source: string, target: string, mountRoot: string, field: string): Promise<void> {
  const rel = path.relative(source, mountRoot);
  if (rel.startsWith('..') || path.isAbsolute(rel)) return;
  const copyRoot = path.join(target, rel);
  const copies = mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), copyRoot);
  // Shallowest first: a lazy unmount detaches everything below it too.
  const shallowest = copies.filter((p) => !copies.some((q) => q !== p && p.startsWith(`${q}/`)));
  for (const point of shallowest) {
    if (await isMountPoint(point))
      await run('umount', ['--lazy', '--', point]).catch((err: unknown) => {
        throw internal(
          'CONTAINER_MOUNT_FAILED',
          `${field}: the copy of ${point} in the volume could not be detached: ${errorMessage(err)}`,
        );
      });
  }
}

async function mountCmd(args: string[], field: string): Promise<void> {
  try {
    await run('mount', args);
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim() ?? errorMessage(err);
    throw internal('CONTAINER_MOUNT_FAILED', `${field}: mount ${args.join(' ')} failed: ${stderr}`);
  }
}
