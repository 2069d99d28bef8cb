/**
 * critest's command lines for one run. critest's own `-parallel` needs the ginkgo CLI, which no
 * Debian package ships, so parallel runs are shards instead: a dry run lists the specs the user's
 * focus/skip select, and each critest process is focused on its share by exact name.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parseReports } from './report.js';

export interface UserArgs {
  /** `-ginkgo.focus` / `-ginkgo.skip` (and their `--` and `=`-less spellings), passed to the dry run. */
  filters: string[];
  /** Everything else, passed to every critest process. */
  rest: string[];
}

const FILTER_FLAG = /^--?ginkgo\.(focus|skip|label-filter|focus-file|skip-file)(=|$)/;

/** Splits the script's arguments into spec filters and other critest flags. */
export function splitUserArgs(argv: string[]): UserArgs {
  const filters: string[] = [];
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const m = FILTER_FLAG.exec(a);
    if (m === null) {
      rest.push(a);
    } else if (m[2] === '=') {
      filters.push(a);
    } else {
      filters.push(a, argv[i + 1] ?? '');
      i++;
    }
  }
  return { filters, rest };
}

/** Go's regexp.QuoteMeta. */
export function quoteMeta(s: string): string {
  return s.replace(/[\\.+*?()|[\]{}^$]/g, '\\$&');
}

/**
 * A focus matching exactly one spec. Ginkgo matches focus against the suite description, a space
 * and the spec's full text, so the name is anchored at its end only; every full name starts with
 * "[k8s.io]", so no name is a proper suffix of another.
 */
export function focusExactly(name: string): string {
  return `-ginkgo.focus=${quoteMeta(name)}$`;
}

/** Round-robin split of `names` over `n` shards (none empty). */
export function shard(names: string[], n: number): string[][] {
  const shards: string[][] = Array.from({ length: Math.min(n, Math.max(1, names.length)) }, () => []);
  for (const [i, name] of names.entries()) shards[i % shards.length]!.push(name);
  return shards;
}

export interface CritestPlan {
  /** One argument list per critest process (without the report flag). */
  shards: string[][];
  /** Specs selected (exact with shards; from the dry run). */
  specCount: number;
}

type Runner = (cmd: string, args: string[], logFile: string) => Promise<number>;

/** The dry run's selection: specs that would run (not filtered out by the user's or critest's skips). */
async function selectedSpecs(critest: string, base: string[], user: UserArgs, work: string, run: Runner): Promise<string[]> {
  const report = path.join(work, 'dry-run.json');
  const code = await run(
    critest,
    [...base, ...user.rest, ...user.filters, '-ginkgo.dry-run', `-ginkgo.json-report=${report}`],
    path.join(work, 'dry-run.log'),
  );
  if (code !== 0)
    throw new Error(
      `critest -ginkgo.dry-run failed (exit ${code}): ${await fsp.readFile(path.join(work, 'dry-run.log'), 'utf8').catch(() => '')}`,
    );
  const parsed = parseReports([JSON.parse(await fsp.readFile(report, 'utf8'))]);
  return parsed.specs.filter((s) => !s.filtered).map((s) => s.name);
}

/** The critest processes to start: one with the user's filters, or `parallel` shards focused by name. */
export async function critestArgs(
  critest: string,
  base: string[],
  user: UserArgs,
  parallel: number,
  work: string,
  run: Runner,
): Promise<CritestPlan> {
  const names = await selectedSpecs(critest, base, user, work, run);
  if (parallel <= 1 || names.length <= 1) return { shards: [[...base, ...user.rest, ...user.filters]], specCount: names.length };
  return {
    shards: shard(names, parallel).map((part) => [...base, ...user.rest, ...part.map(focusExactly)]),
    specCount: names.length,
  };
}

const SEPARATOR = '------------------------------';
const RESULT = /^• (?:\[([A-Z]+)\] )?\[([\d.]+) seconds\]$/;

/**
 * Live progress from critest's `-ginkgo.v` output: a spec's block starts after a separator line
 * with its full name and ends with `• [12.3 seconds]` (or `• [FAILED] [...]`); `feed` returns
 * `PASS 12.3 s <name>` when a block ends, else null.
 */
export class ProgressLines {
  private afterSeparator = false;
  private name = '';

  feed(line: string): string | null {
    if (line === SEPARATOR) {
      this.afterSeparator = true;
      return null;
    }
    if (this.afterSeparator) {
      this.afterSeparator = false;
      this.name = line;
      return null;
    }
    const m = RESULT.exec(line);
    if (m === null || !this.name.startsWith('[k8s.io]')) return null;
    const state = m[1] === undefined ? 'PASS' : m[1] === 'FAILED' ? 'FAIL' : m[1] === 'SKIPPED' ? 'SKIP' : m[1]!;
    const out = `${state} ${Number(m[2]).toFixed(1)} s  ${this.name}`;
    this.name = '';
    return out;
  }
}
