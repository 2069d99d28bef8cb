/**
 * The pod inside the guest (CreatePod, DestroyPod) and what the guest sees of the sandbox's
 * shared directory (StatSharedPath). A pod is a pause process (guest/native/pause.c) holding new
 * PID, IPC and UTS namespaces, plus a tmpfs for the pod's /dev/shm. Its state is a small file
 * under /run (a tmpfs that lives as long as the guest), so an agent that restarts finds the pod
 * again by pid + start time and answers CreatePod with it instead of making a second one.
 */
import { execFile } from 'node:child_process';
import { constants as fsConstants, promises as fsp, type Stats } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';
import { isSameLiveProcess, readCmdline, readProcStat } from '../../src/common/procfs.js';
import type {
  CreatePodRequest,
  CreatePodResponse,
  FileKind,
  StatSharedPathRequest,
  StatSharedPathResponse,
} from '../../src/generated/agent/agent.js';
import { findSharedDevice, type SharedDeviceKind, sharedMountArgs } from './share-9p.js';

/** What the kubelet and containerd give a pod's /dev/shm when nothing says otherwise. */
export const DEFAULT_SHM_SIZE_BYTES = 64 * 1024 * 1024;
/** StatSharedPath reads at most this much of a file. */
export const STAT_CONTENT_MAX_BYTES = 64 * 1024;
/** The share's virtio-fs tag (src/hypervisor/argv.ts SHARED_FS_TAG, guest/init SHARED_TAG). */
const SHARED_FS_TAG = 'kata-ts-shared';
const POD_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
/** RFC 1123 labels separated by dots, as Kubernetes hostnames are; at most 64 bytes (HOST_NAME_MAX). */
const HOSTNAME = /^(?=.{0,64}$)([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$/i;

export interface PodPaths {
  /** The static pause binary (built by scripts/build-guest.sh). */
  pause: string;
  /** Per-pod state and the shm mount point: `<podsDir>/<podId>/{pod.json,shm}`. */
  podsDir: string;
  /** Where guest/init mounts the virtio-fs share. */
  sharedDir: string;
  /** busybox mount/umount (argument arrays, never a shell). */
  mount: string;
  umount: string;
  procRoot: string;
  /**
   * /sys/bus/virtio/devices: where a virtio-fs device hot-plugged after boot (a pooled VM's claim,
   * docs/pool.md), or a clone's 9p device (share-9p.ts), shows up; absent: the share is never
   * mounted by the agent.
   */
  virtioDevicesDir?: string;
}

/** How long CreatePod waits for a just hot-plugged virtio-fs device to be probed. */
const SHARED_DEVICE_WAIT_MS = 15_000;

export const GUEST_POD_PATHS: PodPaths = {
  pause: '/usr/lib/kata-ts/kata-ts-pause',
  podsDir: '/run/kata-ts/pods',
  sharedDir: '/run/kata-ts/shared',
  mount: '/bin/mount',
  umount: '/bin/umount',
  procRoot: '/proc',
};

/** The guest's own: GUEST_POD_PATHS with the virtio device list (main.ts). */
export const GUEST_VIRTIO_DEVICES_DIR = '/sys/bus/virtio/devices';

interface PodState {
  pausePid: number;
  startTimeTicks: number;
  shmPath: string;
  hostname: string;
}

function run(file: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: 10_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${path.basename(file)} ${args.join(' ')}: ${stderr.trim() || err.message}`));
      else resolve(stdout);
    });
  });
}

/** Mount points (field 5 of mountinfo, octal escapes decoded). */
export function mountPoints(mountinfo: string): string[] {
  return mountinfo
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((p): p is string => p !== undefined && p !== '')
    .map((p) => p.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(Number.parseInt(o, 8))));
}

export class PodService {
  constructor(
    private readonly logger: Logger,
    private readonly paths: PodPaths = GUEST_POD_PATHS,
  ) {}

  async createPod(req: CreatePodRequest): Promise<CreatePodResponse> {
    if (!POD_ID.test(req.podId)) throw invalid('POD_ID_INVALID', `pod_id ${JSON.stringify(req.podId)} is not a valid pod id.`);
    if (!HOSTNAME.test(req.hostname))
      throw invalid('POD_HOSTNAME_INVALID', `hostname ${JSON.stringify(req.hostname)} is not a valid hostname.`);
    const dir = path.join(this.paths.podsDir, req.podId);
    const shared = req.withoutSharedDir ? await this.sharedDirMounted() : await this.ensureSharedDir();
    const existing = await this.readState(req.podId);
    if (existing !== undefined && this.pauseAlive(existing, req.podId)) {
      return { pausePid: existing.pausePid, shmPath: existing.shmPath, sharedDirMounted: shared, sharedDir: this.paths.sharedDir };
    }
    // A pod whose pause process is gone (or half made before an agent restart) is made again.
    const shmPath = path.join(dir, 'shm');
    await fsp.mkdir(shmPath, { recursive: true, mode: 0o755 });
    if (!(await this.isMountPoint(shmPath))) {
      const size = req.shmSizeBytes > 0 ? req.shmSizeBytes : DEFAULT_SHM_SIZE_BYTES;
      await run(this.paths.mount, ['-t', 'tmpfs', '-o', `nosuid,nodev,noexec,mode=1777,size=${size}`, 'shm', shmPath]);
    }
    const out = await run(this.paths.pause, [req.podId, req.hostname]);
    const pausePid = Number(out.trim());
    const stat = readProcStat(pausePid, this.paths.procRoot);
    if (!Number.isSafeInteger(pausePid) || pausePid < 1 || stat === undefined) {
      throw new Error(`kata-ts-pause printed ${JSON.stringify(out.trim())}, not the pid of a running process`);
    }
    const state: PodState = { pausePid, startTimeTicks: stat.startTimeTicks, shmPath, hostname: req.hostname };
    await fsp.writeFile(path.join(dir, 'pod.json'), JSON.stringify(state));
    this.logger.info({ podId: req.podId, pausePid, shmPath }, 'pod created');
    return { pausePid, shmPath, sharedDirMounted: shared, sharedDir: this.paths.sharedDir };
  }

  async destroyPod(podId: string): Promise<void> {
    if (!POD_ID.test(podId)) throw invalid('POD_ID_INVALID', `pod_id ${JSON.stringify(podId)} is not a valid pod id.`);
    const dir = path.join(this.paths.podsDir, podId);
    const state = await this.readState(podId);
    if (state !== undefined && this.pauseAlive(state, podId)) {
      try {
        process.kill(state.pausePid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
    const shmPath = path.join(dir, 'shm');
    if (await this.isMountPoint(shmPath)) await run(this.paths.umount, [shmPath]);
    await fsp.rm(dir, { recursive: true, force: true });
    this.logger.info({ podId }, 'pod destroyed');
  }

  /** The path as the guest kernel resolves it under the share (symlinks followed by the guest, never by the host). */
  async statSharedPath(req: StatSharedPathRequest): Promise<StatSharedPathResponse> {
    const rel = req.relativePath;
    if (rel === '' || path.isAbsolute(rel) || rel.split('/').includes('..') || rel.includes('\0')) {
      throw invalid('SHARED_PATH_INVALID', `relative_path ${JSON.stringify(rel)} must be relative to the shared directory without "..".`);
    }
    const full = path.join(this.paths.sharedDir, rel);
    const none: StatSharedPathResponse = {
      exists: false,
      kind: 'FILE_KIND_UNSPECIFIED',
      size: 0,
      mode: 0,
      uid: 0,
      gid: 0,
      linkTarget: '',
      content: new Uint8Array(),
      error: '',
    };
    let st: Stats;
    try {
      st = req.noFollow ? await fsp.lstat(full) : await fsp.stat(full);
    } catch (err) {
      const code = errnoCode(err);
      if (code === 'ENOENT' || code === 'ENOTDIR') return none;
      return { ...none, error: code ?? String(err) };
    }
    const out: StatSharedPathResponse = {
      ...none,
      exists: true,
      kind: fileKind(st),
      size: st.size,
      mode: st.mode & 0o7777,
      uid: st.uid,
      gid: st.gid,
    };
    if (st.isSymbolicLink()) out.linkTarget = await fsp.readlink(full);
    if (req.readContent && (st.isBlockDevice() || st.isCharacterDevice())) {
      // Only opened (non-blocking) and closed again: whether the guest's kernel has such a device.
      try {
        await (await fsp.open(full, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK)).close();
      } catch (err) {
        out.error = errnoCode(err) ?? String(err);
      }
    }
    if (req.readContent && st.isFile()) {
      try {
        const handle = await fsp.open(full, 'r');
        try {
          const buf = Buffer.alloc(Math.min(st.size, STAT_CONTENT_MAX_BYTES));
          const { bytesRead } = await handle.read(buf, 0, buf.length, 0);
          out.content = buf.subarray(0, bytesRead);
        } finally {
          await handle.close();
        }
      } catch (err) {
        out.error = errnoCode(err) ?? String(err);
      }
    }
    return out;
  }

  /**
   * guest/init mounts the share at boot when the VM has the device. A pooled VM gets it hot-plugged
   * just before CreatePod: then the agent waits for the device to be probed and mounts it here.
   */
  private async ensureSharedDir(): Promise<boolean> {
    if (await this.sharedDirMounted()) return true;
    const dir = this.paths.virtioDevicesDir;
    if (dir === undefined) return false;
    const until = Date.now() + SHARED_DEVICE_WAIT_MS;
    let kind: SharedDeviceKind | undefined = await findSharedDevice(dir, SHARED_FS_TAG);
    while (kind === undefined) {
      if (Date.now() > until) return false;
      await new Promise((r) => setTimeout(r, 50));
      kind = await findSharedDevice(dir, SHARED_FS_TAG);
    }
    await fsp.mkdir(this.paths.sharedDir, { recursive: true });
    for (;;) {
      try {
        await run(this.paths.mount, sharedMountArgs(kind, SHARED_FS_TAG, this.paths.sharedDir));
        this.logger.info({ sharedDir: this.paths.sharedDir, kind }, 'hot-plugged shared directory mounted');
        return true;
      } catch (err) {
        // The device is listed before its driver has registered the tag.
        if (Date.now() > until) {
          this.logger.warn({ err: String(err) }, 'cannot mount the hot-plugged shared directory');
          return false;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  private async sharedDirMounted(): Promise<boolean> {
    return this.isMountPoint(this.paths.sharedDir);
  }

  private async isMountPoint(dir: string): Promise<boolean> {
    const info = await fsp.readFile(path.join(this.paths.procRoot, 'self/mountinfo'), 'utf8').catch(() => '');
    return mountPoints(info).includes(dir);
  }

  private async readState(podId: string): Promise<PodState | undefined> {
    try {
      return JSON.parse(await fsp.readFile(path.join(this.paths.podsDir, podId, 'pod.json'), 'utf8')) as PodState;
    } catch {
      return undefined;
    }
  }

  /** The recorded pause process still runs (same pid, same start time, our binary for this pod). */
  private pauseAlive(state: PodState, podId: string): boolean {
    if (!isSameLiveProcess(state.pausePid, state.startTimeTicks, this.paths.procRoot)) return false;
    const argv = readCmdline(state.pausePid, this.paths.procRoot);
    return argv[1] === podId;
  }
}

function fileKind(st: Stats): FileKind {
  if (st.isFile()) return 'FILE_KIND_REGULAR';
  if (st.isDirectory()) return 'FILE_KIND_DIRECTORY';
  if (st.isSymbolicLink()) return 'FILE_KIND_SYMLINK';
  if (st.isCharacterDevice()) return 'FILE_KIND_CHAR_DEVICE';
  if (st.isBlockDevice()) return 'FILE_KIND_BLOCK_DEVICE';
  if (st.isFIFO()) return 'FILE_KIND_FIFO';
  if (st.isSocket()) return 'FILE_KIND_SOCKET';
  return 'FILE_KIND_UNSPECIFIED';
}
