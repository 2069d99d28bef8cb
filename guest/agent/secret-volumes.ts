/**
 * A container's secrets (CreateContainerRequest.secrets): each broker resource fetched through
 * the guest's attester, written to a tmpfs of the container's own, and bind-mounted read-only
 * into the container at the path the pod asked for.
 *
 * Where the bytes live: `/run/kata-ts/secrets/<container id>`, a tmpfs mounted for this container
 * alone (nosuid, nodev, noexec; remounted read-only once written), inside the guest's own /run,
 * never under the virtio-fs share, which the host reads and writes. The host learns the names and
 * paths it sent, a file's absence or presence, and nothing of its content.
 *
 * The file's mode is 0400, owned by the container's user (process.user, mapped through the
 * container's user namespace when it has one): the process the pod runs reads it, and no other
 * user of the container does. A secret readable by every user (0444) would be readable by any
 * process of the container that changed user (a web server's workers, an exec as someone else),
 * which is what a secret's owner did not ask for; a pod that needs it shared says so by running
 * those processes as the container's user.
 *
 * A resource refused or unreachable fails the container's creation naming the resource and the
 * broker's reason; nothing made is left (the tmpfs is unmounted). DeleteContainer and DestroyPod
 * overwrite every file with zeros before unmounting, so the freed pages hold no copy.
 *
 * Stateless across agent restarts: everything is found again from the directory names.
 */
import { Buffer } from 'node:buffer';
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parseResourcePath } from '../../src/attest/resource-path.js';
import { errorMessage, invalid, isKataError, precondition, unavailable } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';
import type { SecretMount } from '../../src/generated/agent/agent.js';
import { mountPoints } from './pods.js';
import './reasons.js';

/**
 * The guest attester as the secrets see it: one resource by its broker name
 * (`<repository>/<type>/<tag>`), decrypted, in memory. guest/agent/attest's client is one.
 */
export interface SecretSource {
  resource(name: string): Promise<Buffer>;
}

export interface SecretVolumePaths {
  /** Per-container tmpfs mount points: `<root>/<container id>`. */
  root: string;
  /** busybox mount/umount (argument arrays, never a shell). */
  mount: string;
  umount: string;
  procRoot: string;
}

export const GUEST_SECRET_PATHS: SecretVolumePaths = {
  root: '/run/kata-ts/secrets',
  mount: '/bin/mount',
  umount: '/bin/umount',
  procRoot: '/proc',
};

/** At most this many secrets per container (the host's limit too: src/runtime/sandbox/pod-secrets.ts). */
export const SECRETS_MAX_PER_CONTAINER = 16;
/** At most this many bytes in one container's tmpfs (the broker answers at most 2 MiB per resource). */
export const SECRET_VOLUME_MAX_BYTES = 16 * 1024 * 1024;
const CONTAINER_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const RESERVED_ROOTS = ['/proc', '/sys', '/dev'];
const FILE_MODE = 0o400;
const PAGE_BYTES = 4096;

/** One file of a container's secret volume, planned. */
export interface PlannedSecret {
  /** The broker's name of the resource. */
  resource: string;
  /** Where the container sees it. */
  containerPath: string;
  /** The file in the guest's tmpfs. */
  file: string;
}

/** What planSecretVolume decided (pure). */
export interface SecretVolumePlan {
  dir: string;
  secrets: PlannedSecret[];
  /** The owner of the files, as the guest kernel sees the container's user. */
  owner: { uid: number; gid: number };
}

interface IdMapping {
  containerID: number;
  hostID: number;
  size: number;
}

/** `id` of the container as the guest sees it, through the container's user namespace mappings if any. */
export function mapId(id: number, mappings: unknown): number {
  if (!Array.isArray(mappings) || mappings.length === 0) return id;
  for (const m of mappings as IdMapping[]) {
    if (id >= m.containerID && id < m.containerID + m.size) return m.hostID + (id - m.containerID);
  }
  throw invalid(
    'SECRET_REQUEST_INVALID',
    `the container's user ${id} is not mapped by its user namespace; its secrets would have no owner.`,
  );
}

/** Why `p` cannot be a secret's container path, or null. */
function pathProblem(p: string): string | null {
  if (!p.startsWith('/')) return 'is not absolute';
  if (p === '/' || p.endsWith('/')) return 'names no file';
  if (p.includes('\0')) return 'contains a NUL byte';
  if (p.split('/').some((s) => s === '..' || s === '.')) return "has a '.' or '..' segment";
  if (path.posix.normalize(p) !== p) return 'is not normalised';
  if (RESERVED_ROOTS.some((r) => p === r || p.startsWith(`${r}/`))) return 'is under /proc, /sys or /dev';
  return null;
}

function overlaps(a: string, b: string): boolean {
  const bare = (p: string) => p.replace(/\/+$/, '');
  return a === b || a.startsWith(`${bare(b)}/`) || b.startsWith(`${bare(a)}/`);
}

/**
 * The container's secret volume (pure): checks the request again (the host is not trusted with
 * the container's file system layout either) and names each file. Throws SECRET_REQUEST_INVALID
 * naming the entry.
 */
export function planSecretVolume(
  root: string,
  containerId: string,
  secrets: readonly SecretMount[],
  spec: Record<string, unknown>,
): SecretVolumePlan {
  if (!CONTAINER_ID.test(containerId))
    throw invalid('SECRET_REQUEST_INVALID', `container_id ${JSON.stringify(containerId)} cannot name a secret volume.`);
  if (secrets.length > SECRETS_MAX_PER_CONTAINER)
    throw invalid('SECRET_REQUEST_INVALID', `secrets has ${secrets.length} entries, more than ${SECRETS_MAX_PER_CONTAINER}.`);
  const dir = path.posix.join(root, containerId);
  const mounts = Array.isArray(spec.mounts) ? (spec.mounts as Array<{ destination?: unknown }>) : [];
  const planned: PlannedSecret[] = secrets.map((s, i) => {
    const at = `secrets[${i}]`;
    parseResourcePath(s.resource, `${at}.resource`);
    const problem = pathProblem(s.containerPath);
    if (problem !== null) throw invalid('SECRET_REQUEST_INVALID', `${at}.container_path ${JSON.stringify(s.containerPath)} ${problem}.`);
    const clash = mounts.find((m) => typeof m.destination === 'string' && overlaps(m.destination, s.containerPath));
    if (clash !== undefined)
      throw invalid(
        'SECRET_REQUEST_INVALID',
        `${at}.container_path ${JSON.stringify(s.containerPath)} overlaps the spec's mount at ${String(clash.destination)}.`,
      );
    return { resource: s.resource, containerPath: s.containerPath, file: path.posix.join(dir, `secret-${i}`) };
  });
  for (const [i, a] of planned.entries()) {
    for (const [j, b] of planned.entries()) {
      if (j > i && overlaps(a.containerPath, b.containerPath))
        throw invalid(
          'SECRET_REQUEST_INVALID',
          `secrets[${j}].container_path ${JSON.stringify(b.containerPath)} overlaps secrets[${i}]'s.`,
        );
    }
  }
  const process = (spec.process ?? {}) as { user?: { uid?: unknown; gid?: unknown } };
  const uid = typeof process.user?.uid === 'number' ? process.user.uid : 0;
  const gid = typeof process.user?.gid === 'number' ? process.user.gid : 0;
  const linux = (spec.linux ?? {}) as { uidMappings?: unknown; gidMappings?: unknown };
  return { dir, secrets: planned, owner: { uid: mapId(uid, linux.uidMappings), gid: mapId(gid, linux.gidMappings) } };
}

/** The OCI mounts that put each planned file at its container path, read-only. */
export function secretMounts(plan: SecretVolumePlan): Array<{ destination: string; type: string; source: string; options: string[] }> {
  return plan.secrets.map((s) => ({
    destination: s.containerPath,
    type: 'bind',
    source: s.file,
    options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'],
  }));
}

/** The tmpfs size for these contents: whole pages, one more per file for its inode's sake. */
export function secretVolumeSizeBytes(contents: readonly Buffer[]): number {
  return contents.reduce((sum, c) => sum + Math.ceil(c.length / PAGE_BYTES) * PAGE_BYTES + PAGE_BYTES, PAGE_BYTES);
}

function run(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: 10_000 }, (err, _stdout, stderr) => {
      if (err) reject(new Error(`${path.basename(file)} ${args.join(' ')}: ${stderr.trim() || err.message}`));
      else resolve();
    });
  });
}

/** The refusal of one resource as the host will show it: the resource, its path and the broker's reason. */
export function secretFetchError(secret: PlannedSecret, err: unknown): Error {
  const what = `resource kbs:///${secret.resource} for ${secret.containerPath}`;
  const details = { resource: secret.resource, containerPath: secret.containerPath, ...(isKataError(err) ? { cause: err.reason } : {}) };
  if (isKataError(err) && (err.kind === 'unavailable' || err.kind === 'timeout'))
    return unavailable('SECRET_RESOURCE_UNAVAILABLE', `${what}: the broker could not be asked: ${errorMessage(err)}`, {
      details,
      cause: err,
    });
  return precondition('SECRET_RESOURCE_REFUSED', `${what} was not released: ${errorMessage(err)}`, { details, cause: err });
}

/** The guest's secret volumes (see the file's comment). */
export class SecretVolumes {
  constructor(
    private readonly logger: Logger,
    /** The attester, once the initdata named a broker; undefined: none (the pod cannot have secrets). */
    private readonly source: () => SecretSource | undefined,
    private readonly paths: SecretVolumePaths = GUEST_SECRET_PATHS,
  ) {}

  /**
   * Fetches, writes and mounts the container's secrets; returns the spec with their bind mounts
   * added. On any failure nothing is left behind.
   */
  async prepare(containerId: string, secrets: readonly SecretMount[], spec: Record<string, unknown>): Promise<Record<string, unknown>> {
    const plan = planSecretVolume(this.paths.root, containerId, secrets, spec);
    if (await this.isMountPoint(plan.dir))
      throw precondition('SECRET_VOLUME_EXISTS', `container ${containerId} has a secret volume already; delete the container first.`);
    const source = this.source();
    if (source === undefined) {
      const first = plan.secrets[0]!;
      throw precondition(
        'SECRET_NO_ATTESTER',
        `resource kbs:///${first.resource} for ${first.containerPath} cannot be fetched: this pod's initdata names no broker to attest to.`,
      );
    }
    // Fetched before anything is made: a refusal leaves nothing to undo.
    const contents: Buffer[] = [];
    try {
      for (const secret of plan.secrets) {
        try {
          contents.push(await source.resource(secret.resource));
        } catch (err) {
          throw secretFetchError(secret, err);
        }
      }
      const size = secretVolumeSizeBytes(contents);
      if (size > SECRET_VOLUME_MAX_BYTES)
        throw precondition(
          'SECRET_VOLUME_TOO_LARGE',
          `container ${containerId}'s secrets need ${size} bytes, more than ${SECRET_VOLUME_MAX_BYTES}.`,
        );
      await this.write(plan, contents, size);
    } finally {
      for (const c of contents) c.fill(0);
    }
    this.logger.info(
      { containerId, secrets: plan.secrets.map((s) => ({ resource: s.resource, path: s.containerPath })) },
      'secrets mounted',
    );
    const existing = Array.isArray(spec.mounts) ? spec.mounts : [];
    return { ...spec, mounts: [...existing, ...secretMounts(plan)] };
  }

  private async write(plan: SecretVolumePlan, contents: readonly Buffer[], sizeBytes: number): Promise<void> {
    await fsp.mkdir(this.paths.root, { recursive: true, mode: 0o700 });
    await fsp.mkdir(plan.dir, { mode: 0o700 });
    try {
      await run(this.paths.mount, ['-t', 'tmpfs', '-o', `nosuid,nodev,noexec,mode=0700,size=${sizeBytes}`, 'kata-ts-secrets', plan.dir]);
      for (const [i, secret] of plan.secrets.entries()) {
        await fsp.writeFile(secret.file, contents[i]!, { mode: FILE_MODE, flag: 'wx' });
        await fsp.chown(secret.file, plan.owner.uid, plan.owner.gid);
      }
      await run(this.paths.mount, ['-o', 'remount,ro', plan.dir]);
    } catch (err) {
      await this.remove(path.basename(plan.dir)).catch((e: unknown) =>
        this.logger.warn({ err: errorMessage(e), dir: plan.dir }, 'a failed secret volume could not be removed'),
      );
      throw err;
    }
  }

  /** Overwrites the container's secrets with zeros, unmounts and removes its volume; nothing there is fine. */
  async remove(containerId: string): Promise<void> {
    if (!CONTAINER_ID.test(containerId)) return;
    const dir = path.posix.join(this.paths.root, containerId);
    const mounted = await this.isMountPoint(dir);
    if (mounted) await run(this.paths.mount, ['-o', 'remount,rw', dir]);
    // Zeroed before they go: tmpfs hands freed pages back without clearing them.
    for (const name of await fsp.readdir(dir).catch(() => [] as string[])) {
      const file = path.posix.join(dir, name);
      const handle = await fsp.open(file, 'r+').catch(() => undefined);
      if (handle !== undefined) {
        try {
          const { size } = await handle.stat();
          if (size > 0) await handle.write(Buffer.alloc(size), 0, size, 0);
          await handle.sync();
        } finally {
          await handle.close();
        }
      }
      await fsp.rm(file, { force: true });
    }
    if (mounted) {
      await run(this.paths.umount, [dir]);
      this.logger.info({ containerId }, 'secrets wiped and unmounted');
    }
    await fsp.rmdir(dir).catch(() => undefined);
  }

  /** Every container's volume (DestroyPod). */
  async removeAll(): Promise<void> {
    const names = await fsp.readdir(this.paths.root).catch(() => [] as string[]);
    for (const name of names) await this.remove(name);
  }

  private async isMountPoint(dir: string): Promise<boolean> {
    const info = await fsp.readFile(path.join(this.paths.procRoot, 'self/mountinfo'), 'utf8').catch(() => '');
    return mountPoints(info).includes(dir);
  }
}
