import { promises as fsp, type Stats } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid } from '../common/errors.js';
import type { ImageReason } from './reasons.js';

/** Linux's own limit on symlinks followed while resolving one path (MAXSYMLINKS). */
const MAX_SYMLINK_HOPS = 40;

/** Who is being unpacked, for refusals: the layer digest. */
export interface EntryContext {
  layer: string;
}

function unsafe(ctx: EntryContext, entry: string, why: string, reason: ImageReason = 'IMAGE_LAYER_UNSAFE_ENTRY'): never {
  throw invalid(reason, `layer ${ctx.layer} entry ${JSON.stringify(entry)} ${why}`, {
    details: { layer: ctx.layer, entry },
  });
}

/**
 * The path of a tar entry relative to the root: `./`, empty and `.` components dropped. Absolute
 * names and any `..` component are refused: a layer has no business naming anything outside or
 * above itself, whatever the name would normalise to.
 */
export function entryRelativePath(name: string, ctx: EntryContext, field = 'name'): string {
  if (name.startsWith('/')) unsafe(ctx, name, `has an absolute ${field}`);
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) unsafe(ctx, name, `has a ${field} that climbs out with '..'`);
  if (parts.some((p) => p.includes('\0'))) unsafe(ctx, name, `has a NUL byte in its ${field}`);
  return parts.join('/');
}

/**
 * Resolve `rel` (components already free of `..`) to a host path inside `root`, following
 * symlinks met on the way as the container will see them: an absolute target restarts at the
 * root (chroot semantics, so `lib -> /usr/lib` works), a relative one continues from the link's
 * directory. A target that climbs above the root is refused: that is a layer trying to write
 * through a symlink to the host. The last component is not followed when `followLast` is false
 * (tar entries replace a final symlink rather than writing through it).
 *
 * Missing directories are created (mode 0755) when `createMissing`; otherwise undefined is
 * returned as soon as a component is missing.
 */
export async function resolveInRoot(
  root: string,
  rel: string,
  ctx: EntryContext,
  opts: {
    createMissing: boolean;
    followLast: boolean;
    entry: string;
    /** Called for each directory made here (root-relative path): a layer unpacked on its own copies its metadata from below. */
    onCreated?: (rel: string, hostPath: string) => Promise<void>;
  },
): Promise<string | undefined> {
  const stack: string[] = [];
  const queue = rel.split('/').filter((p) => p !== '' && p !== '.');
  let hops = 0;
  while (queue.length > 0) {
    const component = queue.shift() as string;
    if (component === '..') {
      if (stack.length === 0) unsafe(ctx, opts.entry, 'resolves through a symlink to a path outside the root');
      stack.pop();
      continue;
    }
    const isLast = queue.length === 0;
    const hostPath = path.join(root, ...stack, component);
    let st: Stats;
    try {
      st = await fsp.lstat(hostPath);
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw err;
      if (isLast && !opts.followLast) {
        stack.push(component);
        continue;
      }
      if (!opts.createMissing) return undefined;
      await fsp.mkdir(hostPath, { mode: 0o755 });
      stack.push(component);
      await opts.onCreated?.(stack.join('/'), hostPath);
      continue;
    }
    if (st.isSymbolicLink() && (!isLast || opts.followLast)) {
      if (++hops > MAX_SYMLINK_HOPS) unsafe(ctx, opts.entry, `resolves through more than ${MAX_SYMLINK_HOPS} symlinks`);
      const target = await fsp.readlink(hostPath);
      if (target.startsWith('/')) stack.length = 0;
      queue.unshift(...target.split('/').filter((p) => p !== '' && p !== '.'));
      continue;
    }
    if (!isLast && !st.isDirectory()) {
      unsafe(ctx, opts.entry, `needs ${path.join(...stack, component)} to be a directory, but it is not`, 'IMAGE_LAYER_INVALID_ENTRY');
    }
    stack.push(component);
  }
  return path.join(root, ...stack);
}
