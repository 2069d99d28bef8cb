import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

/**
 * The request specs (src/runtime/spec) and the resize planner (src/runtime/resize/plan.ts) are
 * pure: relative imports only, of types, errors, the admission and sizing planners, and constants;
 * nothing from Node or npm, and none of the files that do I/O.
 */
const SRC = path.join(packageRoot(), 'src');
const PURE_FILES = [
  ...readdirSync(path.join(SRC, 'runtime', 'spec'))
    .filter((f) => f.endsWith('.ts'))
    .map((f) => path.join(SRC, 'runtime', 'spec', f)),
  path.join(SRC, 'runtime', 'resize', 'plan.ts'),
];
const ALLOWED = [
  path.join(SRC, 'runtime', 'spec'),
  path.join(SRC, 'runtime', 'admission'),
  path.join(SRC, 'common', 'errors.ts'),
  path.join(SRC, 'config', 'types.ts'),
  path.join(SRC, 'sizing', 'types.ts'),
  path.join(SRC, 'generated'),
  // VIRTIO_MEM_BLOCK_MIB, beside the pure argv builder that sizes the virtio-mem device.
  path.join(SRC, 'hypervisor', 'argv.ts'),
];

function specifiers(source: string): string[] {
  return [...source.matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]/g)].map((m) => m[1]!);
}

describe('pure runtime planners import nothing that does I/O', () => {
  it('finds the spec files and the resize planner', () => {
    expect(PURE_FILES.map((f) => path.basename(f))).toEqual(expect.arrayContaining(['sandbox.ts', 'container.ts', 'v1.ts', 'plan.ts']));
  });

  it.each(PURE_FILES.map((f) => [path.relative(SRC, f), f]))('%s', (_rel, file) => {
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      expect(spec.startsWith('.'), `imports "${spec}", not a relative path`).toBe(true);
      const target = path.resolve(path.dirname(file), spec).replace(/\.js$/, '.ts');
      expect(
        ALLOWED.some((allowed) => target === allowed || target.startsWith(allowed + path.sep)),
        `imports ${spec}`,
      ).toBe(true);
    }
  });
});
