/**
 * The runtime's own mount namespace, real but without a VM: created once however many start at
 * once, bound at a file in a private bind of its directory; in a shared tree (what systemd makes of
 * a host) the host's later mounts reach it and its own never leave; a process inside keeps it from
 * being removed; `kata-ts serve` runs the daemon inside it (the process a user starts stays
 * outside, passes SIGTERM on, and takes the daemon with it when killed), a restart enters the same
 * one, and `kata-ts mount-namespace` shows and removes it. Everything is made under a temp dir and
 * removed, mounts first.
 */
import { execFile, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import {
  boundNamespace,
  ensureMountNamespace,
  insideCommand,
  namespaceOf,
  readNamespaceMountinfo,
  removeMountNamespace,
} from '../../../src/runtime/mount-namespace.js';
import { mountsUnder, releaseSharedMounts } from '../../../src/runtime/sandbox/shared-dir.js';
import { spawnDaemon } from '../../helpers/daemon-process.js';
import { until } from '../../helpers/poll.js';

const execFileAsync = promisify(execFile);
const hostMountinfo = () => fsp.readFile('/proc/self/mountinfo', 'utf8');
const mountLine = (mountinfo: string, point: string) => mountinfo.split('\n').find((l) => l.split(' ')[4] === point);

/** `kata-ts <args>` from the sources; exit code and output. */
async function kataTs(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return execFileAsync(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', ...args], { cwd: packageRoot() }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
  );
}

describe("the runtime's mount namespace", () => {
  let dir = '';
  let file = '';
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ktns-'));
    file = path.join(dir, 'ns', 'mnt');
  });
  afterEach(async () => {
    await until('the namespace to be removable', async (note) => {
      const removal = await removeMountNamespace(file);
      note(removal);
      return removal.users.length === 0 ? true : undefined;
    });
    await releaseSharedMounts(dir, silentLogger());
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('is created once by concurrent callers, bound at the file on a private bind of its directory, and does not hold itself', async () => {
    const made = await Promise.all([1, 2, 3].map(() => ensureMountNamespace(file, silentLogger())));
    expect(made.filter((m) => m.created)).toHaveLength(1);
    expect(new Set(made.map((m) => m.id.ino)).size).toBe(1);
    expect(await boundNamespace(file)).toEqual(made[0]!.id);
    expect(namespaceOf()).not.toEqual(made[0]!.id);
    const host = await hostMountinfo();
    expect(mountLine(host, path.join(dir, 'ns'))).not.toMatch(/ shared:/);
    expect(mountLine(host, file)).toMatch(/ - nsfs /);
    // Inside, the file is the plain file it was when the namespace was made.
    expect(mountLine(await readNamespaceMountinfo(file), file)).toBeUndefined();
    expect((await ensureMountNamespace(file, silentLogger())).created).toBe(false);
  });

  it.skipIf(os.cpus().length < 2)(
    'is made from a namespace made on any CPU (namespace ids come in per-CPU batches: binding one with a lower id fails)',
    async () => {
      const script = [
        `const m = await import(${JSON.stringify(path.join(packageRoot(), 'src/runtime/mount-namespace.ts'))});`,
        `const l = await import(${JSON.stringify(path.join(packageRoot(), 'src/common/logger.ts'))});`,
        'const r = await m.ensureMountNamespace(process.argv[1], l.silentLogger());',
        'process.stdout.write(String(r.created));',
      ].join('\n');
      const all = `0-${os.cpus().length - 1}`;
      for (const [i, cpu] of [0, 1, 0, 1].entries()) {
        // The outer namespace is made on one CPU; the daemon may then run on any.
        const { stdout } = await execFileAsync(
          'taskset',
          [
            '--cpu-list',
            String(cpu),
            'unshare',
            '--mount',
            '--propagation',
            'private',
            '--',
            'taskset',
            '--cpu-list',
            all,
            process.execPath,
            '--import',
            'tsx',
            '--input-type=module',
            '-e',
            script,
            path.join(dir, `try${i}`, 'mnt'),
          ],
          { cwd: packageRoot() },
        );
        expect(stdout).toBe('true');
      }
    },
  );

  it("in a shared tree, the host's later mounts reach it and none of its own leave; it cannot go while a process is inside", async () => {
    // What systemd makes of a host: shared mounts (here only the test's own directory).
    await execFileAsync('mount', ['--bind', dir, dir]);
    await execFileAsync('mount', ['--make-shared', dir]);
    const { id } = await ensureMountNamespace(file, silentLogger());
    await fsp.mkdir(path.join(dir, 'later'));
    await fsp.mkdir(path.join(dir, 'ours'));
    await execFileAsync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'ktns-host', path.join(dir, 'later')]);
    const inside = insideCommand(
      file,
      id,
      dir,
      { command: 'sh', args: ['-c', `mount -t tmpfs -o size=1m ktns-ours ours && exec sleep 60`] },
      false,
    );
    const sleeper = spawn(inside.command, inside.args, { env: { ...process.env, ...inside.env }, stdio: 'ignore' });
    try {
      await until('the mount made inside', async () =>
        mountLine(await readNamespaceMountinfo(file), path.join(dir, 'ours')) !== undefined ? true : undefined,
      );
      const nsTable = await readNamespaceMountinfo(file);
      expect(mountLine(nsTable, path.join(dir, 'later'))).toMatch(/ktns-host/);
      expect(mountLine(await hostMountinfo(), path.join(dir, 'ours'))).toBeUndefined();
      expect(namespaceOf(sleeper.pid!)).toEqual(id);
      // The sleeper is in it: nothing changes.
      expect(await removeMountNamespace(file)).toEqual({ removed: false, users: [sleeper.pid] });
      expect(await boundNamespace(file)).toEqual(id);
    } finally {
      sleeper.kill('SIGKILL');
      await new Promise((r) => sleeper.once('exit', r));
    }
    expect(await removeMountNamespace(file)).toEqual({ removed: true, users: [] });
    await expect(fsp.stat(path.join(dir, 'ns'))).rejects.toMatchObject({ code: 'ENOENT' });
    // Left: the test's own bind and tmpfs, nothing of the namespace.
    expect(mountsUnder(await hostMountinfo(), dir).sort()).toEqual([dir, path.join(dir, 'later')].sort());
  });

  it('kata-ts serve runs the daemon inside; a restart enters the same one; kata-ts mount-namespace shows and removes it', async () => {
    const socketPath = path.join(dir, 'k.sock');
    const configPath = path.join(dir, 'config.json');
    const logFile = path.join(dir, 'daemon.log');
    await fsp.writeFile(
      configPath,
      JSON.stringify({
        socketPath,
        stateDir: path.join(dir, 'state'),
        metricsAddress: null,
        cgroupDriver: 'cgroupfs',
        network: { mode: 'none' },
        logLevel: 'info',
        mountNamespacePath: file,
      }),
    );
    let daemon = await spawnDaemon(configPath, socketPath, logFile);
    try {
      const id = await boundNamespace(file);
      expect(id).toBeDefined();
      // The daemon is the child of the process started here, inside; that process stays outside.
      expect(daemon.pid).not.toBe(daemon.child.pid);
      expect(namespaceOf(daemon.pid)).toEqual(id);
      expect(namespaceOf(daemon.child.pid!)).toEqual(namespaceOf());
      // The state dir's lock names the daemon itself.
      expect((await fsp.readFile(path.join(dir, 'state', 'daemon.lock'), 'utf8')).split(' ')[0]).toBe(String(daemon.pid));

      const status = await kataTs(['mount-namespace', 'status', '--config', configPath]);
      expect(status.code).toBe(0);
      expect(status.stdout).toContain(`${file}: mnt:[${id!.ino}]`);
      expect(status.stdout).toContain(`${daemon.pid} (`);
      const refused = await kataTs(['mount-namespace', 'remove', '--config', configPath]);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain(`${daemon.pid} (`);
      expect(await boundNamespace(file)).toEqual(id);

      // SIGTERM to the process a user started reaches the daemon: a clean stop, exit 0.
      const exit = new Promise<number | null>((resolve) => daemon.child.once('exit', (code) => resolve(code)));
      await daemon.stop();
      expect(await exit).toBe(0);
      expect(readProcStat(daemon.pid)).toBeUndefined();

      // Started again: the same namespace. Killing the outer process takes the daemon with it.
      daemon = await spawnDaemon(configPath, socketPath, logFile);
      expect(namespaceOf(daemon.pid)).toEqual(id);
      const inner = { pid: daemon.pid, ticks: readProcStat(daemon.pid)!.startTimeTicks };
      daemon.child.kill('SIGKILL');
      await until('the daemon to die with its parent', async () => (isSameLiveProcess(inner.pid, inner.ticks) ? undefined : true));
    } finally {
      await daemon.kill();
    }
    const removed = await kataTs(['mount-namespace', 'remove', '--config', configPath]);
    expect([removed.code, removed.stdout]).toEqual([0, `${file}: removed\n`]);
    expect(await boundNamespace(file)).toBeUndefined();
    expect((await kataTs(['mount-namespace', '--config', configPath])).stdout).toContain('not created yet');
  });
});
