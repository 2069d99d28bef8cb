/**
 * Mount sources are all checked before any is made (src/runtime/container/mount-sources.ts), on a
 * real filesystem: a request refused for its last mount makes no directory for its first, and
 * what was made for a create that failed later is removed again, leaving others' files alone.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import {
  checkMountSources,
  makeMissingSources,
  mountSourceFault,
  removeMadeSources,
} from '../../../src/runtime/container/mount-sources.js';
import { rejection } from '../../helpers/kata-error.js';

let root: string;
const field = (i: number) => `container.mounts[${i}]`;
beforeEach(() => {
  root = mkdtempSync(path.join(tmpdir(), 'kata-ts-mount-sources-'));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

describe('mountSourceFault', () => {
  it('absolute, no "..", no NUL, not empty', () => {
    expect(mountSourceFault('/var/lib/kubelet/pods/x/volumes/a')).toBeUndefined();
    expect(mountSourceFault('')).toBe('is empty');
    expect(mountSourceFault('rel/x')).toBe('is not absolute');
    expect(mountSourceFault('/a/../etc')).toBe('has a ".." segment');
    expect(mountSourceFault('/a\0b')).toBe('holds a NUL byte');
  });
});

describe('checkMountSources, then makeMissingSources', () => {
  it('a refusal of the last mount makes nothing for the first ones', async () => {
    execFileSync('mkfifo', [path.join(root, 'fifo')]);
    const first = path.join(root, 'new', 'deep', 'a');
    for (const bad of [path.join(root, 'fifo'), 'relative', `${root}/x/../y`, path.join(root, 'fifo', 'below')]) {
      const err = await rejection(checkMountSources([first, path.join(root, 'other'), bad], field));
      expect(err.kind).toBe('invalid');
      expect(err.message).toContain('container.mounts[2]');
    }
    expect(existsSync(path.join(root, 'new'))).toBe(false);
    expect(existsSync(path.join(root, 'other'))).toBe(false);
  });

  it('makes the missing ones, lists each directory it made, and removes only those, only while empty', async () => {
    mkdirSync(path.join(root, 'existing'));
    const checks = await checkMountSources([path.join(root, 'existing'), path.join(root, 'n1', 'n2'), path.join(root, 'n3')], field);
    expect(checks.map((c) => c.missingFrom)).toEqual([null, path.join(root, 'n1'), path.join(root, 'n3')]);
    const made: string[] = [];
    await makeMissingSources(checks, made);
    expect(made.sort()).toEqual([path.join(root, 'n1'), path.join(root, 'n1', 'n2'), path.join(root, 'n3')].sort());
    // Someone else's file in n3 keeps n3.
    writeFileSync(path.join(root, 'n3', 'theirs'), 'x');
    await removeMadeSources(made, silentLogger());
    expect(existsSync(path.join(root, 'n1'))).toBe(false);
    expect(existsSync(path.join(root, 'n3', 'theirs'))).toBe(true);
    expect(existsSync(path.join(root, 'existing'))).toBe(true);
  });
});
