/**
 * `kata-ts doctor`'s containerd section against this machine's real containerd binary (its
 * version) and private config files: warnings while no kata-ts handler is configured, ok once
 * installed, a failure for a handler table of ours with another runtime type, and the shim lookup.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { containerdChecks } from '../../../src/cli/doctor-containerd.js';
import { runInstallCommand } from '../../../src/cli/install.js';
import { containerdMissing } from '../../helpers/containerd.js';

const quiet = { stdout: new Writable({ write: (_c, _e, cb) => cb() }), stderr: new Writable({ write: (_c, _e, cb) => cb() }) };

describe.skipIf(containerdMissing() !== null)('doctor: containerd integration', () => {
  let dir: string;
  let config: string;
  let savedPath: string | undefined;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-doctor-'));
    config = path.join(dir, 'config.toml');
    savedPath = process.env.PATH;
    // No containerd runs with this config: the shims are looked up on this process's PATH.
    mkdirSync(path.join(dir, 'bin'));
    process.env.PATH = `${path.join(dir, 'bin')}:/usr/sbin:/usr/bin:/sbin:/bin`;
  });
  afterEach(() => {
    process.env.PATH = savedPath;
    rmSync(dir, { recursive: true, force: true });
  });
  const shims = () => {
    for (const n of ['containerd-shim-kata-ts-v2', 'containerd-shim-kata-ts-cvm-v2'])
      writeFileSync(path.join(dir, 'bin', n), '#!/bin/sh\nexit 1\n', { mode: 0o755 });
  };
  const verdicts = async () =>
    (await containerdChecks({ configPath: config, procRoot: path.join(dir, 'no-proc') })).map((c) => [c.name, c.verdict]);

  it('not configured: the version is checked, the rest are warnings with the fix', async () => {
    writeFileSync(config, 'version = 2\n');
    const checks = await containerdChecks({ configPath: config, procRoot: path.join(dir, 'no-proc') });
    expect(checks.map((c) => [c.name, c.verdict])).toEqual([
      ['containerd', 'ok'],
      ['containerd-handlers', 'warn'],
      ['containerd-shims', 'warn'],
    ]);
    expect(checks[0]!.message).toBe('containerd 1.6.20: supported (1.6, 1.7, 2.x)');
    expect(checks[1]!.message).toBe(
      `kata-ts and kata-ts-cvm not in ${config}: run \`kata-ts install --containerd --config ${config}\` and restart containerd`,
    );
    expect(checks[2]!.message).toMatch(
      /^containerd-shim-kata-ts-v2 and containerd-shim-kata-ts-cvm-v2 not on this shell's PATH .*: install kata-ts's binaries/,
    );
  });

  it('installed, shims on PATH: all ok; shims gone: a failure now that the handlers are configured', async () => {
    writeFileSync(config, 'version = 2\n');
    expect(await runInstallCommand(['--containerd', '--config', config], quiet)).toBe(0);
    shims();
    expect(await verdicts()).toEqual([
      ['containerd', 'ok'],
      ['containerd-handlers', 'ok'],
      ['containerd-shims', 'ok'],
    ]);
    rmSync(path.join(dir, 'bin', 'containerd-shim-kata-ts-cvm-v2'));
    expect((await verdicts())[2]).toEqual(['containerd-shims', 'fail']);
  });

  it('a kata-ts table with another runtime type fails, naming it', async () => {
    writeFileSync(
      config,
      'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts]\n  runtime_type = "io.containerd.kata.v2"\n',
    );
    shims();
    const checks = await containerdChecks({ configPath: config, procRoot: path.join(dir, 'no-proc') });
    expect(checks[1]).toEqual({
      name: 'containerd-handlers',
      verdict: 'fail',
      message: `kata-ts in ${config} has runtime_type io.containerd.kata.v2, not io.containerd.kata-ts.v2: run \`kata-ts install --containerd --config ${config}\` and restart containerd after removing that table`,
    });
  });

  it('an imported file replacing the CRI section (containerd 1.x) hides the handlers of the config', async () => {
    writeFileSync(config, 'version = 2\nimports = ["conf.d/*.toml"]\n');
    expect(await runInstallCommand(['--containerd', '--config', config], quiet)).toBe(0);
    mkdirSync(path.join(dir, 'conf.d'));
    writeFileSync(path.join(dir, 'conf.d', 'x.toml'), 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause"\n');
    expect((await verdicts())[1]).toEqual(['containerd-handlers', 'warn']);
  });
});
