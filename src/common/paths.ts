import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

let cachedRoot: string | undefined;

/** The directory holding kata-ts's package.json, whether running from src/ (tsx) or dist/. */
export function packageRoot(): string {
  if (cachedRoot !== undefined) return cachedRoot;
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const candidate = path.join(dir, 'package.json');
    if (existsSync(candidate)) {
      const pkg = JSON.parse(readFileSync(candidate, 'utf8')) as { name?: string };
      if (pkg.name === 'kata-ts') {
        cachedRoot = dir;
        return dir;
      }
    }
    const parent = path.dirname(dir);
    if (parent === dir) throw new Error(`kata-ts package.json not found above ${fileURLToPath(import.meta.url)}`);
    dir = parent;
  }
}

/** The version in package.json: the one Version and `kata-ts version` report. */
export function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(path.join(packageRoot(), 'package.json'), 'utf8')) as { version: string };
  return pkg.version;
}
