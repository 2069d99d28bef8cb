/**
 * test/helpers/nerdctl.ts: which nerdctl the integration test runs, which containerd it is put
 * behind, and that every root nerdctl writes to is the test's own. Where no nerdctl can be had,
 * the answer is a sentence naming every source tried (the integration test's skip notice).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { containerdReleasesFor, findNerdctl, nerdctlGlobalArgs, parseNerdctlVersion } from '../../helpers/nerdctl.js';

describe('nerdctl helper', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kts-nerdctl-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("reads nerdctl's version line and puts nerdctl 2 behind containerd 2.x then 1.7, nerdctl 1 behind 1.7 then 1.6", () => {
    expect(parseNerdctlVersion('nerdctl version 2.1.3\n')).toEqual({ major: 2, minor: 1, patch: 3 });
    expect(parseNerdctlVersion('nerdctl version v1.7.7')).toEqual({ major: 1, minor: 7, patch: 7 });
    expect(parseNerdctlVersion('docker version 27.0.0')).toBeNull();
    expect(containerdReleasesFor({ major: 2, minor: 0, patch: 0 })).toEqual(['2.1', '1.7']);
    expect(containerdReleasesFor({ major: 1, minor: 7, patch: 7 })).toEqual(['1.7', '1.6']);
  });

  it("names every root under the test's dir: data root, CNI config and plugin dirs (never the host's)", () => {
    const args = nerdctlGlobalArgs({ dir: '/tmp/t', address: '/tmp/t/c.sock', namespace: 'ns' });
    const value = (flag: string) => args[args.indexOf(flag) + 1];
    expect([value('--address'), value('--namespace')]).toEqual(['/tmp/t/c.sock', 'ns']);
    for (const flag of ['--data-root', '--cni-netconfpath', '--cni-path']) expect(value(flag)?.startsWith('/tmp/t/nerdctl/')).toBe(true);
  });

  it('KATA_TS_NERDCTL: must be absolute; a binary that is not nerdctl is refused with what it printed', async () => {
    expect((await findNerdctl({}, { KATA_TS_NERDCTL: 'nerdctl' })).missing).toMatch(/must be an absolute path/);
    const fake = path.join(dir, 'not-nerdctl');
    writeFileSync(fake, '#!/bin/sh\necho "something else 1.0"\n', { mode: 0o755 });
    expect((await findNerdctl({}, { KATA_TS_NERDCTL: fake })).missing).toMatch(/not nerdctl's version/);
    const broken = path.join(dir, 'missing-binary');
    expect((await findNerdctl({}, { KATA_TS_NERDCTL: broken })).missing).toMatch(/does not run here/);
  });

  it('an unreachable archive, an empty cache and no nerdctl on PATH: missing, naming each source', { timeout: 60_000 }, async () => {
    const result = await findNerdctl({ cacheDir: path.join(dir, 'cache'), mirror: 'http://127.0.0.1:9/debian' }, { PATH: dir });
    expect(result.nerdctl).toBeNull();
    expect(result.missing).toMatch(/^no nerdctl runs here \(set KATA_TS_NERDCTL to one\): .*; .*; no nerdctl on PATH$/);
  });
});
