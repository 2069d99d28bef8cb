/**
 * Tests live under test/ only (unit tests in test/unit/<folder they test>/), so nothing of them
 * ships in dist/: tsconfig.build.json compiles all of src/.
 */
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    return e.isDirectory() ? files(full) : [full];
  });
}

describe('test layout', () => {
  it('src/ holds no test files', () => {
    const src = path.join(packageRoot(), 'src');
    const tests = files(src).filter((f) => /\.test\.[cm]?[jt]s$/.test(f));
    expect(tests.map((f) => path.relative(src, f))).toEqual([]);
  });

  it('every unit test folder names a source folder (or the architecture checks)', () => {
    const unit = path.join(packageRoot(), 'test', 'unit');
    const sources = new Set([
      'architecture',
      ...readdirSync(path.join(packageRoot(), 'src')),
      'admission',
      'cri',
      'logs',
      'guest-agent',
      'guest-agent-core',
      // scripts/conformance: the critest harness and its ratchet
      'conformance',
      // test/helpers: the test infrastructure's own checks (the typed CRI client, the waits)
      'helpers',
    ]);
    const folders = readdirSync(unit, { withFileTypes: true }).filter((e) => e.isDirectory());
    expect(folders.length).toBeGreaterThan(5);
    expect(folders.map((e) => e.name).filter((n) => !sources.has(n))).toEqual([]);
  });
});
