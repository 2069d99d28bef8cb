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
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { OciSpec } from '../../../guest/agent/containers/types.js';
import { packageRoot } from '../../../src/common/paths.js';

export const HAVE_CRUN = spawnSync('crun', ['--version']).status === 0 && spawnSync('gcc', ['--version']).status === 0;

const APPLETS = ['sh', 'sleep', 'cat', 'echo', 'head', 'yes', 'tty', 'stty', 'kill', 'true', 'ls', 'dd', 'wc'];

export interface HostCrun {
  dir: string;
  rootfs: string;
  reaperPath: string;
  command: string[];
  stateDir: string;
  bundlesDir: string;
  close(): void;
}

/** Builds the reaper, a busybox rootfs and the private mount namespace; close() undoes all. */
export async function startHostCrun(): Promise<HostCrun> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-h6-'));
  const reaperPath = path.join(dir, 'kata-ts-reaper');
  execFileSync('gcc', ['-static', '-Os', '-o', reaperPath, path.join(packageRoot(), 'guest/agent/containers/native/reaper.c')]);
  const rootfs = path.join(dir, 'rootfs');
  for (const d of ['bin', 'proc', 'dev', 'sys', 'tmp', 'etc']) mkdirSync(path.join(rootfs, d), { recursive: true });
  copyFileSync('/usr/bin/busybox', path.join(rootfs, 'bin/busybox'));
  for (const a of APPLETS) symlinkSync('busybox', path.join(rootfs, 'bin', a));
  const holder = spawn(
    'unshare',
    ['--mount', '--propagation', 'private', 'sh', '-c', 'mount -t tmpfs tmpfs /sys/fs/cgroup && echo ready && exec sleep 1000000'],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  await new Promise<void>((resolve, reject) => {
    holder.stdout.once('data', () => resolve());
    holder.once('exit', (code) => reject(new Error(`namespace holder exited with ${code}`)));
  });
  const stateDir = path.join(dir, 'state');
  const bundlesDir = path.join(dir, 'bundles');
  return {
    dir,
    rootfs,
    reaperPath,
    command: ['nsenter', `--mount=/proc/${holder.pid}/ns/mnt`, 'crun'],
    stateDir,
    bundlesDir,
    close() {
      holder.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A minimal OCI spec like the host's generator produces (no cgroupsPath: cgroups are disabled here). */
export function testSpec(args: string[], extra: { tty?: boolean } = {}): OciSpec {
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
      namespaces: [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }],
      maskedPaths: ['/proc/kcore'],
      readonlyPaths: ['/proc/sys'],
    },
  };
}
