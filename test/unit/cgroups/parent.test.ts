import { describe, expect, it } from 'vitest';
import {
  expandSlice,
  isSystemdStyleParent,
  parseCgroupfsParent,
  parseSystemdParent,
  sliceNameProblem,
  validateParentFor,
  vmmCgroupName,
} from '../../../src/cgroups/parent.js';
import { KataError } from '../../../src/common/errors.js';

function caught(fn: () => unknown): KataError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KataError);
    return err as KataError;
  }
  throw new Error('expected a KataError');
}

const uid = '0f1e2d3c-4b5a-6978-8a9b-acbdcedfe0f1';
const podSlice = `kubepods-burstable-pod${uid.replace(/-/g, '_')}.slice`;
const podSlicePath = `/kubepods.slice/kubepods-burstable.slice/${podSlice}`;

describe('systemd slice names (systemd rules)', () => {
  it('expands a slice to the nesting its dashes imply', () => {
    expect(expandSlice('a-b-c.slice')).toBe('/a.slice/a-b.slice/a-b-c.slice');
    expect(expandSlice('kubepods.slice')).toBe('/kubepods.slice');
    expect(expandSlice(podSlice)).toBe(podSlicePath);
    expect(expandSlice('-.slice')).toBe('');
  });

  it.each([
    ['a--b.slice', 'contains "--"'],
    ['-a.slice', 'starts or ends with "-"'],
    ['a-.slice', 'starts or ends with "-"'],
    ['a.service', 'does not end in ".slice"'],
    ['.slice', 'empty'],
    ['a b.slice', 'characters'],
    ['a/b.slice', 'characters'],
    [`${'x'.repeat(250)}.slice`, 'longer than 255'],
  ])('refuses %s (%s)', (name, why) => {
    expect(sliceNameProblem(name)).toContain(why);
    const err = caught(() => expandSlice(name));
    expect([err.kind, err.reason]).toEqual(['invalid', 'CGROUP_PARENT_INVALID']);
    expect(err.message).toContain('cgroup_parent');
  });

  it('accepts the characters systemd allows', () => {
    expect(sliceNameProblem('a_b:c\\x2d.slice')).toBeNull();
  });
});

describe('cgroup_parent for the systemd driver', () => {
  it('takes the kubelet expanded path, a bare slice, and empty (crictl)', () => {
    expect(parseSystemdParent(podSlicePath)).toEqual({ style: 'systemd', slice: podSlice, path: podSlicePath });
    expect(parseSystemdParent(podSlice)).toEqual({ style: 'systemd', slice: podSlice, path: podSlicePath });
    expect(parseSystemdParent(`/${podSlice}`)).toMatchObject({ slice: podSlice });
    expect(parseSystemdParent('')).toEqual({ style: 'systemd', slice: null, path: '' });
  });

  it('refuses a path that does not match the slice expansion', () => {
    const err = caught(() => parseSystemdParent('/kubepods.slice/other.slice'));
    expect([err.kind, err.reason]).toEqual(['invalid', 'CGROUP_PARENT_INVALID']);
    expect(err.message).toContain('/other.slice');
  });

  it('refuses a cgroupfs path with FAILED_PRECONDITION naming both styles', () => {
    const err = caught(() => validateParentFor('systemd', `/kubepods/burstable/pod${uid}`));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_PARENT_STYLE_MISMATCH']);
    expect(err.message).toMatch(/cgroupfs path.*driver is systemd.*slice/);
  });
});

describe('cgroup_parent for the cgroupfs driver', () => {
  it('takes the kubelet path, a relative path and empty', () => {
    expect(parseCgroupfsParent(`/kubepods/burstable/pod${uid}`)).toEqual({
      style: 'cgroupfs',
      path: `/kubepods/burstable/pod${uid}`,
      components: ['kubepods', 'burstable', `pod${uid}`],
    });
    expect(parseCgroupfsParent('kubepods//besteffort/')).toMatchObject({ path: '/kubepods/besteffort' });
    expect(parseCgroupfsParent('')).toEqual({ style: 'cgroupfs', path: '', components: [] });
    expect(parseCgroupfsParent('/')).toMatchObject({ components: [] });
  });

  it.each(['/kubepods/../etc', '/kubepods/./x', '/kube pods', '/a/cgroup.procs', '/a\nb'])('refuses %j', (parent) => {
    const err = caught(() => parseCgroupfsParent(parent));
    expect([err.kind, err.reason]).toEqual(['invalid', 'CGROUP_PARENT_INVALID']);
  });

  it('refuses a systemd slice with FAILED_PRECONDITION naming both styles', () => {
    expect(isSystemdStyleParent(podSlicePath)).toBe(true);
    const err = caught(() => validateParentFor('cgroupfs', podSlicePath));
    expect([err.kind, err.reason]).toEqual(['precondition', 'CGROUP_PARENT_STYLE_MISMATCH']);
    expect(err.message).toMatch(/systemd slice.*driver is cgroupfs.*path/);
  });
});

describe('VMM cgroup name', () => {
  it('is kata-ts-<sandbox id>; ids that cannot name a unit are refused', () => {
    expect(vmmCgroupName('ab'.repeat(32))).toBe(`kata-ts-${'ab'.repeat(32)}`);
    // containerd's identifiers (a caller's sandbox id) may hold ".".
    expect(vmmCgroupName('pod-1.web_2')).toBe('kata-ts-pod-1.web_2');
    for (const bad of ['', 'a/b', 'a b', 'x'.repeat(201)]) {
      expect(caught(() => vmmCgroupName(bad)).reason).toBe('CGROUP_SANDBOX_ID_INVALID');
    }
  });
});
