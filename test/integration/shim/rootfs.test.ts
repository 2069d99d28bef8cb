/**
 * containerd's rootfs mounts for real: an overlay like its overlayfs snapshotter's (a read-only
 * lower layer, an upper and work dir) and a bind mount like the native snapshotter's, mounted at
 * `<bundle>/rootfs` and unmounted again, twice (unmounting is idempotent). Everything lives in a
 * temporary directory, unmounted and removed afterwards also when a test fails.
 */
import { spawn } from 'node:child_process';
import { constants, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { adoptCallerRoot, CALLER_ROOT_ENV, callerPath } from '../../../src/common/caller-root.js';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { mountRootfs, requireSourcesSeen, unmountRootfs } from '../../../src/shim/rootfs.js';

const root = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-rootfs-'));

afterAll(async () => {
  await unmountRootfs(root).catch(() => undefined);
  rmSync(root, { recursive: true, force: true });
});

function mounted(dir: string): string[] {
  return mountsUnder(readFileSync('/proc/self/mountinfo', 'utf8'), dir);
}

describe('rootfs mounts at <bundle>/rootfs', () => {
  it('mounts an overlay snapshot (writes go to the upper dir) and unmounts it, idempotently', async () => {
    const snap = path.join(root, 'snapshots');
    for (const d of ['1/fs', '2/fs', '2/work']) mkdirSync(path.join(snap, d), { recursive: true });
    writeFileSync(path.join(snap, '1/fs/from-image'), 'layer\n');
    const target = path.join(root, 'bundle-overlay', 'rootfs');
    await mountRootfs(
      [
        {
          type: 'overlay',
          source: 'overlay',
          options: ['index=off', `workdir=${snap}/2/work`, `upperdir=${snap}/2/fs`, `lowerdir=${snap}/1/fs`],
        },
      ],
      target,
    );
    expect(mounted(target)).toEqual([target]);
    expect(readFileSync(path.join(target, 'from-image'), 'utf8')).toBe('layer\n');
    writeFileSync(path.join(target, 'written'), 'new\n');
    expect(readdirSync(path.join(snap, '2/fs'))).toEqual(['written']);
    expect(await unmountRootfs(target)).toEqual([target]);
    expect(mounted(target)).toEqual([]);
    expect(readdirSync(target)).toEqual([]);
    expect(await unmountRootfs(target)).toEqual([]);
  });

  it('bind-mounts a directory read-only and unmounts it', async () => {
    const source = path.join(root, 'native', 'fs');
    mkdirSync(source, { recursive: true });
    writeFileSync(path.join(source, 'file'), 'x');
    const target = path.join(root, 'bundle-bind', 'rootfs');
    await mountRootfs([{ type: 'bind', source, options: ['ro'] }], target);
    expect(readFileSync(path.join(target, 'file'), 'utf8')).toBe('x');
    expect(() => writeFileSync(path.join(target, 'other'), 'y')).toThrow(/EROFS/);
    expect(await unmountRootfs(target)).toEqual([target]);
    expect(mounted(target)).toEqual([]);
  });

  it("a snapshot directory only containerd's mount namespace sees is refused, naming the field; one both see is accepted", async () => {
    // A tmpfs mounted in a mount namespace of its own (standing for containerd's on a private
    // root): this one sees an empty directory there. Its root is adopted as the caller's.
    const other = path.join(root, 'caller-snapshots');
    const seen = path.join(root, 'snapshots-both', '1', 'fs');
    mkdirSync(other);
    mkdirSync(seen, { recursive: true });
    const script = `mount -t tmpfs kata-ts-test-caller ${other} && mkdir -p ${other}/1/fs && echo ready && exec sleep 600`;
    const holder = spawn('unshare', ['--mount', '--propagation', 'private', '--', 'sh', '-c', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      await new Promise<void>((resolve, reject) => {
        holder.stdout.once('data', () => resolve());
        holder.once('exit', (code) => reject(new Error(`the namespace holder exited (${code})`)));
      });
      adoptCallerRoot({ [CALLER_ROOT_ENV]: String(openSync(`/proc/${holder.pid}/root`, constants.O_RDONLY | constants.O_DIRECTORY)) });
      const overlay = (lower: string) => [{ type: 'overlay', source: 'overlay', options: ['index=off', `lowerdir=${lower}`] }];
      expect(() => requireSourcesSeen(overlay(`${seen}:${other}/1/fs`), callerPath)).toThrow(
        expect.objectContaining({ reason: 'SHIM_ROOTFS_NOT_SEEN', details: { field: 'rootfs[0].options[1]', path: `${other}/1/fs` } }),
      );
      expect(() => requireSourcesSeen(overlay(seen), callerPath)).not.toThrow();
    } finally {
      holder.kill('SIGKILL');
    }
  });

  it('unmounting a bundle that never had a rootfs is fine', async () => {
    expect(await unmountRootfs(path.join(root, 'never', 'rootfs'))).toEqual([]);
  });
});
