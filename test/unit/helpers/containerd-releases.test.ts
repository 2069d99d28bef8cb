/**
 * test/helpers/containerd-releases.ts: the releases the shim's integration tests run against.
 * Where Debian's archive cannot be reached and nothing is cached, a release comes back as a
 * sentence naming why (the integration tests print it as their skip notice), never a throw and
 * never a silent pass. The 1.6 release is the machine's own containerd, checked to be 1.6.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { configSchemaOf, containerdRelease } from '../../helpers/containerd-releases.js';

const onPath = (bin: string): boolean => {
  try {
    execFileSync('sh', ['-c', `command -v ${bin}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
};

describe('containerdRelease', () => {
  const cache = mkdtempSync(path.join(os.tmpdir(), 'kts-releases-'));
  afterAll(() => rmSync(cache, { recursive: true, force: true }));

  it.skipIf(!onPath('apt-get'))(
    'an unreachable archive with an empty cache: missing, a sentence naming the suite',
    { timeout: 60_000 },
    async () => {
      // Port 9 (discard) on loopback: nothing answers, the fetch fails at once.
      const result = await containerdRelease('2.1', { cacheDir: cache, mirror: 'http://127.0.0.1:9/debian' });
      expect(result.release).toBeNull();
      expect(result.missing).toMatch(/^sid's containerd could not be fetched: /);
    },
  );

  it.skipIf(!onPath('containerd'))('1.6 is the containerd on PATH, its version from `containerd --version`', async () => {
    // scripts/setup.sh installs Debian 12's containerd, which is a 1.6.
    const result = await containerdRelease('1.6');
    expect(result.missing).toBeNull();
    expect(result.release).toMatchObject({ label: '1.6', containerd: 'containerd', binDir: null, version: { major: 1, minor: 6 } });
  });

  it('the config schema per release: version 2 for 1.x, version 3 for 2.x', () => {
    expect(configSchemaOf({ major: 1, minor: 7, patch: 24 })).toBe(2);
    expect(configSchemaOf({ major: 2, minor: 1, patch: 9 })).toBe(3);
  });
});
