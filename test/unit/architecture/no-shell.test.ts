/**
 * No request field reaches a shell: every process kata-ts (host and guest agent) starts is started
 * with spawn/execFile and an argument array, never `exec`/`execSync` or `shell: true`. The files
 * that start processes are listed: a new one fails here until it is audited and added, with what
 * its arguments are made of.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

/** Audited: where each argv comes from. Request fields appear only as whole arguments, never parsed by a shell. */
const AUDITED: Record<string, string> = {
  'guest/agent/containers/reaper.ts': 'reaper + crun argv built from agent paths and kata-ts container ids',
  'guest/agent/containers/runtime.ts': 'crun argv: fixed verbs, file paths under the agent state dir, container ids',
  'guest/agent/network.ts': 'busybox ip: the NIC found by MAC, addresses and routes CNI returned, in argument arrays',
  'guest/agent/pods.ts': 'mount/umount of the pod shm (size a number), pause with the pod id and a validated hostname',
  'guest/agent/reseed.ts': 'kata-ts-reseed with the host time as two validated integers; the entropy on stdin',
  'guest/agent/secret-volumes.ts':
    "mount/umount of a container's secret tmpfs: fixed options, a size in bytes, a directory named by a checked container id",
  'src/broker/state.ts': 'broker init: openssl req with fixed arguments and SANs checked by parseSans (DNS names, IP addresses)',
  'src/hypervisor/confine-probe.ts': 'doctor probes: the configured QEMU with a fixed -sandbox value and QMP on stdin; setpriv --version',
  'src/hypervisor/launcher.ts':
    'QEMU argv from the pure plan (ids, paths under the state dir, host inventory), after nsenter --net/--root and setpriv with numeric ids (vmmLaunchCommand)',
  'src/hypervisor/virtiofsd.ts': 'virtiofsd argv: socket and shared dir under the state dir',
  'src/images/overlay-probe.ts': 'mknod/setfattr/mount/umount of fixed names in a fresh .probe-<random> dir of the layer store, after "--"',
  'src/images/rootfs.ts':
    'mount -t overlay with planned options (l/<n>, upper, work relative to the container rootfs dir as cwd); mountpoint/umount of <dir>/merged after "--"',
  'src/images/snapshot.ts': 'cp between content-addressed store paths',
  'src/images/unpack-applier.ts':
    'mkfifo/mknod (also the 0/0 whiteout device) and setfattr trusted.overlay.opaque after "--" on paths resolved inside the unpack root',
  'src/install/probe.ts': 'containerd --version: the binary named by --containerd-binary (or on PATH), a fixed argument',
  'src/network/cni-exec.ts': 'CNI plugins: the binary found in cniBinDirs, the config on stdin, pod metadata only as CNI_ARGS env values',
  'src/network/wiring.ts':
    'ip/tc argv, or after nsenter --net=<a joined namespace: an absolute, normalised path> --: the pod netns name, fixed TAP name, the CNI interface name, numeric MTU',
  'src/runtime/container/shared-dir.ts': 'mount/umount: sources pinned as /proc/self/fd/N, targets under the shared dir, "--" before paths',
  'src/runtime/gather-facts.ts': 'fixed version probes of configured binaries',
  'src/runtime/mount-namespace.ts':
    'mount/umount/unshare/nsenter/setpriv/env -C/cat: the configured namespace file and its directory after "--" or as --mount=, the program\'s own argv after "--"',
  'src/runtime/sandbox/jail.ts':
    'mount --all --fstab <a file under the state dir, fields escaped>; cp -a --parents of fixed /dev names and vfio/<group number> after "--"',
  'src/runtime/sandbox/shared-dir.ts': 'mount/umount of the sandbox shared dir (a path under the state dir)',
  'src/shim/node-output-holder.ts': "the relay binary with --hold and a container id, the container's FIFOs as its stdout and stderr",
  'src/shim/port-forward.ts':
    "nsenter --net=<the pod's namespace, containerd's path> -- kata-ts-portfwd --socket <under the pod state dir>; the same nsenter -- iptables with a fixed rule (numbers only) or the listed rules carrying our comment",
  'src/shim/rootfs.ts':
    "mount/umount: containerd's rootfs mounts (overlay or bind only, options checked for commas) after '--', at <bundle>/rootfs",
  'src/shim/main.ts': "this shim binary again, detached, with delete's own arguments and the action cleanup",
  'src/shim/task-output.ts':
    "mkfifo -m 600 -- <the task's FIFOs under the pod state dir>; the logging binary of a binary:// stdout (an absolute, normalised path) with the URI's query keys and values as whole arguments, env CONTAINER_ID/CONTAINER_NAMESPACE only",
  'src/shim/start.ts':
    "this shim binary again (its own node, flags and script) with containerd's flags as whole arguments and the action serve",
  'src/tpm/ca.ts':
    'openssl req with a fixed argv: paths in the CA dir (validated: no whitespace), a subject of [A-Za-z0-9.-] and fixed words',
  'src/tpm/swtpm.ts':
    'swtpm_setup and swtpm (through vmmLaunchCommand): configured binaries, validated absolute paths without commas as whole arguments',
};

function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => path.join(e.parentPath, e.name));
}

describe('no shell anywhere', () => {
  const root = packageRoot();
  const files = [...tsFiles(path.join(root, 'src')), ...tsFiles(path.join(root, 'guest'))].filter((f) => !f.includes('/generated/'));
  const starting = files.filter((f) => /from 'node:child_process'/.test(readFileSync(f, 'utf8')));

  it('only audited files start processes', () => {
    expect(starting.map((f) => path.relative(root, f)).sort()).toEqual(Object.keys(AUDITED).sort());
  });

  it.each(Object.keys(AUDITED))('%s uses spawn/execFile with an argument array, never a shell', (rel) => {
    const text = readFileSync(path.join(root, rel), 'utf8');
    const imported = /import\s*\{([^}]*)\}\s*from 'node:child_process'/.exec(text)?.[1] ?? '';
    for (const name of imported.split(',').map(
      (n) =>
        n
          .trim()
          .replace(/^type\s+/, '')
          .split(/\s+as\s+/)[0]!,
    )) {
      if (name === '') continue;
      expect(['spawn', 'execFile', 'ChildProcess', 'SpawnOptions']).toContain(name);
    }
    expect(text).not.toMatch(/shell\s*:\s*(true|'|")/);
    expect(text).not.toMatch(/\bexecSync\s*\(|\bspawnSync\s*\(/);
  });
});
