import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { GUEST_POD_PATHS, mountPoints, PodService } from '../../../guest/agent/pods.js';
import { silentLogger } from '../../../src/common/logger.js';

const shared = mkdtempSync(path.join(os.tmpdir(), 'agent-shared-'));
const outside = mkdtempSync(path.join(os.tmpdir(), 'agent-outside-'));
afterAll(() => {
  rmSync(shared, { recursive: true, force: true });
  rmSync(outside, { recursive: true, force: true });
});
const pods = new PodService(silentLogger(), { ...GUEST_POD_PATHS, sharedDir: shared, podsDir: path.join(shared, '.pods') });

describe('StatSharedPath', () => {
  it('reports kind, size, mode and content as the kernel resolves the path', async () => {
    writeFileSync(path.join(shared, 'a.txt'), 'hello', { mode: 0o640 });
    symlinkSync('a.txt', path.join(shared, 'link'));
    const file = await pods.statSharedPath({ relativePath: 'a.txt', noFollow: false, readContent: true });
    expect(file).toMatchObject({ exists: true, kind: 'FILE_KIND_REGULAR', size: 5, mode: 0o640, error: '' });
    expect(Buffer.from(file.content).toString()).toBe('hello');
    expect(await pods.statSharedPath({ relativePath: 'link', noFollow: true, readContent: false })).toMatchObject({
      kind: 'FILE_KIND_SYMLINK',
      linkTarget: 'a.txt',
    });
    expect(await pods.statSharedPath({ relativePath: 'missing/x', noFollow: false, readContent: false })).toMatchObject({ exists: false });
  });

  it('refuses absolute paths and ".." components: the call names paths of the share only', async () => {
    for (const relativePath of ['/etc/passwd', '../x', 'a/../../x', '']) {
      await expect(pods.statSharedPath({ relativePath, noFollow: false, readContent: false })).rejects.toMatchObject({
        reason: 'SHARED_PATH_INVALID',
      });
    }
  });
});

describe('CreatePod input', () => {
  it('refuses a bad pod id or hostname before touching anything', async () => {
    await expect(pods.createPod({ podId: '../x', hostname: 'a', shmSizeBytes: 0, withoutSharedDir: false })).rejects.toMatchObject({
      reason: 'POD_ID_INVALID',
    });
    await expect(pods.createPod({ podId: 'p1', hostname: 'bad host', shmSizeBytes: 0, withoutSharedDir: false })).rejects.toMatchObject({
      reason: 'POD_HOSTNAME_INVALID',
    });
  });

  it('reads mount points with escaped spaces from mountinfo', () => {
    expect(mountPoints('36 1 0:30 / /run/kata-ts/shared rw - virtiofs kata-ts-shared rw\n37 1 0:31 / /a\\040b rw - tmpfs x rw')).toEqual([
      '/run/kata-ts/shared',
      '/a b',
    ]);
  });
});
