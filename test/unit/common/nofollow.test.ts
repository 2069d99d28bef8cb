/**
 * Sockets in a directory a confined QEMU writes, reached without following links: a link planted
 * where a socket was (to another socket of the host, or to a file root owns) is refused by every
 * operation, and its target is neither connected to nor changed. Real sockets and files in a
 * temporary directory.
 */
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { chmodSocketNoFollow, chownSocketNoFollow, connectUnixNoFollow } from '../../../src/common/nofollow.js';
import { connectQmp } from '../../../src/hypervisor/qmp/client.js';
import { ReadyChannel } from '../../../src/hypervisor/ready-channel.js';
import { restrictSocketModes } from '../../../src/runtime/sandbox/socket-modes.js';

describe('sockets reached without following links', () => {
  let dir = '';
  let server: net.Server;
  const accepted: string[] = [];
  const socketPath = () => path.join(dir, 'host.sock');

  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-nofollow-'));
    accepted.length = 0;
    server = net.createServer((s) => {
      accepted.push('connection');
      s.end();
    });
    await new Promise<void>((resolve) => server.listen(socketPath(), resolve));
  });
  afterEach(async () => {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('a socket itself: connected, chmod-ed and chown-ed', async () => {
    const s = await connectUnixNoFollow(socketPath());
    s.destroy();
    expect(await chmodSocketNoFollow(socketPath(), 0o600)).toBe(true);
    await chownSocketNoFollow(socketPath(), 12345, 12346);
    const st = await fsp.stat(socketPath());
    expect([st.mode & 0o777, st.uid, st.gid]).toEqual([0o600, 12345, 12346]);
    await new Promise((r) => setTimeout(r, 20));
    expect(accepted).toEqual(['connection']);
  });

  it('a link to another socket of the host: connect refused (QMP, ready and agent clients alike), the target never reached', async () => {
    const planted = path.join(dir, 'qmp.sock');
    await fsp.symlink(socketPath(), planted);
    await expect(connectUnixNoFollow(planted)).rejects.toMatchObject({ reason: 'UNIX_SOCKET_UNSAFE' });
    await expect(connectQmp(planted)).rejects.toMatchObject({ reason: 'UNIX_SOCKET_UNSAFE' });
    await expect(ReadyChannel.connect(planted, silentLogger())).rejects.toMatchObject({ reason: 'UNIX_SOCKET_UNSAFE' });
    await new Promise((r) => setTimeout(r, 20));
    expect(accepted).toEqual([]);
  });

  it('a link to a file root owns: neither chmod nor chown reaches it; restrictSocketModes skips nothing real and changes nothing', async () => {
    const target = path.join(dir, 'root-file');
    await fsp.writeFile(target, 'x', { mode: 0o644 });
    await fsp.chmod(target, 0o644);
    const planted = path.join(dir, 'vfs.sock');
    await fsp.symlink(target, planted);
    await expect(chmodSocketNoFollow(planted, 0o600)).rejects.toMatchObject({ reason: 'UNIX_SOCKET_UNSAFE' });
    await expect(chownSocketNoFollow(planted, 12345, 12345)).rejects.toMatchObject({ reason: 'UNIX_SOCKET_UNSAFE' });
    // readdir sees the link as a link, not a socket; the real socket is restricted.
    expect(await restrictSocketModes(dir)).toEqual([socketPath()]);
    const st = await fsp.stat(target);
    expect([st.mode & 0o777, st.uid]).toEqual([0o644, 0]);
  });

  it('a socket gone before the chmod: false, nothing thrown; a regular file where a socket was: refused', async () => {
    expect(await chmodSocketNoFollow(path.join(dir, 'gone.sock'), 0o600)).toBe(false);
    const file = path.join(dir, 'plain');
    await fsp.writeFile(file, '');
    await expect(chownSocketNoFollow(file, 1, 1)).rejects.toMatchObject({ reason: 'UNIX_SOCKET_UNSAFE' });
  });
});
