/**
 * A private volume's copies do not keep the host from unmounting its submounts (real mounts, no
 * VM). In a shared tree (what systemd makes of a host), with the share as prepareSharedDir makes it
 * and a "virtiofsd" (a process in a slave mount namespace of its own, made before the volume is
 * bound, as virtiofsd's is) keeping its copy of the volume's tmpfs submount busy: the submount
 * still unmounts. Bound straight into the share and made private afterwards, virtiofsd's copy of
 * the volume became a slave of the host's, so the unmount reached its busy copy of the submount
 * and answered EBUSY. (Removing the submount's directory as well needs the container's own copy
 * in another mount namespace, the runtime's: host-mounts.test.ts; here everything shares one.)
 */
import { execFile, spawn } from 'node:child_process';
import { promises as fsp, readlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { SharedDirMounts } from '../../../src/runtime/container/shared-dir.js';
import { mountsUnder, prepareSharedDir, releaseSharedMounts } from '../../../src/runtime/sandbox/shared-dir.js';
import { until } from '../../helpers/poll.js';

const execFileAsync = promisify(execFile);

describe('SharedDirMounts: a private volume with a submount, its copy busy in a slave namespace', () => {
  let dir = '';
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-prv-'));
    await execFileAsync('mount', ['--bind', dir, dir]);
    await execFileAsync('mount', ['--make-shared', dir]);
  });
  afterEach(async () => {
    await releaseSharedMounts(dir, silentLogger());
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('the host unmounts the submount; the container keeps its private copy; the staging point is gone', async () => {
    const share = path.join(dir, 'share');
    const volume = path.join(dir, 'volume');
    const sub = path.join(volume, 'sub');
    await fsp.mkdir(sub, { recursive: true });
    await execFileAsync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'kts-prv-sub', sub]);
    await fsp.writeFile(path.join(sub, 'hello'), 'hi\n');
    await prepareSharedDir(share);
    const inShare = path.join(share, 'c1', 'mounts', '0', 'sub');
    const holder = spawn(
      'unshare',
      ['--mount', '--propagation', 'slave', '--', 'sh', '-c', 'while ! cd "$0" 2>/dev/null; do sleep 0.05; done; exec sleep 60', inShare],
      { stdio: 'ignore' },
    );
    const mounts = new SharedDirMounts(
      { hostDir: path.join(share, 'c1'), guestDir: '/run/share/c1', stagingDir: path.join(dir, 'staging') },
      [{ dir: share, shared: true }],
      silentLogger(),
    );
    try {
      await mounts.bindCriMounts([{ container_path: '/vol', host_path: volume, readonly: false, propagation: 'PROPAGATION_PRIVATE' }]);
      await until('the holder in its copy of the submount', async () => {
        try {
          return readlinkSync(`/proc/${holder.pid}/cwd`) === inShare ? true : undefined;
        } catch {
          return undefined;
        }
      });
      await execFileAsync('umount', ['--', sub]);
      await expect(fsp.readdir(sub)).resolves.toEqual([]);
      // The container's own copy stays (private): it still shows the file.
      expect(await fsp.readFile(path.join(share, 'c1', 'mounts', '0', 'sub', 'hello'), 'utf8')).toBe('hi\n');
      expect(await fsp.readdir(path.join(dir, 'staging'))).toEqual([]);
    } finally {
      holder.kill('SIGKILL');
      await new Promise((r) => holder.once('exit', r));
      expect(await mounts.undo()).toBe(true);
    }
    expect(mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), share)).toEqual([share]);
  });
});
