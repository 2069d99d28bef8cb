/**
 * `kata-ts release` on a small built tree in a temporary directory: install (the production
 * files only, complete-then-rename, links), the same install again (nothing changes), an upgrade,
 * a rollback, prune and remove, and refusals that change nothing.
 */
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { main } from '../../../src/cli/main.js';

let dir = '';
let prefix = '';
let binDir = '';
let stateRoot = '';

async function writeTree(root: string, version: string): Promise<void> {
  const files: Record<string, string> = {
    'package.json': JSON.stringify({ name: 'kata-ts', version, dependencies: { dep: '1' }, devDependencies: { devtool: '1' } }),
    'bin/kata-ts.js': '#!/usr/bin/env node\n',
    'bin/containerd-shim-kata-ts-v2': '#!/usr/bin/env node\n',
    'dist/cli/entry.js': 'export {};\n',
    'dist/shim/main.js': 'export {};\n',
    'dist/native/kata-ts-jailer': '\x7fELF',
    'dist/native/kata-ts-portfwd': '\x7fELF',
    'dist/native/kata-ts-shim-relay': '\x7fELF',
    'dist/native/kata-ts-shim-start': '\x7fELF',
    'proto/api.proto': 'syntax = "proto3";\n',
    'node_modules/dep/package.json': '{"name":"dep"}',
    'node_modules/dep/index.js': '',
    'node_modules/devtool/package.json': '{"name":"devtool"}',
    'src/left-out.ts': '',
  };
  for (const [rel, text] of Object.entries(files)) {
    await fsp.mkdir(path.dirname(path.join(root, rel)), { recursive: true });
    await fsp.writeFile(path.join(root, rel), text, { mode: rel.startsWith('bin/') ? 0o755 : 0o644 });
  }
  await fsp.symlink('containerd-shim-kata-ts-v2', path.join(root, 'bin', 'containerd-shim-kata-ts-cvm-v2'));
}

async function run(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const sink = (into: string[]) =>
    ({
      write: (s: string) => {
        into.push(s);
        return true;
      },
    }) as unknown as NodeJS.WritableStream;
  const code = await main(['release', ...argv], { stdout: sink(out), stderr: sink(err) });
  return { code, out: out.join(''), err: err.join('') };
}

const layoutArgs = () => ['--prefix', prefix, '--bin-dir', binDir];
const stateArgs = () => ['--prefix', prefix, '--state-root', stateRoot];

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kt-release-'));
  prefix = path.join(dir, 'opt', 'kata-ts');
  binDir = path.join(dir, 'bin');
  stateRoot = path.join(dir, 'shim');
  await writeTree(path.join(dir, 'a'), '1.0.0');
  await writeTree(path.join(dir, 'b'), '2.0.0');
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('kata-ts release', () => {
  it('install copies the production tree into releases/<id>, makes it current and links the programs', async () => {
    const r = await run('install', ...layoutArgs(), '--from', path.join(dir, 'a'));
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    const [id] = await fsp.readdir(path.join(prefix, 'releases'));
    expect(id).toMatch(/^1\.0\.0-[0-9a-f]{12}$/);
    expect(r.out).toContain('copied 12/12 files');
    expect(r.out).toContain(`release ${id} is current`);
    const rel = path.join(prefix, 'releases', id!);
    expect((await fsp.readdir(rel)).sort()).toEqual(['RELEASE.json', 'bin', 'dist', 'node_modules', 'package.json', 'proto']);
    expect(await fsp.readdir(path.join(rel, 'node_modules'))).toEqual(['dep']);
    expect((await fsp.stat(path.join(rel, 'bin', 'kata-ts.js'))).mode & 0o777).toBe(0o755);
    expect(await fsp.readlink(path.join(prefix, 'current'))).toBe(`releases/${id}`);
    // Both shim names run the native start front, which falls back to bin/<its name> of its release.
    expect(await fsp.readlink(path.join(binDir, 'containerd-shim-kata-ts-cvm-v2'))).toBe(
      '../opt/kata-ts/current/dist/native/kata-ts-shim-start',
    );
    expect(await fsp.realpath(path.join(binDir, 'containerd-shim-kata-ts-v2'))).toBe(
      path.join(rel, 'dist', 'native', 'kata-ts-shim-start'),
    );
    expect(await fsp.readlink(path.join(binDir, 'kata-ts'))).toBe('../opt/kata-ts/current/bin/kata-ts.js');

    const again = await run('install', ...layoutArgs(), '--from', path.join(dir, 'a'));
    expect(again.out).toContain(`release ${id} is installed, current and linked in ${binDir} already: nothing changed`);
    // The release itself as the source is the same release (RELEASE.json is not part of its content).
    expect((await run('install', ...layoutArgs(), '--from', rel)).out).toContain('nothing changed');
  });

  it('an upgrade flips current; prune keeps current, removes the old; rollback with use', async () => {
    await run('install', ...layoutArgs(), '--from', path.join(dir, 'a'));
    const up = await run('install', ...layoutArgs(), '--from', path.join(dir, 'b'));
    expect(up.code).toBe(0);
    const ids = (await fsp.readdir(path.join(prefix, 'releases'))).sort();
    expect(ids).toHaveLength(2);
    const [a, b] = ids as [string, string];
    expect(up.out).toContain(`point ${prefix}/current at releases/${b} (was releases/${a})`);
    expect(up.out).not.toContain('link ');

    const dry = await run('use', a, ...layoutArgs(), '--dry-run');
    expect(dry.out).toContain('would (--dry-run, nothing changed)');
    expect(await fsp.readlink(path.join(prefix, 'current'))).toBe(`releases/${b}`);
    expect((await run('use', a, ...layoutArgs())).code).toBe(0);
    expect(await fsp.readlink(path.join(prefix, 'current'))).toBe(`releases/${a}`);
    expect((await run('use', b, ...layoutArgs())).code).toBe(0);

    const list = await run('list', ...stateArgs());
    expect(list.out).toContain(`* ${b}`);
    expect(list.out).toContain(`  ${a}`);
    const pruneDry = await run('prune', ...stateArgs(), '--dry-run');
    expect(pruneDry.out).toContain(`would remove ${a}`);
    expect((await fsp.readdir(path.join(prefix, 'releases'))).sort()).toEqual(ids);
    const prune = await run('prune', ...stateArgs());
    expect(prune.out).toContain(`keeping ${b}: it is current`);
    expect(prune.out).toContain(`removed ${a}`);
    expect(await fsp.readdir(path.join(prefix, 'releases'))).toEqual([b]);
    expect((await run('prune', ...stateArgs())).out).toContain('nothing to prune');
  });

  it('refusals name the reason and change nothing', async () => {
    await run('install', ...layoutArgs(), '--from', path.join(dir, 'a'));
    const [id] = await fsp.readdir(path.join(prefix, 'releases'));
    const current = await run('remove', id!, ...stateArgs());
    expect([current.code, current.err]).toEqual([
      1,
      `kata-ts release remove: RELEASE_IS_CURRENT: release ${id} is current; install or use another release first.\n`,
    ]);
    const unknown = await run('remove', '9.9.9-000000000000', ...stateArgs());
    expect(unknown.err).toContain('RELEASE_UNKNOWN');
    const incomplete = await run('install', ...layoutArgs(), '--from', path.join(dir, 'nowhere'));
    expect(incomplete.err).toContain('RELEASE_SOURCE_INCOMPLETE');
    await fsp.rm(path.join(dir, 'b', 'dist', 'shim', 'main.js'));
    const unbuilt = await run('install', ...layoutArgs(), '--from', path.join(dir, 'b'));
    expect(unbuilt.err).toContain('dist/shim/main.js is missing (run npm run build)');
    await fsp.rm(path.join(binDir, 'kata-ts'));
    await fsp.writeFile(path.join(binDir, 'kata-ts'), 'not ours');
    await writeTree(path.join(dir, 'c'), '3.0.0');
    const notLink = await run('install', ...layoutArgs(), '--from', path.join(dir, 'c'));
    expect(notLink.err).toContain('RELEASE_BIN_NOT_LINK');
    expect(await fsp.readdir(path.join(prefix, 'releases'))).toEqual([id]);
    expect((await run('install', ...layoutArgs(), 'extra')).code).toBe(2);
    expect((await run('bogus')).code).toBe(2);
  });
});
