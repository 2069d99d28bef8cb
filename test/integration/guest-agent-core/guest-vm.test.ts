/**
 * The container core inside a real pod VM (one TCG boot, about 10 s): the guest kernel and the
 * guest image (node, crun) that scripts/build-guest.sh installed, an initramfs of this test's own
 * (the installed one plus the reaper, a busybox container rootfs and guest-vm-script.ts bundled by
 * esbuild) whose init mounts cgroup2 alone, runs the script and powers off. What only a pure
 * cgroup2 guest shows: crun's cgroupfs manager with limits, OOM kill -> 137 + oomKilled, stats,
 * `kill --all`; and whether pivot_root works from the initramfs root.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

const GUEST = '/usr/local/share/kata-ts/guest';
const READY =
  ['vmlinuz', 'initramfs.cpio.gz', 'guest.img'].every((f) => existsSync(path.join(GUEST, f))) &&
  spawnSync('qemu-system-x86_64', ['--version']).status === 0 &&
  spawnSync('gcc', ['--version']).status === 0;

const INIT = `#!/bin/sh
export PATH=/bin:/sbin:/usr/bin
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
while read -r ko; do case "$ko" in '' | '#'*) continue ;; esac; insmod "$ko" 2>/dev/null; done </etc/kata-ts/modules.load
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mount -t erofs -o ro /dev/vda /usr
HOME=/run /usr/bin/node /h6/test.mjs
poweroff -f
`;

function buildInitramfs(dir: string): string {
  const tree = path.join(dir, 'tree');
  mkdirSync(tree);
  execFileSync('sh', ['-c', 'cd "$1" && zcat "$2" | cpio -idm --quiet', 'sh', tree, path.join(GUEST, 'initramfs.cpio.gz')]);
  const h6 = path.join(tree, 'h6');
  for (const d of ['bin', 'proc', 'dev', 'sys', 'tmp']) mkdirSync(path.join(h6, 'rootfs', d), { recursive: true });
  copyFileSync('/usr/bin/busybox', path.join(h6, 'rootfs/bin/busybox'));
  for (const a of ['sh', 'sleep', 'awk', 'true']) symlinkSync('busybox', path.join(h6, 'rootfs/bin', a));
  execFileSync('gcc', [
    '-static',
    '-Os',
    '-o',
    path.join(h6, 'kata-ts-reaper'),
    path.join(packageRoot(), 'guest/agent/containers/native/reaper.c'),
  ]);
  execFileSync(path.join(packageRoot(), 'node_modules/.bin/esbuild'), [
    path.join(packageRoot(), 'test/integration/guest-agent-core/guest-vm-script.ts'),
    '--bundle',
    '--platform=node',
    '--format=esm',
    '--target=node20',
    `--outfile=${path.join(h6, 'test.mjs')}`,
    '--log-level=warning',
  ]);
  writeFileSync(path.join(tree, 'init'), INIT);
  chmodSync(path.join(tree, 'init'), 0o755);
  const out = path.join(dir, 'initramfs.cpio.gz');
  execFileSync('sh', ['-c', 'cd "$1" && find . | cpio -o -H newc --quiet | gzip -1 > "$2"', 'sh', tree, out]);
  return out;
}

describe.skipIf(!READY)('container core in a real guest (cgroup2 only, crun cgroupfs)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-h6-vm-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('OOM kill reads as 137 + oomKilled, exit 3 with CPU stats, kill --all; pivot_root fails from the initramfs', () => {
    const initramfs = buildInitramfs(dir);
    const run = spawnSync(
      'qemu-system-x86_64',
      [
        ...['-machine', 'q35', '-accel', 'tcg', '-m', '1024', '-smp', '1', '-nographic', '-no-reboot'],
        ...['-kernel', path.join(GUEST, 'vmlinuz'), '-initrd', initramfs, '-append', 'console=ttyS0 panic=-1 quiet'],
        ...['-drive', `file=${path.join(GUEST, 'guest.img')},if=none,id=img,format=raw,readonly=on`],
        ...['-device', 'virtio-blk-pci,drive=img,serial=kata-ts-guest'],
      ],
      { encoding: 'utf8', timeout: 200_000, maxBuffer: 16 << 20 },
    );
    const line = /H6RESULT (.*)/.exec(run.stdout)?.[1];
    expect(line, run.stdout.slice(-3000)).toBeDefined();
    const result = JSON.parse(line!);
    expect(result.initramfsRoot).toBe(true);
    expect(result.pivotError.details.runtimeLog).toContain('pivot_root');
    const r = result.noPivot;
    expect(r.oom).toMatchObject({ exitCode: 137, signal: 9, oomKilled: true });
    expect(r.oomStats).toMatchObject({ oomKills: '1', memoryLimitBytes: String(16 * 1024 * 1024) });
    // The child's kill was told while the init ran (`oom 1 running`), before the init's exit 0.
    expect(r.childEvents).toEqual(['started', 'oom 1 running', 'exited']);
    expect(r.child).toMatchObject({ exitCode: 0, oomKilled: true });
    expect(r.three).toMatchObject({ exitCode: 3, oomKilled: false });
    expect(BigInt(r.threeStats.cpuUsageNs)).toBeGreaterThan(0n);
    expect(r.all).toMatchObject({ exitCode: 137, signal: 9 });
  });
});
