/**
 * The installer on real files in a private directory (through the CLI's command functions):
 * reads follow imports, writes keep the config's mode, a dry run changes nothing, uninstall gives
 * back the exact bytes, and a failing step rolls the steps before it back.
 */
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runInstallCommand, runUninstallCommand } from '../../../src/cli/install.js';
import {
  executePlan,
  gatherInstallInput,
  inspectContainerdConfig,
  parseContainerdVersion,
  planInstall,
} from '../../../src/install/index.js';

function capture(): { io: { stdout: Writable; stderr: Writable }; out: () => string; err: () => string } {
  let out = '';
  let err = '';
  const sink = (f: (s: string) => void) =>
    new Writable({
      write(chunk, _enc, cb) {
        f(String(chunk));
        cb();
      },
    });
  return {
    io: { stdout: sink((s) => (out += s)), stderr: sink((s) => (err += s)) },
    out: () => out,
    err: () => err,
  };
}

const ORIGINAL =
  'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n';

describe('kata-ts install / uninstall --containerd on files', () => {
  let dir: string;
  let config: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-install-'));
    config = path.join(dir, 'config.toml');
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const files = () => readdirSync(dir).sort();

  it('dry run changes nothing; install keeps the mode; uninstall restores the bytes; both idempotent', async () => {
    writeFileSync(config, ORIGINAL);
    chmodSync(config, 0o640);
    const args = ['--containerd', '--config', config, '--containerd-version', '1.6.20'];
    const dry = capture();
    expect(await runInstallCommand([...args, '--dry-run'], dry.io)).toBe(0);
    expect(dry.out()).toContain(`kata-ts install (dry run, nothing changed): would have appended to ${config}`);
    expect(files()).toEqual(['config.toml']);

    const first = capture();
    expect(await runInstallCommand(args, first.io)).toBe(0);
    expect(first.out()).toContain(`kata-ts install: backed up ${config} to ${config}.kata-ts-backup`);
    expect(files()).toEqual(['config.toml', 'config.toml.kata-ts-backup', 'config.toml.kata-ts-install.json']);
    expect(statSync(config).mode & 0o777).toBe(0o640);
    expect(readFileSync(config, 'utf8')).toContain('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts-cvm]');
    const second = capture();
    expect(await runInstallCommand(args, second.io)).toBe(0);
    expect(second.out()).toContain('nothing changed');

    const inspected = await inspectContainerdConfig(config, parseContainerdVersion('1.6.20'));
    expect(inspected.handlers.map((h) => [h.handler, h.file, h.configuredType])).toEqual([
      ['kata-ts', config, 'io.containerd.kata-ts.v2'],
      ['kata-ts-cvm', config, 'io.containerd.kata-ts-cvm.v2'],
    ]);

    const undo = capture();
    expect(await runUninstallCommand(['--containerd', '--config', config], undo.io)).toBe(0);
    expect(readFileSync(config, 'utf8')).toBe(ORIGINAL);
    expect(statSync(config).mode & 0o777).toBe(0o640);
    expect(files()).toEqual(['config.toml']);
    const again = capture();
    expect(await runUninstallCommand(['--containerd', '--config', config], again.io)).toBe(0);
    expect(again.out()).toContain('nothing changed');
  });

  it('a refusal exits 1, says the reason on stderr and changes nothing', async () => {
    writeFileSync(config, `${ORIGINAL}[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts]\n  runtime_type = "x"\n`);
    const c = capture();
    expect(await runInstallCommand(['--containerd', '--config', config, '--containerd-version', '1.7.0'], c.io)).toBe(1);
    expect(c.err()).toMatch(/\[INSTALL_HANDLER_CONFLICT\]; nothing changed\n$/);
    expect(files()).toEqual(['config.toml']);
  });

  it('without --containerd: a usage error', async () => {
    await expect(runInstallCommand(['--config', config], capture().io)).rejects.toThrow('--containerd is required');
  });

  it('2.x drop-in through imports (relative glob), found again by the inspection; uninstall removes the directory it made', async () => {
    writeFileSync(config, "version = 3\nimports = ['conf.d/*.toml']\n");
    const c = capture();
    expect(await runInstallCommand(['--containerd', '--config', config, '--containerd-version', '2.1.0'], c.io)).toBe(0);
    expect(c.out()).toContain(`created directory ${dir}/conf.d`);
    expect(readdirSync(path.join(dir, 'conf.d'))).toEqual(['kata-ts.toml']);
    const inspected = await inspectContainerdConfig(config, parseContainerdVersion('2.1.0'));
    expect(inspected.files).toEqual([config, path.join(dir, 'conf.d', 'kata-ts.toml')]);
    expect(inspected.handlers.every((h) => h.file === path.join(dir, 'conf.d', 'kata-ts.toml'))).toBe(true);
    expect(await runUninstallCommand(['--containerd', '--config', config], capture().io)).toBe(0);
    expect(files()).toEqual(['config.toml']);
  });

  it('--host-root: host paths (the config, its absolute imports, the record) are reached below the root', async () => {
    const host = path.join(dir, 'host');
    mkdirSync(path.join(host, 'etc', 'containerd', 'conf.d'), { recursive: true });
    const hostConfig = path.join(host, 'etc', 'containerd', 'config.toml');
    writeFileSync(hostConfig, "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n");
    const c = capture();
    const args = ['--containerd', '--host-root', host, '--containerd-version', '2.2.0'];
    expect(await runInstallCommand(args, c.io)).toBe(0);
    expect(c.out()).toContain('wrote drop-in /etc/containerd/conf.d/kata-ts.toml (imported by /etc/containerd/config.toml)');
    expect(readdirSync(path.join(host, 'etc', 'containerd', 'conf.d'))).toEqual(['kata-ts.toml']);
    expect(readdirSync(path.join(host, 'etc', 'containerd')).sort()).toEqual(['conf.d', 'config.toml', 'config.toml.kata-ts-install.json']);
    expect(await runUninstallCommand(['--containerd', '--host-root', host], capture().io)).toBe(0);
    expect(readdirSync(path.join(host, 'etc', 'containerd')).sort()).toEqual(['conf.d', 'config.toml']);
    expect(readdirSync(path.join(host, 'etc', 'containerd', 'conf.d'))).toEqual([]);
  });

  it('a step that fails undoes the steps before it', async () => {
    writeFileSync(config, ORIGINAL);
    const plan = planInstall(
      await gatherInstallInput(
        { configPath: config, statePath: path.join(dir, 'state.json'), backupPath: path.join(dir, 'no-such-dir', 'backup') },
        parseContainerdVersion('1.6.20'),
      ),
    );
    // The backup's directory is missing: its write fails first. Put it last instead to see the undo.
    plan.changes.push(plan.changes.shift()!);
    await expect(executePlan(plan)).rejects.toThrow(/ENOENT/);
    expect(files()).toEqual(['config.toml']);
    expect(readFileSync(config, 'utf8')).toBe(ORIGINAL);
    mkdirSync(path.join(dir, 'no-such-dir'));
  });
});
