/**
 * The Debian package helper's pure part: which mirror the host's apt sources name for Debian
 * itself (the fetching is exercised against Debian's archive by
 * test/integration/measure/snp-tdx-debian-firmware.test.ts).
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { hostDebianMirror } from '../../helpers/debian-packages.js';

const dirs: string[] = [];
function etcApt(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), 'debian-packages-'));
  dirs.push(dir);
  mkdirSync(join(dir, 'sources.list.d'));
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  return dir;
}
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe('hostDebianMirror', () => {
  it('reads a deb822 file, skipping -security and third-party repositories', () => {
    const dir = etcApt({
      'sources.list.d/a-nodesource.sources': 'Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n',
      'sources.list.d/debian.sources':
        'Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n' +
        'Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n',
    });
    expect(hostDebianMirror(dir)).toBe('http://mirror.example/debian');
  });

  it('reads one-line sources with options, and falls back to deb.debian.org', () => {
    expect(hostDebianMirror(etcApt({ 'sources.list': '# x\ndeb [arch=amd64 signed-by=/k.gpg] http://local/debian bookworm main\n' }))).toBe(
      'http://local/debian',
    );
    expect(hostDebianMirror(etcApt({ 'sources.list': 'deb http://security.debian.org/debian-security bookworm-security main\n' }))).toBe(
      'http://deb.debian.org/debian',
    );
  });
});
