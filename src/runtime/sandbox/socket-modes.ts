import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { chmodSocketNoFollow } from '../../common/nofollow.js';

/**
 * chmod 0600 every unix socket directly in `dir` (a sandbox's work dir, itself 0700): QEMU and
 * virtiofsd create their QMP, ready, agent and virtio-fs sockets with the daemon's umask (0755
 * under the usual 022). The 0700 directory already keeps everyone else out; this is the second
 * lock, so a socket copied or linked elsewhere, or a directory mode changed by hand, exposes nothing.
 * Returns the sockets it restricted.
 */
export async function restrictSocketModes(dir: string): Promise<string[]> {
  const done: string[] = [];
  for (const entry of await fsp.readdir(dir, { withFileTypes: true })) {
    if (!entry.isSocket()) continue;
    const file = path.join(dir, entry.name);
    // A confined QEMU owns its VMM dir and may swap the entry for a link after the readdir: the
    // chmod reaches the socket itself or nothing (a root chmod through a link would change a host file).
    if (await chmodSocketNoFollow(file, 0o600)) done.push(file);
  }
  return done;
}
