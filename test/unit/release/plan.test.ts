/**
 * The release layout's pure parts: release ids, the layout's paths and link targets, the install
 * plan (nothing to do when installed, current and linked; refusals that change nothing), prune
 * and remove decisions, and the production dependency closure.
 */
import { describe, expect, it } from 'vitest';
import {
  BIN_LINKS,
  binLinkTarget,
  currentTarget,
  releaseId,
  releaseOfCurrentTarget,
  releaseOfDir,
  releasePaths,
  selfScript,
  validateReleaseId,
} from '../../../src/release/layout.js';
import { checkRemove, currentRelease, type LayoutState, planInstall, planPrune } from '../../../src/release/plan.js';
import { productionPackages } from '../../../src/release/tree.js';
import { thrown } from '../../helpers/kata-error.js';

const SHA = 'c0e24ce3f6771234567890abcdef1234567890abcdef1234567890abcdef1234';
const paths = releasePaths('/opt/kata-ts', '/usr/local/bin');

function linked(id: string): LayoutState {
  const bins: LayoutState['bins'] = {};
  for (const { name, target } of BIN_LINKS) bins[name] = { kind: 'link', target: binLinkTarget(paths, target) };
  return { releases: [id], current: { kind: 'link', target: currentTarget(id) }, bins };
}
const empty = (): LayoutState => ({ releases: [], current: { kind: 'missing' }, bins: {} });

describe('release ids and the layout', () => {
  it('an id is the version and 12 hex digits of the content hash; odd version characters become "_"', () => {
    expect(releaseId('0.1.0', SHA)).toBe('0.1.0-c0e24ce3f677');
    expect(releaseId('1.2.3-rc.1+build/7', SHA)).toBe('1.2.3-rc.1+build_7-c0e24ce3f677');
    expect(releaseId('', SHA)).toBe('unversioned-c0e24ce3f677');
    expect(thrown(() => releaseId('0.1.0', 'xyz')).reason).toBe('RELEASE_ID_INVALID');
  });

  it('ids that could escape releases/ or collide with an install under way are refused', () => {
    for (const bad of ['', '.', '..', '../x', 'a/b', '.incoming-x', '-x', 'x'.repeat(101)]) {
      expect(thrown(() => validateReleaseId(bad)).reason, bad).toBe('RELEASE_ID_INVALID');
    }
    expect(() => validateReleaseId('0.1.0-c0e24ce3f677')).not.toThrow();
  });

  it('relative prefixes are refused, naming the flag', () => {
    const err = thrown(() => releasePaths('opt/kata-ts', '/usr/local/bin'));
    expect([err.reason, err.message]).toEqual(['RELEASE_PATH_INVALID', '--prefix must be an absolute path, got "opt/kata-ts".']);
  });

  it('links are relative, so the same layout works seen under /host in a DaemonSet and on the node', () => {
    const host = releasePaths('/host/opt/kata-ts', '/host/usr/local/bin');
    expect(binLinkTarget(host, 'dist/native/kata-ts-shim-start')).toBe('../../../opt/kata-ts/current/dist/native/kata-ts-shim-start');
    expect(binLinkTarget(paths, 'bin/kata-ts.js')).toBe('../../../opt/kata-ts/current/bin/kata-ts.js');
    expect(currentTarget('r1')).toBe('releases/r1');
    expect(releaseOfCurrentTarget('releases/r1')).toBe('r1');
    expect(releaseOfCurrentTarget('/opt/kata-ts/releases/r1/')).toBe('r1');
    expect(releaseOfCurrentTarget('/work/main')).toBeUndefined();
  });

  it('a tree is a release when it is releases/<id>; a checkout has none', () => {
    expect(releaseOfDir('/opt/kata-ts/releases/0.1.0-c0e24ce3f677')).toEqual({
      id: '0.1.0-c0e24ce3f677',
      dir: '/opt/kata-ts/releases/0.1.0-c0e24ce3f677',
    });
    expect(releaseOfDir('/work/main')).toEqual({ id: null, dir: '/work/main' });
  });

  it("a child runs its parent's own tree under the name the parent was started as", () => {
    const tree = '/opt/kata-ts/releases/a';
    const has = (p: string) => p === `${tree}/bin/containerd-shim-kata-ts-cvm-v2`;
    expect(selfScript('/usr/local/bin/containerd-shim-kata-ts-cvm-v2', tree, has)).toBe(`${tree}/bin/containerd-shim-kata-ts-cvm-v2`);
    expect(selfScript('/usr/local/bin/other-name', tree, has)).toBeUndefined();
  });
});

describe('planInstall', () => {
  it('on an empty node: copy, point current, link the three programs', () => {
    const steps = planInstall(paths, empty(), 'r1');
    expect(steps.map((s) => s.kind)).toEqual(['copy', 'current', 'link', 'link', 'link']);
    expect(steps[1]).toEqual({ kind: 'current', id: 'r1', target: 'releases/r1', previous: null });
    expect(steps.filter((s) => s.kind === 'link').map((s) => s.path)).toEqual([
      '/usr/local/bin/kata-ts',
      '/usr/local/bin/containerd-shim-kata-ts-v2',
      '/usr/local/bin/containerd-shim-kata-ts-cvm-v2',
    ]);
  });

  it('the same release again: nothing to do', () => {
    expect(planInstall(paths, linked('r1'), 'r1')).toEqual([]);
  });

  it('an upgrade copies the new release and flips current only; links through current stay', () => {
    const steps = planInstall(paths, linked('r1'), 'r2');
    expect(steps).toEqual([
      { kind: 'copy', id: 'r2' },
      { kind: 'current', id: 'r2', target: 'releases/r2', previous: 'releases/r1' },
    ]);
  });

  it('a rollback to an installed release flips current without a copy; an unknown one is refused', () => {
    const state = { ...linked('r2'), releases: ['r1', 'r2'] };
    expect(planInstall(paths, state, 'r1', true)).toEqual([{ kind: 'current', id: 'r1', target: 'releases/r1', previous: 'releases/r2' }]);
    expect(thrown(() => planInstall(paths, state, 'r9', true)).reason).toBe('RELEASE_UNKNOWN');
  });

  it('a checkout link left by scripts/setup.sh is replaced, naming what it was', () => {
    const state = empty();
    state.bins['containerd-shim-kata-ts-v2'] = { kind: 'link', target: '/work/main/bin/containerd-shim-kata-ts-v2' };
    const step = planInstall(paths, state, 'r1').find((s) => s.kind === 'link' && s.name === 'containerd-shim-kata-ts-v2');
    expect(step).toMatchObject({ previous: '/work/main/bin/containerd-shim-kata-ts-v2' });
  });

  it('a file that is not a link, in the bin dir or as current, is refused: nothing of ours replaces it', () => {
    const bin = empty();
    bin.bins['kata-ts'] = { kind: 'other' };
    const err = thrown(() => planInstall(paths, bin, 'r1'));
    expect([err.reason, err.message]).toEqual([
      'RELEASE_BIN_NOT_LINK',
      '/usr/local/bin/kata-ts exists and is not a symlink; kata-ts replaces only its own links (remove it or choose another --bin-dir).',
    ]);
    expect(thrown(() => planInstall(paths, { ...empty(), current: { kind: 'other' } }, 'r1')).reason).toBe('RELEASE_CURRENT_NOT_LINK');
  });
});

describe('prune and remove', () => {
  const users = new Map([['r2', ['pod abc (k8s.io), shim pid 42']]]);

  it('keeps the current release and those in use (with their users), removes the rest', () => {
    expect(planPrune(['r3', 'r1', 'r2'], 'r3', users)).toEqual({
      remove: ['r1'],
      keep: [
        { id: 'r2', why: 'in-use', users: ['pod abc (k8s.io), shim pid 42'] },
        { id: 'r3', why: 'current', users: [] },
      ],
    });
    expect(planPrune(['r1', 'r2'], 'r1', new Map())).toEqual({ remove: ['r2'], keep: [{ id: 'r1', why: 'current', users: [] }] });
  });

  it('remove refuses an unknown, the current or a used release, each with its reason', () => {
    const releases = ['r1', 'r2', 'r3'];
    expect(thrown(() => checkRemove(paths, releases, 'r3', users, 'r9')).reason).toBe('RELEASE_UNKNOWN');
    expect(thrown(() => checkRemove(paths, releases, 'r3', users, 'r3')).reason).toBe('RELEASE_IS_CURRENT');
    const inUse = thrown(() => checkRemove(paths, releases, 'r3', users, 'r2'));
    expect([inUse.reason, inUse.message]).toEqual([
      'RELEASE_IN_USE',
      'release r2 is in use by 1 process(es): pod abc (k8s.io), shim pid 42.',
    ]);
    expect(() => checkRemove(paths, releases, 'r3', users, 'r1')).not.toThrow();
  });

  it('current is read from the link only when it names a release', () => {
    expect(currentRelease(linked('r1'))).toBe('r1');
    expect(currentRelease({ ...empty(), current: { kind: 'link', target: '/elsewhere' } })).toBeNull();
    expect(currentRelease(empty())).toBeNull();
  });
});

describe('productionPackages', () => {
  const tree: Record<string, { dependencies?: Record<string, string>; optionalDependencies?: Record<string, string> }> = {
    'node_modules/a': { dependencies: { b: '1', '@s/c': '1' } },
    'node_modules/b': {},
    'node_modules/@s/c': { dependencies: { b: '2' } },
    'node_modules/@s/c/node_modules/b': { dependencies: { d: '1' } },
    'node_modules/d': {},
    'node_modules/dev-only': {},
  };
  const read = async (rel: string) => tree[rel];

  it('follows dependencies as node resolves them, nested copies first; dev packages stay out', async () => {
    expect(await productionPackages({ dependencies: { a: '1' }, optionalDependencies: { missing: '1' } }, read)).toEqual([
      'node_modules/@s/c',
      'node_modules/@s/c/node_modules/b',
      'node_modules/a',
      'node_modules/b',
      'node_modules/d',
    ]);
  });

  it('a required dependency that is not installed is refused, naming it', async () => {
    const err = await productionPackages({ dependencies: { zz: '1' } }, read).catch((e: unknown) => e);
    expect(err).toMatchObject({
      reason: 'RELEASE_SOURCE_INCOMPLETE',
      message: 'the dependency zz (of kata-ts) is not installed; run npm ci.',
    });
  });
});
