import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

/**
 * src/runtime/admission is pure: it may import only itself, src/common, src/config and
 * src/sizing, and nothing from Node or npm (no I/O), so CreateContainer can run it before it
 * touches anything.
 */
const SRC = path.join(packageRoot(), 'src');
const ADMISSION = path.join(SRC, 'runtime', 'admission');
const ALLOWED = [ADMISSION, path.join(SRC, 'common'), path.join(SRC, 'config'), path.join(SRC, 'sizing')];
/** Files of src/common and src/config that do I/O: admission must not reach them. */
const FORBIDDEN = [path.join(SRC, 'common', 'fsutil.ts'), path.join(SRC, 'common', 'logger.ts'), path.join(SRC, 'config', 'load.ts')];

function specifiers(source: string): string[] {
  return [
    ...source.matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]/g),
    ...source.matchAll(/import\(\s*['"]([^'"]+)['"]\s*\)/g),
  ].map((m) => m[1]!);
}

describe('src/runtime/admission imports', () => {
  const files = readdirSync(ADMISSION).filter((f) => f.endsWith('.ts') && !f.endsWith('.test.ts'));

  it('has the admission files', () => {
    expect(files).toEqual(expect.arrayContaining(['admit.ts', 'budget.ts', 'demand.ts', 'describe.ts', 'index.ts']));
  });

  it.each(files)('%s imports only admission, common, config and sizing', (file) => {
    const found = specifiers(readFileSync(path.join(ADMISSION, file), 'utf8'));
    expect(found.length).toBeGreaterThan(0);
    for (const spec of found) {
      expect(spec.startsWith('.'), `${file} imports "${spec}", not a relative path`).toBe(true);
      const target = path.resolve(ADMISSION, spec).replace(/\.js$/, '.ts');
      expect(
        ALLOWED.some((dir) => target.startsWith(dir + path.sep)),
        `${file} imports ${spec}`,
      ).toBe(true);
      expect(FORBIDDEN.includes(target), `${file} imports ${spec}, which does I/O`).toBe(false);
    }
  });
});
