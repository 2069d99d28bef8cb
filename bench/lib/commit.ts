/** The checked-out commit a bench's results are recorded with. */
import { execFileSync } from 'node:child_process';
import { packageRoot } from '../../src/common/paths.js';

/** `git rev-parse --short=12 HEAD`, so results from different commits can be told apart; null outside a git checkout. */
export function currentCommit(): string | null {
  try {
    return execFileSync('git', ['rev-parse', '--short=12', 'HEAD'], {
      cwd: packageRoot(),
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return null;
  }
}
