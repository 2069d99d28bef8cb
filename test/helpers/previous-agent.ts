/**
 * The guest of the previous agent API, built from git history: the tree of the last commit whose
 * agent.proto said that version (API_BASELINES in src/agent-client/api-features.ts) is extracted
 * with `git archive`, given this checkout's node_modules, its own generated types (`npm run gen`
 * of that tree: the agent must carry the older schema) and built by that tree's own
 * scripts/build-guest.sh, so kernel, init and agent are what a pod started before the upgrade runs.
 *
 * Cached under <repo>/.cache/agent-compat/<commit>/ (tree/ and guest/); the build script is
 * idempotent, so a re-run only checks its inputs. The kernel packages come from the same cache as
 * every other guest build (KATA_TS_GUEST_CACHE or build-guest.sh's default).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, renameSync, rmSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

export interface PreviousAgentGuest {
  commit: string;
  dir: string;
  kernelPath: string;
  initrdPath: string;
  guestImagePath: string;
}

/** Whether this checkout holds `commit` (a shallow clone may not). */
export function haveCommit(commit: string): boolean {
  try {
    execFileSync('git', ['-C', repo, 'cat-file', '-e', `${commit}^{commit}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Build (or find built) the guest of `commit`'s tree; throws naming the step that failed. */
export function ensurePreviousAgentGuest(commit: string): PreviousAgentGuest {
  const base = path.join(repo, '.cache/agent-compat', commit);
  const tree = path.join(base, 'tree');
  const out = path.join(base, 'guest');
  if (!existsSync(path.join(tree, '.extracted'))) {
    // Extracted aside and renamed into place: a tree is complete or absent.
    const incoming = path.join(base, `tree.incoming-${process.pid}`);
    rmSync(incoming, { recursive: true, force: true });
    mkdirSync(incoming, { recursive: true });
    execFileSync('bash', ['-o', 'pipefail', '-c', 'git -C "$1" archive "$2" | tar -x -C "$3"', 'extract', repo, commit, incoming], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    symlinkSync(path.join(repo, 'node_modules'), path.join(incoming, 'node_modules'));
    // src/generated is not in git: the old tree's own schema, from its own proto.
    execFileSync(process.execPath, ['scripts/gen-proto-types.mjs'], { cwd: incoming, stdio: ['ignore', 'ignore', 'inherit'] });
    execFileSync('touch', [path.join(incoming, '.extracted')]);
    rmSync(tree, { recursive: true, force: true });
    renameSync(incoming, tree);
  }
  const args = [path.join(tree, 'scripts/build-guest.sh'), '--out', out];
  if (process.env.KATA_TS_GUEST_CACHE !== undefined) args.push('--cache', process.env.KATA_TS_GUEST_CACHE);
  execFileSync('bash', args, { stdio: ['ignore', 'ignore', 'inherit'] });
  return {
    commit,
    dir: out,
    kernelPath: path.join(out, 'vmlinuz'),
    initrdPath: path.join(out, 'initramfs.cpio.gz'),
    guestImagePath: path.join(out, 'guest.img'),
  };
}
