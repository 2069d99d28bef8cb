import { existsSync } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';

/**
 * Where upstream cri-tools binaries (`crictl`, `critest`) are for the tests: `$CRICTL` / `$CRITEST`
 * when set, else `../shared/cri-tools/` next to the checkout (as CI lays it out), else next to the
 * checkout's parent (a git worktree one level deeper). Null when none exists: the tests that need
 * the real tool are skipped, saying so in their name.
 */
export function criToolPath(tool: 'crictl' | 'critest'): string | null {
  const fromEnv = process.env[tool.toUpperCase()];
  if (fromEnv !== undefined && fromEnv !== '') return existsSync(fromEnv) ? fromEnv : null;
  const repo = packageRoot();
  for (const base of ['../shared', '../../shared']) {
    const candidate = path.resolve(repo, base, 'cri-tools', tool);
    if (existsSync(candidate)) return candidate;
  }
  return null;
}
