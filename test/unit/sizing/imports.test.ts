import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

/**
 * src/sizing is pure and sits low in the layering (the hypervisor layer imports its types): it may
 * import only itself, src/common and src/config, and nothing from Node or npm (no I/O).
 */
const SIZING = path.join(packageRoot(), 'src', 'sizing');
const ALLOWED = [SIZING, path.join(packageRoot(), 'src', 'common'), path.join(packageRoot(), 'src', 'config')];

function specifiers(source: string): string[] {
  return [
    ...source.matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]/g),
    ...source.matchAll(/import\(\s*['"]([^'"]+)['"]\s*\)/g),
  ].map((m) => m[1]!);
}

describe('src/sizing imports', () => {
  const files = readdirSync(SIZING).filter((f) => f.endsWith('.ts') && !f.endsWith('.test.ts'));

  it('has the planner files', () => {
    expect(files).toEqual(expect.arrayContaining(['quantity.ts', 'aggregate.ts', 'sources.ts', 'shape.ts', 'types.ts', 'input.ts']));
  });

  it.each(files)('%s imports only src/sizing, src/common and src/config', (file) => {
    const found = specifiers(readFileSync(path.join(SIZING, file), 'utf8'));
    for (const spec of found) {
      expect(spec.startsWith('.'), `${file} imports "${spec}", not a relative path`).toBe(true);
      const target = path.resolve(SIZING, spec);
      expect(
        ALLOWED.some((dir) => target.startsWith(dir + path.sep)),
        `${file} imports ${spec}`,
      ).toBe(true);
    }
  });
});
