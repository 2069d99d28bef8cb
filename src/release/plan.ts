/**
 * Pure planners of the release commands: what an install changes (nothing when the release is
 * installed, current and linked already), and which releases a prune removes (neither current nor
 * used by a running process). The executors (install.ts) do exactly the steps planned.
 */
import { notFound, precondition } from '../common/errors.js';
import { BIN_LINKS, binLinkTarget, currentTarget, type ReleasePaths, releaseOfCurrentTarget } from './layout.js';
import './reasons.js';

/** What is at a path the install writes: nothing, a symlink (and its target), or something else. */
export type LinkState = { kind: 'missing' } | { kind: 'link'; target: string } | { kind: 'other' };

/** The layout as found on disk. */
export interface LayoutState {
  /** Release ids under releases/ (complete ones; `.incoming-*` excluded). */
  releases: string[];
  current: LinkState;
  /** By link name (BIN_LINKS). */
  bins: Record<string, LinkState>;
}

export type InstallStep =
  | { kind: 'copy'; id: string }
  | { kind: 'current'; id: string; target: string; previous: string | null }
  | { kind: 'link'; name: string; path: string; target: string; previous: string | null };

/** The release `current` names, or null (missing, or a link to something else). */
export function currentRelease(state: LayoutState): string | null {
  return state.current.kind === 'link' ? (releaseOfCurrentTarget(state.current.target) ?? null) : null;
}

/**
 * The steps that make release `id` installed, current and linked. `copy` is planned unless the
 * release dir exists; `useOnly` (rollback to an installed release) refuses a release that does not.
 */
export function planInstall(paths: ReleasePaths, state: LayoutState, id: string, useOnly = false): InstallStep[] {
  if (state.current.kind === 'other') {
    throw precondition('RELEASE_CURRENT_NOT_LINK', `${paths.current} exists and is not a symlink; move it away to install releases here.`);
  }
  for (const { name } of BIN_LINKS) {
    if (state.bins[name]?.kind === 'other') {
      throw precondition(
        'RELEASE_BIN_NOT_LINK',
        `${paths.binDir}/${name} exists and is not a symlink; kata-ts replaces only its own links (remove it or choose another --bin-dir).`,
      );
    }
  }
  const steps: InstallStep[] = [];
  if (!state.releases.includes(id)) {
    if (useOnly) throw notFound('RELEASE_UNKNOWN', `release ${id} is not installed in ${paths.releasesDir}.`);
    steps.push({ kind: 'copy', id });
  }
  const target = currentTarget(id);
  if (state.current.kind !== 'link' || state.current.target !== target) {
    steps.push({ kind: 'current', id, target, previous: state.current.kind === 'link' ? state.current.target : null });
  }
  for (const { name, target: file } of BIN_LINKS) {
    const want = binLinkTarget(paths, file);
    const have = state.bins[name] ?? { kind: 'missing' };
    if (have.kind === 'link' && have.target === want) continue;
    steps.push({ kind: 'link', name, path: `${paths.binDir}/${name}`, target: want, previous: have.kind === 'link' ? have.target : null });
  }
  return steps;
}

/** Who runs a release: one line each, e.g. `pod 1234abcd (k8s.io), shim pid 42`. */
export type ReleaseUsers = ReadonlyMap<string, readonly string[]>;

export interface PruneDecision {
  remove: string[];
  keep: Array<{ id: string; why: 'current' | 'in-use'; users: readonly string[] }>;
}

/** Every release that is neither current nor in use goes; the others stay, each with why. */
export function planPrune(releases: readonly string[], current: string | null, users: ReleaseUsers): PruneDecision {
  const out: PruneDecision = { remove: [], keep: [] };
  for (const id of [...releases].sort()) {
    const using = users.get(id) ?? [];
    if (id === current) out.keep.push({ id, why: 'current', users: using });
    else if (using.length > 0) out.keep.push({ id, why: 'in-use', users: using });
    else out.remove.push(id);
  }
  return out;
}

/** Check that release `id` may be removed; throws the precise reason when not. */
export function checkRemove(
  paths: ReleasePaths,
  releases: readonly string[],
  current: string | null,
  users: ReleaseUsers,
  id: string,
): void {
  if (!releases.includes(id)) {
    throw notFound(
      'RELEASE_UNKNOWN',
      `release ${id} is not installed in ${paths.releasesDir}; installed: ${releases.join(', ') || 'none'}.`,
    );
  }
  if (id === current) throw precondition('RELEASE_IS_CURRENT', `release ${id} is current; install or use another release first.`);
  const using = users.get(id) ?? [];
  if (using.length > 0) {
    throw precondition('RELEASE_IN_USE', `release ${id} is in use by ${using.length} process(es): ${using.join('; ')}.`, {
      details: { users: using },
    });
  }
}

/** A sentence per step, as install prints it (or would, with --dry-run). */
export function describeStep(step: InstallStep, paths: ReleasePaths): string {
  switch (step.kind) {
    case 'copy':
      return `copy the release into ${paths.releasesDir}/${step.id}`;
    case 'current':
      return `point ${paths.current} at ${step.target}${step.previous === null ? '' : ` (was ${step.previous})`}`;
    case 'link':
      return `link ${step.path} -> ${step.target}${step.previous === null ? '' : ` (was ${step.previous})`}`;
  }
}
