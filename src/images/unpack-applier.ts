import { execFile } from 'node:child_process';
import { createWriteStream, promises as fsp, type Stats } from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import type { Header } from 'tar-stream';
import { errnoCode, invalid } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { Digest } from './digest.js';
import { type EntryContext, entryRelativePath, resolveInRoot } from './unpack-paths.js';

const execFileAsync = promisify(execFile);

/** The xattr overlayfs reads to hide everything lower in a directory. */
export const OVERLAY_OPAQUE_XATTR = 'trusted.overlay.opaque';

/** What one layer did to the tree. */
export interface LayerStats {
  entries: number;
  files: number;
  directories: number;
  symlinks: number;
  hardlinks: number;
  whiteouts: number;
  opaqueDirs: number;
  /** Device nodes and FIFOs made. */
  specialFiles: number;
  /** Entries not applied (unknown types, device nodes that could not be made). */
  skipped: number;
  /** Uncompressed tar bytes. */
  tarBytes: number;
  /** sha256 of the uncompressed tar. */
  diffId: Digest;
}

export interface ApplyLayerOptions {
  /** The layer digest, named in every refusal. */
  layer: string;
  /** When given, the uncompressed tar must hash to it (the config's diff_id). */
  expectedDiffId?: Digest;
  signal?: AbortSignal;
  logger?: Logger;
  /**
   * `apply` (default): whiteouts delete what lower layers put in the same tree (a flat root
   * filesystem). `overlay`: the layer is unpacked on its own, for an overlay mount, and its
   * whiteouts become overlayfs's: a 0/0 character device for `.wh.<name>`, the xattr
   * `trusted.overlay.opaque` = `y` on the directory of `.wh..wh..opq`.
   */
  whiteouts?: 'apply' | 'overlay';
  /**
   * With `overlay`: the layers below, top first. A directory this layer needs but does not
   * carry (a parent of one of its entries) takes its mode and owner from the first of them that
   * has it, as the merged view would show it; 0755 root otherwise.
   */
  parents?: readonly string[];
}

/** A tar header as tar-stream yields it (fields may be missing in hand-made archives). */
export type Headers = Partial<Header> & { name: string };

/** An entry body: tar-stream hands out streamx readables, which are async-iterable. */
export type EntryBody = AsyncIterable<unknown>;

interface DirMeta {
  mode: number;
  uid: number;
  gid: number;
  mtime: Date | undefined;
}

/**
 * Applies one tar layer onto a directory the way an overlay would have stacked it: OCI whiteouts
 * (`.wh.<name>` deletes a lower path, `.wh..wh..opq` hides everything lower in its directory),
 * modes, owners, symlinks, hard links and mtimes, and nothing outside the root.
 */
export class LayerApplier {
  private readonly ctx: EntryContext;
  /** Host paths this layer wrote, and every directory above them: what whiteouts must spare. */
  private readonly written = new Set<string>();
  private readonly aboveWritten = new Set<string>();
  private readonly dirMeta = new Map<string, DirMeta>();
  private readonly isRoot = process.getuid?.() === 0;
  readonly stats: Omit<LayerStats, 'diffId' | 'tarBytes'> = {
    entries: 0,
    files: 0,
    directories: 0,
    symlinks: 0,
    hardlinks: 0,
    whiteouts: 0,
    opaqueDirs: 0,
    specialFiles: 0,
    skipped: 0,
  };

  constructor(
    private readonly root: string,
    private readonly opts: ApplyLayerOptions,
  ) {
    this.ctx = { layer: opts.layer };
  }

  /** A directory made implicitly: in overlay mode its metadata comes from the layers below. */
  private readonly onCreated = async (rel: string, hostPath: string): Promise<void> => {
    if (this.opts.whiteouts !== 'overlay') return;
    for (const lower of this.opts.parents ?? []) {
      const st = await fsp.lstat(path.join(lower, rel)).catch(() => undefined);
      if (st === undefined) continue;
      // A non-directory below is replaced by this directory: nothing to copy.
      if (!st.isDirectory()) return;
      await this.own(hostPath, { name: rel, uid: st.uid, gid: st.gid });
      await fsp.chmod(hostPath, st.mode & 0o7777);
      return;
    }
  };

  private markWritten(hostPath: string): void {
    this.written.add(hostPath);
    for (let p = path.dirname(hostPath); p.length > this.root.length; p = path.dirname(p)) this.aboveWritten.add(p);
  }

  async entry(header: Headers, body: EntryBody): Promise<void> {
    this.stats.entries++;
    const name = header.name;
    const rel = entryRelativePath(name, this.ctx);
    const type = header.type ?? 'file';
    if (rel === '') {
      await drain(body);
      if (type === 'directory') this.dirMeta.set(this.root, metaOf(header, 0o755));
      return;
    }
    const base = path.posix.basename(rel);
    const dirRel = path.posix.dirname(rel) === '.' ? '' : path.posix.dirname(rel);
    if (base.startsWith('.wh.')) {
      await drain(body);
      if (base === '.wh..wh..opq') await this.opaque(dirRel, name);
      else await this.whiteout(dirRel, base.slice('.wh.'.length), name, header);
      return;
    }
    const parent = (await resolveInRoot(this.root, dirRel, this.ctx, {
      createMissing: true,
      followLast: true,
      entry: name,
      onCreated: this.onCreated,
    })) as string;
    const target = path.join(parent, base);
    switch (type) {
      case 'directory':
        await drain(body);
        await this.directory(target, header);
        break;
      case 'file':
      case 'contiguous-file':
        await this.file(target, header, body);
        break;
      case 'symlink':
        await drain(body);
        await this.replace(target);
        await fsp.symlink(header.linkname ?? '', target);
        await this.own(target, header);
        await fsp.lutimes(target, header.mtime ?? new Date(), header.mtime ?? new Date());
        this.stats.symlinks++;
        break;
      case 'link':
        await drain(body);
        await this.hardlink(target, header, name);
        break;
      case 'character-device':
      case 'block-device':
      case 'fifo':
        await drain(body);
        await this.special(target, header, type);
        break;
      default:
        await drain(body);
        this.stats.skipped++;
        this.opts.logger?.debug({ layer: this.opts.layer, entry: name, type }, 'layer entry of unknown type skipped');
        return;
    }
    this.markWritten(target);
  }

  /** Remove whatever is at `target` so a new entry replaces it (never writing through it). */
  private async replace(target: string, keepDirectory = false): Promise<void> {
    let st: Stats;
    try {
      st = await fsp.lstat(target);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return;
      throw err;
    }
    if (keepDirectory && st.isDirectory()) return;
    await fsp.rm(target, { recursive: true, force: true });
  }

  private async directory(target: string, header: Headers): Promise<void> {
    await this.replace(target, true);
    try {
      await fsp.mkdir(target, { mode: 0o700 });
    } catch (err) {
      if (errnoCode(err) !== 'EEXIST') throw err;
    }
    // Mode, owner and mtime are set when the layer ends: writing children would bump the
    // mtime, and a read-only mode would get in the way of an unprivileged unpack.
    this.dirMeta.set(target, metaOf(header, 0o755));
    this.stats.directories++;
  }

  private async file(target: string, header: Headers, body: EntryBody): Promise<void> {
    await this.replace(target);
    // 'wx' = O_CREAT|O_EXCL: never follows a symlink planted at the final component.
    await pipeline(body, createWriteStream(target, { flags: 'wx', mode: 0o600 }), { signal: this.opts.signal });
    await this.own(target, header);
    await fsp.chmod(target, (header.mode ?? 0o644) & 0o7777);
    const mtime = header.mtime ?? new Date();
    await fsp.utimes(target, mtime, mtime);
    this.stats.files++;
  }

  private async hardlink(target: string, header: Headers, entryName: string): Promise<void> {
    const linkRel = entryRelativePath(header.linkname ?? '', this.ctx, 'hard link target');
    if (linkRel === '')
      throw invalid(
        'IMAGE_LAYER_UNSAFE_ENTRY',
        `layer ${this.opts.layer} entry ${JSON.stringify(entryName)} is a hard link to the root directory`,
      );
    const linkDir = path.posix.dirname(linkRel) === '.' ? '' : path.posix.dirname(linkRel);
    const parent = await resolveInRoot(this.root, linkDir, this.ctx, { createMissing: false, followLast: true, entry: entryName });
    const source = parent === undefined ? undefined : path.join(parent, path.posix.basename(linkRel));
    const st = source === undefined ? undefined : await fsp.lstat(source).catch(() => undefined);
    if (source === undefined || st === undefined) {
      throw invalid(
        'IMAGE_LAYER_INVALID_ENTRY',
        `layer ${this.opts.layer} entry ${JSON.stringify(entryName)} is a hard link to ${JSON.stringify(header.linkname)}, which does not exist`,
      );
    }
    if (st.isDirectory()) {
      throw invalid(
        'IMAGE_LAYER_INVALID_ENTRY',
        `layer ${this.opts.layer} entry ${JSON.stringify(entryName)} is a hard link to directory ${JSON.stringify(header.linkname)}`,
      );
    }
    if (source === target) return;
    await this.replace(target);
    await fsp.link(source, target);
    this.stats.hardlinks++;
  }

  private async special(target: string, header: Headers, type: 'character-device' | 'block-device' | 'fifo'): Promise<void> {
    await this.replace(target);
    try {
      // node has no mknod(2); coreutils does it (needs CAP_MKNOD, which a root daemon has).
      if (type === 'fifo') await execFileAsync('mkfifo', ['--', target]);
      else
        await execFileAsync('mknod', [
          '--',
          target,
          type === 'character-device' ? 'c' : 'b',
          String(header.devmajor ?? 0),
          String(header.devminor ?? 0),
        ]);
    } catch (err) {
      this.stats.skipped++;
      this.opts.logger?.warn(
        { layer: this.opts.layer, entry: header.name, err: (err as Error).message },
        'device node or FIFO could not be made; skipped',
      );
      return;
    }
    await this.own(target, header);
    await fsp.chmod(target, (header.mode ?? 0o644) & 0o7777);
    this.stats.specialFiles++;
  }

  /** chown before chmod: chown clears set-uid/set-gid bits. */
  private async own(target: string, header: Headers): Promise<void> {
    try {
      await fsp.lchown(target, header.uid ?? 0, header.gid ?? 0);
    } catch (err) {
      // An unprivileged unpack (developer tests) keeps its own uid; the daemon runs as root.
      if (this.isRoot || (errnoCode(err) !== 'EPERM' && errnoCode(err) !== 'EINVAL')) throw err;
    }
  }

  private async whiteout(dirRel: string, name: string, entryName: string, header?: Headers): Promise<void> {
    if (name === '' || name === '.' || name === '..' || name.includes('/')) {
      throw invalid(
        'IMAGE_LAYER_INVALID_ENTRY',
        `layer ${this.opts.layer} entry ${JSON.stringify(entryName)} is a whiteout without a name`,
      );
    }
    this.stats.whiteouts++;
    if (this.opts.whiteouts === 'overlay') return this.overlayWhiteout(dirRel, name, entryName, header);
    const parent = await resolveInRoot(this.root, dirRel, this.ctx, { createMissing: false, followLast: true, entry: entryName });
    if (parent === undefined) return;
    const target = path.join(parent, name);
    // A whiteout hides lower layers only; what this very layer wrote stays.
    if (this.written.has(target)) return;
    if (this.aboveWritten.has(target)) return this.pruneLower(target);
    await fsp.rm(target, { recursive: true, force: true });
  }

  private async opaque(dirRel: string, entryName: string): Promise<void> {
    this.stats.opaqueDirs++;
    const dir = (await resolveInRoot(this.root, dirRel, this.ctx, {
      createMissing: true,
      followLast: true,
      entry: entryName,
      onCreated: this.onCreated,
    })) as string;
    if (this.opts.whiteouts === 'overlay') {
      if (dir === this.root) {
        throw invalid('IMAGE_LAYER_INVALID_ENTRY', `layer ${this.opts.layer} entry ${JSON.stringify(entryName)} makes the root opaque`);
      }
      // node has no setxattr(2); attr's setfattr does it. `trusted.*` needs CAP_SYS_ADMIN (the daemon's).
      await execFileAsync('setfattr', ['-n', OVERLAY_OPAQUE_XATTR, '-v', 'y', '--', dir]);
      return;
    }
    await this.pruneLower(dir);
  }

  /**
   * overlayfs's whiteout: a character device 0/0 with the whiteout's owner where the deleted
   * name was. What this very layer wrote under that name stays (the whiteout hides lower layers
   * only); a later entry of this layer with that name replaces the device.
   */
  private async overlayWhiteout(dirRel: string, name: string, entryName: string, header: Headers | undefined): Promise<void> {
    const parent = (await resolveInRoot(this.root, dirRel, this.ctx, {
      createMissing: true,
      followLast: true,
      entry: entryName,
      onCreated: this.onCreated,
    })) as string;
    const target = path.join(parent, name);
    if (this.written.has(target) || this.aboveWritten.has(target)) return;
    await fsp.rm(target, { recursive: true, force: true });
    await execFileAsync('mknod', ['-m', '0', '--', target, 'c', '0', '0']);
    await this.own(target, { name: entryName, uid: header?.uid ?? 0, gid: header?.gid ?? 0 });
  }

  /** Delete everything under `dir` that lower layers put there, keeping this layer's entries. */
  private async pruneLower(dir: string): Promise<void> {
    for (const child of await fsp.readdir(dir)) {
      const p = path.join(dir, child);
      if (this.written.has(p) || this.aboveWritten.has(p)) {
        const st = await fsp.lstat(p);
        if (st.isDirectory()) await this.pruneLower(p);
      } else {
        await fsp.rm(p, { recursive: true, force: true });
      }
    }
  }

  /** Directory metadata, deepest first so a parent's mtime is set after its children changed it. */
  async finish(): Promise<void> {
    const dirs = [...this.dirMeta.entries()].sort((a, b) => b[0].length - a[0].length);
    for (const [dir, meta] of dirs) {
      await this.own(dir, { name: dir, uid: meta.uid, gid: meta.gid });
      await fsp.chmod(dir, meta.mode);
      if (meta.mtime !== undefined) await fsp.utimes(dir, meta.mtime, meta.mtime);
    }
  }
}

function metaOf(header: Headers, defaultMode: number): DirMeta {
  return { mode: (header.mode ?? defaultMode) & 0o7777, uid: header.uid ?? 0, gid: header.gid ?? 0, mtime: header.mtime };
}

async function drain(body: EntryBody): Promise<void> {
  for await (const chunk of body) void chunk;
}
