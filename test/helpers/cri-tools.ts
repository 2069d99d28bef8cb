import { execFileSync } from 'node:child_process';
import { accessSync, constants, statSync } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';

export type CriTool = 'crictl' | 'critest';

/**
 * Where an upstream cri-tools binary (`crictl`, `critest`) is for the tests, in the order
 * scripts/conformance.sh uses too: `$CRICTL` / `$CRITEST` when set (and nothing else then: a set
 * variable that names no executable is a mistake to report, not to paper over), else the first on
 * `PATH`, else `cri-tools/` in the `shared/` directory beside the checkout (for a git worktree,
 * beside its main checkout). Null when there is none. Those binaries are built from fetched source,
 * so the repository never carries them: the tests that need one skip (see `findCriTool`).
 */
export function criToolPath(tool: CriTool): string | null {
  const fromEnv = process.env[envName(tool)];
  if (fromEnv !== undefined && fromEnv !== '') return isExecutable(fromEnv) ? path.resolve(fromEnv) : null;
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (dir === '') continue;
    const candidate = path.join(dir, tool);
    if (isExecutable(candidate)) return candidate;
  }
  for (const shared of sharedDirs()) {
    const candidate = path.join(shared, 'cri-tools', tool);
    if (isExecutable(candidate)) return candidate;
  }
  return null;
}

/** What to tell someone whose run lacks `tool`: where it was looked for, and how to provide it. */
export function criToolMissingNotice(tool: CriTool): string {
  const variable = envName(tool);
  const fromEnv = process.env[variable];
  const where =
    fromEnv !== undefined && fromEnv !== ''
      ? `${variable}=${fromEnv} is not an executable file`
      : `${variable} is unset, it is not on PATH, and not in ${sharedDirs()
          .map((d) => path.join(d, 'cri-tools'))
          .join(' nor ')}`;
  return `${tool} (kubernetes-sigs/cri-tools) not found: ${where}. Tests that need it are skipped; to run them set ${variable}=/path/to/${tool}, put ${tool} on PATH, or place it in shared/cri-tools/ beside the checkout.`;
}

/** `criToolPath`, writing `criToolMissingNotice` to stderr when the tool is absent (the skip says why). */
export function findCriTool(tool: CriTool): string | null {
  const found = criToolPath(tool);
  if (found === null) process.stderr.write(`notice: ${criToolMissingNotice(tool)}\n`);
  return found;
}

function envName(tool: CriTool): 'CRICTL' | 'CRITEST' {
  return tool === 'crictl' ? 'CRICTL' : 'CRITEST';
}

/** A regular file this process may execute (a directory on PATH named like the tool is not). */
function isExecutable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK);
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

/**
 * `shared/` beside the checkout and, for a git worktree, beside its main checkout (the directory
 * holding the common .git). Only directories, whether they exist or not: the caller probes files.
 */
function sharedDirs(): string[] {
  const repo = packageRoot();
  const dirs = [path.resolve(repo, '..', 'shared')];
  const mainCheckout = mainCheckoutOf(repo);
  if (mainCheckout !== undefined) {
    const beside = path.resolve(mainCheckout, '..', 'shared');
    if (!dirs.includes(beside)) dirs.push(beside);
  }
  return dirs;
}

/** The main checkout of the repository at `repo` (itself unless it is a worktree); undefined without git. */
function mainCheckoutOf(repo: string): string | undefined {
  try {
    const common = execFileSync('git', ['-C', repo, 'rev-parse', '--path-format=absolute', '--git-common-dir'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    return path.dirname(common);
  } catch {
    // No git, or not a git checkout (an unpacked tarball): only the checkout's own neighbour counts.
    return undefined;
  }
}
