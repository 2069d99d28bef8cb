/**
 * Unix sockets in a directory someone else can write (a confined QEMU's VMM dir) reached without
 * following a link: the daemon is root, and a link the VMM put where its QMP socket was could
 * otherwise make it connect to, chmod or chown whatever the link names. Each operation opens the
 * last component with O_PATH | O_NOFOLLOW (a descriptor of the entry itself, never of a link's
 * target), checks that the descriptor is a socket, and then works through /proc/self/fd/N, which
 * names exactly that inode: the check and the use cannot be told apart by a swap in between.
 */
import { constants, promises as fsp } from 'node:fs';
import net from 'node:net';
import { errnoCode, precondition } from './errors.js';
import './reasons.js';

/** O_PATH (Linux): a descriptor that names a file without opening it (not in Node's fs.constants). */
const O_PATH = 0o10000000;

/** The entry at `file` itself, never a link's target (libuv opens every descriptor close-on-exec): open, let `use` have it as a socket, close. */
async function withSocketEntry<T>(file: string, use: (procPath: string) => Promise<T>): Promise<T> {
  const handle = await fsp.open(file, O_PATH | constants.O_NOFOLLOW);
  try {
    const st = await handle.stat();
    if (!st.isSocket()) {
      throw precondition(
        'UNIX_SOCKET_UNSAFE',
        `${file} is not a unix socket (a ${st.isSymbolicLink() ? 'symbolic link' : 'file of another kind'}).`,
        {
          details: { file },
        },
      );
    }
    return await use(`/proc/self/fd/${handle.fd}`);
  } finally {
    await handle.close();
  }
}

/** Connect to the unix socket at `file` when it is one, not through a link. */
export function connectUnixNoFollow(file: string): Promise<net.Socket> {
  return withSocketEntry(
    file,
    (procPath) =>
      new Promise<net.Socket>((resolve, reject) => {
        const socket = net.createConnection(procPath);
        socket.once('connect', () => {
          socket.removeListener('error', reject);
          resolve(socket);
        });
        socket.once('error', reject);
      }),
  );
}

/** chmod the unix socket at `file`; false when it is gone. Throws UNIX_SOCKET_UNSAFE for anything but a socket. */
export async function chmodSocketNoFollow(file: string, mode: number): Promise<boolean> {
  try {
    await withSocketEntry(file, (procPath) => fsp.chmod(procPath, mode));
    return true;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return false;
    throw err;
  }
}

/** chown the unix socket at `file`. Throws UNIX_SOCKET_UNSAFE for anything but a socket. */
export async function chownSocketNoFollow(file: string, uid: number, gid: number): Promise<void> {
  await withSocketEntry(file, (procPath) => fsp.chown(procPath, uid, gid));
}
