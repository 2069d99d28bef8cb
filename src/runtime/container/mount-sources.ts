/**
 * A CreateContainer's mount sources, all checked before any is made: a missing host_path becomes
 * a directory (containerd does that, and the kubelet relies on it for hostPath volumes without a
 * type), but only once every mount of the request is known to be usable, so a request refused for
 * its third mount has not made the directories of its first two. What was made is listed, so a
 * later refusal or failure of the same CreateContainer removes it again (empty directories only,
 * deepest first: never anything a bind or someone else put there).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, errorMessage, invalid } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';

/** What one mount's source is on the host before anything is made. */
export interface MountSourceCheck {
  hostPath: string;
  /** The first missing component of hostPath (made, with the rest, by makeMissingSources), or null when it exists. */
  missingFrom: string | null;
}

/** host_path is absolute, normalised and free of NUL (pure): what every later step relies on. */
export function mountSourceFault(hostPath: string): string | undefined {
  if (hostPath === '') return 'is empty';
  if (hostPath.includes('\0')) return 'holds a NUL byte';
  if (!hostPath.startsWith('/')) return 'is not absolute';
  if (hostPath.split('/').includes('..')) return 'has a ".." segment';
  return undefined;
}

function what(st: { isSocket(): boolean; isFIFO(): boolean; isCharacterDevice(): boolean; isBlockDevice(): boolean }): string {
  if (st.isSocket()) return 'a socket';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device node';
  return 'not a file or directory';
}

/**
 * Look at every mount's source (reads only) and refuse the request, naming the first mount at
 * fault, unless each is an existing directory or regular file, or missing below an existing
 * directory. `fieldOf(i)` names mount i as the request does.
 */
export async function checkMountSources(hostPaths: readonly string[], fieldOf: (i: number) => string): Promise<MountSourceCheck[]> {
  const out: MountSourceCheck[] = [];
  for (const [i, hostPath] of hostPaths.entries()) {
    const field = fieldOf(i);
    const fault = mountSourceFault(hostPath);
    if (fault !== undefined) throw invalid('CONTAINER_MOUNT_SOURCE_INVALID', `${field}: host_path ${JSON.stringify(hostPath)} ${fault}`);
    const st = await fsp.stat(hostPath).catch((err: unknown) => {
      if (errnoCode(err) === 'ENOENT') return undefined;
      throw invalid('CONTAINER_MOUNT_SOURCE_INVALID', `${field}: host_path "${hostPath}" cannot be resolved: ${errorMessage(err)}`);
    });
    if (st !== undefined) {
      if (!st.isDirectory() && !st.isFile())
        throw invalid(
          'CONTAINER_MOUNT_SOURCE_UNSUPPORTED',
          `${field}: host_path "${hostPath}" is ${what(st)}, which cannot cross into the pod VM (only directories and regular files can)`,
        );
      out.push({ hostPath, missingFrom: null });
      continue;
    }
    // Missing: the nearest ancestor that exists must be a directory for mkdir -p to work.
    let missingFrom = path.normalize(hostPath);
    let parent = path.dirname(missingFrom);
    for (;;) {
      const up = await fsp.stat(parent).catch(() => undefined);
      if (up !== undefined) {
        if (!up.isDirectory())
          throw invalid(
            'CONTAINER_MOUNT_SOURCE_INVALID',
            `${field}: host_path "${hostPath}" is missing and "${parent}" is not a directory`,
          );
        break;
      }
      missingFrom = parent;
      parent = path.dirname(parent);
    }
    out.push({ hostPath, missingFrom });
  }
  return out;
}

/** Make the missing sources (mode 0755, as containerd does); returns the directories made, shallowest first. */
export async function makeMissingSources(checks: readonly MountSourceCheck[], made: string[]): Promise<void> {
  for (const c of checks) {
    if (c.missingFrom === null) continue;
    const first = await fsp.mkdir(c.hostPath, { recursive: true, mode: 0o755 });
    if (first === undefined) continue;
    // mkdir -p returns the first directory it made: every one from there down to hostPath is ours.
    for (let dir = path.normalize(c.hostPath); ; dir = path.dirname(dir)) {
      made.push(dir);
      if (dir === first || dir === path.dirname(dir)) break;
    }
  }
}

/**
 * Remove the directories makeMissingSources made, deepest first, each only while empty (rmdir): a
 * directory someone else filled meanwhile is left, and said so in the log. Never throws.
 */
export async function removeMadeSources(made: readonly string[], logger: Logger): Promise<void> {
  const deepestFirst = [...new Set(made)].sort((a, b) => b.split('/').length - a.split('/').length || b.localeCompare(a));
  for (const dir of deepestFirst) {
    await fsp.rmdir(dir).catch((err: unknown) => {
      if (errnoCode(err) !== 'ENOENT') logger.warn({ dir, err: errorMessage(err) }, 'a mount source made for a failed create is left');
    });
  }
}
