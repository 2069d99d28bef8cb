/**
 * Runs the guest agent's container core against the real crun on THIS host, safely.
 *
 * The host has hybrid cgroups (v1 + unified), which crun refuses, and its cgroups are not ours. So:
 * crun runs with `--cgroup-manager=disabled` (it creates, moves and writes no cgroup) and every
 * crun call enters a private mount namespace whose /sys/fs/cgroup is an empty tmpfs (crun checks the
 * cgroup mode even when disabled). A holder process keeps that namespace alive; the tests end it by
 * PID. The containers get their own pid, mount, ipc, uts and network namespaces from the spec.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { OciSpec } from '../../../guest/agent/containers/types.js';
import { packageRoot } from '../../../src/common/paths.js';

export const HAVE_CRUN = spawnSync('crun', ['--version']).status === 0 && spawnSync('gcc', ['--version']).status === 0;

const APPLETS = ['sh', 'sleep', 'cat', 'echo', 'head', 'yes', 'tty', 'stty', 'kill', 'true', 'ls', 'dd', 'wc'];

export interface HostCrun {
  dir: string;
  /** With `cgroup2`: the private cgroup (host path) that crun's /sys/fs/cgroup shows as its root. */
  cgroupRoot: string | undefined;
  rootfs: string;
  reaperPath: string;
  command: string[];
  stateDir: string;
  bundlesDir: string;
  close(): void;
}

const UNIFIED = '/sys/fs/cgroup/unified';

/**
 * Builds the reaper, a busybox rootfs and the private mount namespace; close() undoes all.
 *
 * With `cgroup2`, crun's /sys/fs/cgroup is a cgroup2 mount rooted at a private cgroup this
 * helper creates in the host's unified hierarchy (`kata-ts-test-<random>/ns-root`): the holder
 * joins it, unshares its cgroup namespace and mounts cgroup2 (the mount's root is the
 * namespace's root), then is parked in a sibling so ns-root has no process of its own and can
 * delegate. Every write of crun and of the code under test lands inside that private tree,
 * which close() removes deepest first. The unified hierarchy here offers no controllers
 * (they are bound to v1), so cgroup.procs, cpu.stat and the cgroup layout are what it can test.
 */
export async function startHostCrun(options: { cgroup2?: boolean } = {}): Promise<HostCrun> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-h6-'));
  const reaperPath = path.join(dir, 'kata-ts-reaper');
  execFileSync('gcc', ['-static', '-Os', '-o', reaperPath, path.join(packageRoot(), 'guest/agent/containers/native/reaper.c')]);
  const rootfs = path.join(dir, 'rootfs');
  for (const d of ['bin', 'proc', 'dev', 'sys', 'tmp', 'etc']) mkdirSync(path.join(rootfs, d), { recursive: true });
  copyFileSync('/usr/bin/busybox', path.join(rootfs, 'bin/busybox'));
  for (const a of APPLETS) symlinkSync('busybox', path.join(rootfs, 'bin', a));
  let priv: string | undefined;
  let holderArgv = [
    'unshare',
    '--mount',
    '--propagation',
    'private',
    'sh',
    '-c',
    'mount -t tmpfs tmpfs /sys/fs/cgroup && echo ready && exec sleep 1000000',
  ];
  if (options.cgroup2) {
    priv = path.join(UNIFIED, `kata-ts-test-${randomBytes(4).toString('hex')}`);
    mkdirSync(path.join(priv, 'ns-root'), { recursive: true });
    mkdirSync(path.join(priv, 'parking'));
    const inner = 'mount -t cgroup2 none /sys/fs/cgroup && echo ready && exec sleep 1000000';
    holderArgv = [
      'sh',
      '-c',
      `echo $$ > ${priv}/ns-root/cgroup.procs && exec unshare --cgroup --mount --propagation private sh -c '${inner}'`,
    ];
  }
  const holder = spawn(holderArgv[0]!, holderArgv.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    holder.stdout.once('data', () => resolve());
    holder.once('exit', (code) => reject(new Error(`namespace holder exited with ${code}`)));
  });
  if (priv) writeFileSync(path.join(priv, 'parking/cgroup.procs'), String(holder.pid));
  const stateDir = path.join(dir, 'state');
  const bundlesDir = path.join(dir, 'bundles');
  return {
    dir,
    cgroupRoot: priv ? path.join(priv, 'ns-root') : undefined,
    rootfs,
    reaperPath,
    command: ['nsenter', `--mount=/proc/${holder.pid}/ns/mnt`, 'crun'],
    stateDir,
    bundlesDir,
    close() {
      holder.kill('SIGKILL');
      killStartedUnder(dir);
      rmSync(dir, { recursive: true, force: true });
      if (priv) removeCgroupTree(priv);
    },
  };
}

/**
 * SIGKILLs every process whose command line names `dir` (this harness's unique temp dir): reapers
 * and containers of a test that ended without deleting them (a failed assertion, a delete that
 * threw), which would otherwise outlive the run.
 */
function killStartedUnder(dir: string): void {
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry) || Number(entry) === process.pid) continue;
    let cmdline = '';
    try {
      cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    if (!cmdline.includes(`${dir}/`)) continue;
    try {
      process.kill(Number(entry), 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/** Removes a cgroup tree deepest first, waiting briefly for dying processes to leave. */
function removeCgroupTree(dir: string): void {
  for (const entry of readdirSync(dir, { withFileTypes: true })) if (entry.isDirectory()) removeCgroupTree(path.join(dir, entry.name));
  for (let attempt = 0; ; attempt++) {
    try {
      rmdirSync(dir);
      return;
    } catch (err) {
      if (attempt >= 50) throw err;
      execFileSync('sleep', ['0.1']);
    }
  }
}

/** A minimal OCI spec like the host's generator produces. */
export function testSpec(args: string[], extra: { tty?: boolean; cgroupsPath?: string } = {}): OciSpec {
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: extra.tty ?? false,
      user: { uid: 0, gid: 0 },
      args,
      env: ['PATH=/bin', 'TERM=xterm'],
      cwd: '/',
      noNewPrivileges: true,
    },
    root: { path: 'rootfs', readonly: true },
    hostname: 'h6',
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc' },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      {
        destination: '/dev/pts',
        type: 'devpts',
        source: 'devpts',
        options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620'],
      },
      { destination: '/tmp', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev'] },
    ],
    linux: {
      ...(extra.cgroupsPath ? { cgroupsPath: extra.cgroupsPath } : {}),
      namespaces: [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }],
      maskedPaths: ['/proc/kcore'],
      readonlyPaths: ['/proc/sys'],
    },
  };
}
