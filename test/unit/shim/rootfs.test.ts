import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { isKataError } from '../../../src/common/errors.js';
import { mountRootfs, planRootfsMounts, requireSourcesSeen } from '../../../src/shim/rootfs.js';

const TARGET = '/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs';

function refusal(fn: () => unknown): { kind: string; reason: string; field: unknown } | undefined {
  try {
    fn();
  } catch (err) {
    if (isKataError(err)) return { kind: err.kind, reason: err.reason, field: err.details?.field };
    throw err;
  }
  return undefined;
}

describe('planRootfsMounts', () => {
  it("mounts the overlay snapshotter's mount with its options, after --", () => {
    const overlay = {
      type: 'overlay',
      source: 'overlay',
      options: ['index=off', 'workdir=/s/2/work', 'upperdir=/s/2/fs', 'lowerdir=/s/1/fs'],
    };
    expect(planRootfsMounts([overlay], TARGET)).toEqual([
      ['mount', '-t', 'overlay', '-o', 'index=off,workdir=/s/2/work,upperdir=/s/2/fs,lowerdir=/s/1/fs', '--', 'overlay', TARGET],
    ]);
    expect(planRootfsMounts([{ type: 'overlay', source: '', options: [] }], TARGET)).toEqual([
      ['mount', '-t', 'overlay', '--', 'overlay', TARGET],
    ]);
  });

  it('bind-mounts recursively unless bind is asked for, keeping ro', () => {
    expect(planRootfsMounts([{ type: 'bind', source: '/snap/1/fs', options: ['ro'] }], TARGET)).toEqual([
      ['mount', '-o', 'rbind,ro', '--', '/snap/1/fs', TARGET],
    ]);
    expect(planRootfsMounts([{ type: 'bind', source: '/snap/1/fs', options: ['bind', 'rw'] }], TARGET)).toEqual([
      ['mount', '-o', 'bind,rw', '--', '/snap/1/fs', TARGET],
    ]);
  });

  it('an empty list mounts nothing', () => {
    expect(planRootfsMounts([], TARGET)).toEqual([]);
  });

  it('refuses anything else with INVALID_ARGUMENT naming the field', () => {
    const base = { type: 'overlay', source: 'overlay', options: [] as string[] };
    expect(refusal(() => planRootfsMounts([base, { type: 'ext4', source: '/dev/sda1', options: [] }], TARGET))).toEqual({
      kind: 'invalid',
      reason: 'SHIM_ROOTFS_UNSUPPORTED',
      field: 'rootfs[1].type',
    });
    expect(refusal(() => planRootfsMounts([{ ...base, options: ['lowerdir=/a', 'upperdir=/b,c'] }], TARGET))?.field).toBe(
      'rootfs[0].options[1]',
    );
    expect(refusal(() => planRootfsMounts([{ ...base, target: 'sub' }], TARGET))?.field).toBe('rootfs[0].target');
    expect(refusal(() => planRootfsMounts([{ type: 'bind', source: 'relative', options: [] }], TARGET))?.field).toBe('rootfs[0].source');
    expect(refusal(() => planRootfsMounts([base], 'rel/rootfs'))?.reason).toBe('SHIM_ROOTFS_UNSUPPORTED');
  });
});

describe('mountRootfs', () => {
  it('undoes the mounts made before one that fails', async () => {
    const ran: string[][] = [];
    const run = async (argv: readonly string[]) => {
      ran.push([...argv]);
      if (argv.includes('/b')) throw new Error('mount failed');
    };
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-rootfs-plan-'));
    const target = path.join(dir, 'rootfs');
    await expect(
      mountRootfs(
        [
          { type: 'bind', source: '/a', options: [] },
          { type: 'bind', source: '/b', options: [] },
        ],
        target,
        run,
      ),
    ).rejects.toThrow('mount failed');
    expect(ran).toEqual([
      ['mount', '-o', 'rbind', '--', '/a', target],
      ['mount', '-o', 'rbind', '--', '/b', target],
      ['umount', '--', target],
    ]);
    rmSync(dir, { recursive: true, force: true });
  });
});

describe('requireSourcesSeen (pure given the resolver)', () => {
  /** Paths under /c are containerd's only (another file here); everything else is the same file. */
  const resolve = (p: string) => (p.startsWith('/c/') ? `/proc/9/fd/5${p}` : p);
  const refusal = (mounts: Parameters<typeof requireSourcesSeen>[0]) => {
    try {
      requireSourcesSeen(mounts, resolve);
    } catch (err) {
      if (isKataError(err)) return { kind: err.kind, reason: err.reason, field: err.details?.field, path: err.details?.path };
      throw err;
    }
    return undefined;
  };

  it('accepts directories that are the same here (a shared root; a private root for what was there before)', () => {
    const overlay = {
      type: 'overlay',
      source: 'overlay',
      options: ['index=off', 'workdir=/s/3/work', 'upperdir=/s/3/fs', 'lowerdir=/s/2/fs:/s/1/fs'],
    };
    expect(refusal([overlay, { type: 'bind', source: '/s/native/1', options: ['rbind'] }])).toBeUndefined();
  });

  it("names the overlay option or the bind's source whose directory is containerd's only", () => {
    expect(
      refusal([{ type: 'overlay', source: 'overlay', options: ['index=off', 'upperdir=/s/3/fs', 'lowerdir=/s/2/fs:/c/1/fs'] }]),
    ).toEqual({
      kind: 'precondition',
      reason: 'SHIM_ROOTFS_NOT_SEEN',
      field: 'rootfs[0].options[2]',
      path: '/c/1/fs',
    });
    expect(refusal([{ type: 'bind', source: '/c/native/1', options: [] }])).toMatchObject({
      field: 'rootfs[0].source',
      path: '/c/native/1',
    });
    // Relative and escaped entries are the mount's business.
    expect(refusal([{ type: 'overlay', source: 'overlay', options: ['lowerdir=c/1:/c\\:x'] }])).toBeUndefined();
  });
});
