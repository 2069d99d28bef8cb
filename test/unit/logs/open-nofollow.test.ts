/**
 * Log files are opened as root with no symbolic link followed anywhere on their path
 * (src/runtime/logs/open-nofollow.ts), on a real filesystem: a link planted as the log file, as
 * its directory or above it makes the open fail and writes nothing where it points.
 */

import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { firstSymlinkIn, openDirNoFollow, openLogNoFollow } from '../../../src/runtime/logs/open-nofollow.js';
import { ContainerLogWriter } from '../../../src/runtime/logs/writer.js';
import { rejection } from '../../helpers/kata-error.js';

let root: string;
let victim: string;
beforeEach(() => {
  root = mkdtempSync(path.join(tmpdir(), 'kata-ts-nofollow-'));
  victim = path.join(root, 'victim');
  mkdirSync(victim);
  writeFileSync(path.join(victim, 'secret'), 'untouched');
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

describe('openLogNoFollow', () => {
  it('creates the file (0640) and its missing directories, and appends', async () => {
    const file = path.join(root, 'pods', 'ns_p_u', 'app', '0.log');
    const h = await openLogNoFollow(file, { createDirs: true });
    await h.write('a');
    await h.close();
    const h2 = await openLogNoFollow(file, { createDirs: false });
    await h2.write('b');
    await h2.close();
    expect(readFileSync(file, 'utf8')).toBe('ab');
    expect(statSync(file).mode & 0o777).toBe(0o640);
  });

  it('refuses a link as the log file, the directory or a directory above, and writes nothing through it', async () => {
    symlinkSync(path.join(victim, 'secret'), path.join(root, 'file-link'));
    symlinkSync(victim, path.join(root, 'dir-link'));
    for (const file of [path.join(root, 'file-link'), path.join(root, 'dir-link', 'secret'), path.join(root, 'dir-link', 'sub', 'x.log')]) {
      const err = await rejection(openLogNoFollow(file, { createDirs: true }));
      expect(err.reason, file).toBe('LOGS_PATH_UNUSABLE');
    }
    expect(readFileSync(path.join(victim, 'secret'), 'utf8')).toBe('untouched');
    expect(execFileSync('ls', [victim], { encoding: 'utf8' }).trim()).toBe('secret');
  });

  it('refuses a FIFO or a directory at the log path without blocking', async () => {
    execFileSync('mkfifo', [path.join(root, 'fifo')]);
    mkdirSync(path.join(root, 'dir'));
    expect((await rejection(openLogNoFollow(path.join(root, 'fifo'), { createDirs: false }))).reason).toBe('LOGS_PATH_UNUSABLE');
    expect((await rejection(openLogNoFollow(path.join(root, 'dir'), { createDirs: false }))).reason).toBe('LOGS_PATH_UNUSABLE');
  });

  it('a missing directory is LOGS_DIR_MISSING without createDirs; a path not normalised is refused', async () => {
    expect((await rejection(openLogNoFollow(path.join(root, 'none', 'x.log'), { createDirs: false }))).reason).toBe('LOGS_DIR_MISSING');
    expect((await rejection(openLogNoFollow(`${root}/a/../x.log`, { createDirs: true }))).reason).toBe('LOGS_PATH_UNUSABLE');
    expect((await rejection(openDirNoFollow('relative', { create: false }))).reason).toBe('LOGS_PATH_UNUSABLE');
  });

  it('the log writer opens through it: a log path swapped for a link fails, the target untouched', async () => {
    const dir = path.join(root, 'pod');
    mkdirSync(dir);
    symlinkSync(path.join(victim, 'secret'), path.join(dir, '0.log'));
    const err = await rejection(ContainerLogWriter.open({ logPath: path.join(dir, '0.log'), statePath: path.join(root, 'state.json') }));
    expect(err.reason).toBe('LOGS_PATH_UNUSABLE');
    expect(readFileSync(path.join(victim, 'secret'), 'utf8')).toBe('untouched');
  });
});

describe('firstSymlinkIn', () => {
  it('names the first link among the components that exist', async () => {
    symlinkSync(victim, path.join(root, 'link'));
    expect(await firstSymlinkIn(path.join(root, 'link', 'a', 'b'))).toBe(path.join(root, 'link'));
    expect(await firstSymlinkIn(path.join(root, 'victim', 'not', 'yet'))).toBeUndefined();
    expect(await firstSymlinkIn(path.join(root, 'victim', 'secret', 'x'))).toBeUndefined();
  });
});
